"""bear.v1 Predictor messages ⇄ the predictor's domain (`bear.predictor.predictor`).

Costs go on the wire in micro-dollars (tokens × USD per million tokens, the unit of the router's utility, eq. 4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from bear.predictor.catalog import Catalog, UnknownModelError
from bear.predictor.predictor import ModelPrediction
from bear.v1 import predictor_pb2

MICRO_USD_PER_USD = 1e6


class InvalidRequest(ValueError):
    """A request the predictor cannot answer; the message names the field (INVALID_ARGUMENT)."""


@dataclass(frozen=True, slots=True)
class RemainingGroup:
    """The rows of an ExpectedRemaining request that concern one model."""

    model: str
    rows: np.ndarray  # positions in the request
    predicted_output_tokens: np.ndarray
    generated_tokens: np.ndarray
    max_tokens: np.ndarray  # 0: none


def predict_arguments(request: predictor_pb2.PredictRequest, catalog: Catalog,
                      max_prompt_chars: int) -> tuple[str, list[str] | None]:
    """(prompt, models or None for the whole catalogue), checked; a model may be named by its Hugging Face id (e.g.
    Qwen/Qwen3-8B for the catalogue's Qwen3-8B, as the router and the pools file name it) and is answered by the
    catalogue's name."""
    if not request.prompt.strip():
        raise InvalidRequest("prompt is empty")
    if len(request.prompt) > max_prompt_chars:
        raise InvalidRequest(f"prompt has {len(request.prompt)} characters; at most {max_prompt_chars} are accepted")
    models = [_known_model(catalog, model, f"models[{index}]")
              for index, model in enumerate(request.models)]
    return request.prompt, list(dict.fromkeys(models)) or None  # a model named twice is predicted once


def predict_response(predictions: Mapping[str, ModelPrediction], catalog: Catalog) -> predictor_pb2.PredictResponse:
    reply = predictor_pb2.PredictResponse()
    for name, p in predictions.items():
        spec = catalog.spec(name)
        reply.predictions.add(model=name, accuracy=p.accuracy, output_tokens=p.output_tokens,
                              prompt_tokens=p.prompt_tokens, cost_micro_usd=p.cost_usd * MICRO_USD_PER_USD,
                              input_usd_per_mtok=spec.input_usd_per_mtok,
                              output_usd_per_mtok=spec.output_usd_per_mtok)
    return reply


def remaining_groups(request: predictor_pb2.ExpectedRemainingRequest, catalog: Catalog,
                     max_queries: int) -> list[RemainingGroup]:
    """The request's queries by model, checked (each query's problem is named by its index)."""
    queries = request.queries
    if len(queries) > max_queries:
        raise InvalidRequest(f"{len(queries)} queries; at most {max_queries} per call")
    by_model: dict[str, list[int]] = {}
    for index, query in enumerate(queries):
        where = f"queries[{index}]"
        name = _known_model(catalog, query.model, f"{where}.model")
        if not (math.isfinite(query.predicted_output_tokens) and query.predicted_output_tokens >= 0):
            raise InvalidRequest(f"{where}.predicted_output_tokens must be a finite number >= 0, "
                                 f"got {query.predicted_output_tokens!r}")
        if query.max_tokens and query.generated_tokens >= query.max_tokens:
            raise InvalidRequest(f"{where}: generated_tokens ({query.generated_tokens}) must be below max_tokens "
                                 f"({query.max_tokens}); such a request has finished")
        by_model.setdefault(name, []).append(index)
    groups = []
    for name, rows in by_model.items():
        chosen = [queries[i] for i in rows]
        groups.append(RemainingGroup(
            name, np.array(rows, dtype=np.int64),
            np.array([q.predicted_output_tokens for q in chosen], dtype=np.float64),
            np.array([q.generated_tokens for q in chosen], dtype=np.float64),
            np.array([q.max_tokens for q in chosen], dtype=np.float64)))
    return groups


def remaining_response(num_queries: int, groups: list[RemainingGroup],
                       answers: list[np.ndarray]) -> predictor_pb2.ExpectedRemainingResponse:
    remaining = np.ones(num_queries, dtype=np.float64)
    for group, values in zip(groups, answers, strict=True):
        remaining[group.rows] = values
    return predictor_pb2.ExpectedRemainingResponse(remaining_tokens=remaining.tolist())


def _known_model(catalog: Catalog, model: str, where: str) -> str:
    """The catalogue's name of `model`, also of `org/name` where `name` is in it (Predict and ExpectedRemaining
    alike: a pool registered under vLLM's default served name, the repository id, asks for both)."""
    try:
        return catalog.resolve(model)
    except UnknownModelError as error:
        raise InvalidRequest(f"{where}: {error}") from None
