"""The router: BEAR's public gRPC API (bear.v1.Router). For each query it asks the predictor and the estimator, lets a
routing policy choose an instance, records the dispatch in Redis and answers with every candidate's predictions.
`bear.router.client` is its typed Python client. See README.md beside this file."""
