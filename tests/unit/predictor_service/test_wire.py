"""Predictor requests and replies: checked input, costs in micro-dollars, remaining-length queries grouped by model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bear.predictor.catalog import PAPER_POOL
from bear.predictor.predictor import ModelPrediction
from bear.predictor.wire import (
    InvalidRequest,
    predict_arguments,
    predict_response,
    remaining_groups,
    remaining_response,
)
from bear.v1 import predictor_pb2

SMALL, MEDIUM, LARGE = PAPER_POOL.names


def test_predict_arguments() -> None:
    assert predict_arguments(predictor_pb2.PredictRequest(prompt="hi"), PAPER_POOL, 100) == ("hi", None)
    assert predict_arguments(predictor_pb2.PredictRequest(prompt="hi", models=[LARGE]), PAPER_POOL, 100) == (
        "hi", [LARGE])


def test_a_model_named_by_its_hugging_face_id_is_the_catalogues() -> None:
    request = predictor_pb2.PredictRequest(prompt="hi", models=[f"Qwen/{LARGE}", LARGE, SMALL])
    assert predict_arguments(request, PAPER_POOL, 100) == ("hi", [LARGE, SMALL])


@pytest.mark.parametrize(("request_", "message"), [
    (predictor_pb2.PredictRequest(prompt=""), "prompt is empty"),
    (predictor_pb2.PredictRequest(prompt=" \n\t"), "prompt is empty"),
    (predictor_pb2.PredictRequest(prompt="x" * 101), "prompt has 101 characters; at most 100"),
    (predictor_pb2.PredictRequest(prompt="hi", models=[SMALL, "gpt-9"]), r"models\[1\]: unknown model 'gpt-9'"),
    (predictor_pb2.PredictRequest(prompt="hi", models=["Qwen/gpt-9"]), r"models\[0\]: unknown model 'Qwen/gpt-9'"),
    (predictor_pb2.PredictRequest(prompt="hi", models=["m" * 20_000]), r"'m{64}'… \(20000 characters\); the cat"),
])
def test_bad_predict_requests_name_the_field(request_: predictor_pb2.PredictRequest, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        predict_arguments(request_, PAPER_POOL, 100)


def test_costs_go_out_in_micro_dollars_with_the_prices() -> None:
    spec = PAPER_POOL.spec(MEDIUM)
    prediction = ModelPrediction(MEDIUM, 0.7, 200.0, 1000, spec.cost_usd(1000, 200.0))
    reply = predict_response({MEDIUM: prediction}, PAPER_POOL)
    (p,) = reply.predictions
    assert (p.model, p.accuracy, p.output_tokens, p.prompt_tokens) == (MEDIUM, 0.7, 200.0, 1000)
    assert p.cost_micro_usd == pytest.approx(1000 * spec.input_usd_per_mtok + 200 * spec.output_usd_per_mtok)
    assert (p.input_usd_per_mtok, p.output_usd_per_mtok) == (spec.input_usd_per_mtok, spec.output_usd_per_mtok)


def query(model: str, predicted: float = 100, generated: int = 10, max_tokens: int = 0) -> predictor_pb2.RemainingQuery:
    return predictor_pb2.RemainingQuery(model=model, predicted_output_tokens=predicted, generated_tokens=generated,
                                        max_tokens=max_tokens)


def test_remaining_queries_are_grouped_by_model_and_answered_in_order() -> None:
    request = predictor_pb2.ExpectedRemainingRequest(queries=[query(SMALL, 10), query(LARGE, 20), query(SMALL, 30)])
    groups = remaining_groups(request, PAPER_POOL, 10)
    assert [(g.model, g.rows.tolist(), g.predicted_output_tokens.tolist()) for g in groups] == [
        (SMALL, [0, 2], [10.0, 30.0]), (LARGE, [1], [20.0])]
    reply = remaining_response(3, groups, [np.array([5.0, 7.0]), np.array([6.0])])
    assert list(reply.remaining_tokens) == [5.0, 6.0, 7.0]


@pytest.mark.parametrize(("queries", "message"), [
    ([query(SMALL), query("gpt-9")], r"queries\[1\].model: unknown model 'gpt-9'"),
    ([query(SMALL, predicted=math.nan)], r"queries\[0\].predicted_output_tokens must be a finite number"),
    ([query(SMALL, generated=8, max_tokens=8)], r"queries\[0\]: generated_tokens \(8\) must be below max_tokens"),
    ([query(SMALL)] * 11, "11 queries; at most 10 per call"),
])
def test_bad_remaining_queries_name_the_query(queries: list[predictor_pb2.RemainingQuery], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        remaining_groups(predictor_pb2.ExpectedRemainingRequest(queries=queries), PAPER_POOL, 10)
