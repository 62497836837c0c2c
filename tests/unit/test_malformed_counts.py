"""Requests that do not decode are errors of the method they called, in the predictor's and the estimator's metrics
as in the router's (QA: 10 malformed Predict and ExpectedRemaining calls left bear_predictor_errors_total at 0)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from bear.estimator import server as estimator_server
from bear.predictor import server as predictor_server


def _count(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_predictor_counts_them_by_method() -> None:
    predict = {"method": "Predict", "code": "INVALID_ARGUMENT"}
    remaining = {"method": "ExpectedRemaining", "code": "INVALID_ARGUMENT"}
    before = _count("bear_predictor_errors_total", predict), _count("bear_predictor_errors_total", remaining)
    for method in ("Predict", "PredictStream", "ExpectedRemaining"):
        predictor_server.count_malformed(f"/bear.v1.Predictor/{method}")
    predictor_server.count_malformed("/grpc.health.v1.Health/Check")  # not the predictor's call
    after = _count("bear_predictor_errors_total", predict), _count("bear_predictor_errors_total", remaining)
    assert (after[0] - before[0], after[1] - before[1]) == (2, 1)


def test_the_estimator_counts_them() -> None:
    labels = {"code": "INVALID_ARGUMENT"}
    before = _count("bear_estimator_errors_total", labels)
    for method in ("/bear.v1.Estimator/Estimate", "/bear.v1.Estimator/EstimateStream",
                   "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"):
        estimator_server.count_malformed(method)
    assert _count("bear_estimator_errors_total", labels) - before == 2
