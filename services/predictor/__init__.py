"""BEAR's predictor (paper Appendix A.4): per prompt and model, the judge's score, the output length and the cost; per
running request, the expected remaining output. Trained from an operator's evaluation table (or the synthetic demo
table); see README.md here for the formulas.

Nothing here imports gRPC; nothing is read at import time.
"""
