"""BEAR's predictor (paper Appendix A.4): per prompt and model, the judge's score, the output length and the cost; per
running request, the expected remaining output. Trained from an operator's evaluation table (or the synthetic demo
table); see README.md here for the formulas.

The service (`bear serve predictor`: `config`, `wire`, `server`, `main`) serves a trained artifact over gRPC
(bear.v1.Predictor); the other modules are its domain and import no gRPC. Nothing is read at import time.
"""
