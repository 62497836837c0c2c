"""The estimator: TTFT estimates of a query on every instance, from the instances' latest snapshots.

Domain (no gRPC): `estimation` (the Estimator: replay, LPS fallback), `snapshot_feed` (keeps it current from Redis),
`admission` (what the feed refuses), `remaining` (residents' remaining lengths, cached, with the stated fallback),
`lps_tracker` (eq. 13-15's parameters from the stream of snapshots), `request_ids` (vLLM's request ids → the
router's).
Service (`bear serve estimator`): `config`, `wire`, `server`, `predictor_client`, `metrics`, `main`.
"""
