"""BEAR's pure domain core: the scheduler replay (compiled core and Python reference behind one facade), the batch-time
model (paper eq. 12) and its calibration, and the alternative TTFT estimators (prefill throughput, eq. 8; LPS, eq. 13–15).

Nothing here does I/O, reads clocks or imports gRPC.
"""
