"""Estimate requests and replies, dispatch records and calibrations, as the estimator reads and writes them."""

from __future__ import annotations

import dataclasses
import math

import pytest

from bear.core.batch_time import BatchTimeCoefficients
from bear.estimator.estimation import Dispatch, Method, TtftEstimate
from bear.estimator.wire import (
    InstanceFacts,
    InvalidRequest,
    coefficients_from_message,
    dispatch_from_record,
    estimate_call,
    instance_estimate,
)
from bear.v1 import calibration_pb2, estimator_pb2, router_pb2
from tests.estimator_builders import COEFFICIENTS, batch_time, dispatch_record


def test_a_request_becomes_a_query_instances_and_a_horizon() -> None:
    call = estimate_call(estimator_pb2.EstimateRequest(query_id="q1", prompt_tokens=700, predicted_output_tokens=49.6,
                                                       instance_ids=["a", "b", "a"], horizon_ms=1500), "generated")
    assert (call.query.id, call.query.num_prompt_tokens, call.query.output_tokens) == ("q1", 700, 50)
    assert call.instance_ids == ("a", "b") and call.horizon_s == 1.5 and call.prefix_hashes == b""
    hashes = bytes(range(16))  # two prefix blocks
    assert estimate_call(estimator_pb2.EstimateRequest(prompt_tokens=40, prompt_prefix_hashes=hashes),
                         "q").prefix_hashes == hashes


def test_defaults_an_id_a_length_of_one_and_no_horizon() -> None:
    call = estimate_call(estimator_pb2.EstimateRequest(prompt_tokens=10), "generated")
    assert (call.query.id, call.query.output_tokens, call.instance_ids, call.horizon_s) == (
        "generated", 1, (), math.inf)


@pytest.mark.parametrize(("request_", "message"), [
    (estimator_pb2.EstimateRequest(prompt_tokens=0), "prompt_tokens must be >= 1"),
    (estimator_pb2.EstimateRequest(prompt_tokens=1, predicted_output_tokens=math.nan), "predicted_output_tokens"),
    (estimator_pb2.EstimateRequest(prompt_tokens=1, predicted_output_tokens=-1), "predicted_output_tokens"),
    (estimator_pb2.EstimateRequest(prompt_tokens=1, predicted_output_tokens=1e30), "predicted_output_tokens"),
    (estimator_pb2.EstimateRequest(prompt_tokens=1, horizon_ms=-5), "horizon_ms"),
    (estimator_pb2.EstimateRequest(prompt_tokens=1, horizon_ms=math.inf), "horizon_ms"),
    (estimator_pb2.EstimateRequest(prompt_tokens=1, instance_ids=["a", ""]), "instance_ids"),
    # one call may not hold the event loop that every call and the snapshot feed share
    (estimator_pb2.EstimateRequest(prompt_tokens=1, instance_ids=[f"i{n}" for n in range(5000)]),
     "instance_ids: 5000 ids, more than the limit of 4096"),
    (estimator_pb2.EstimateRequest(prompt_tokens=1, recent_dispatches=[router_pb2.DispatchRecord()] * 2000),
     "recent_dispatches: 2000 records"),
    (estimator_pb2.EstimateRequest(prompt_tokens=1, prompt_prefix_hashes=b"x" * 12),
     "prompt_prefix_hashes: 12 bytes, not a multiple of 8"),
    (estimator_pb2.EstimateRequest(prompt_tokens=1, prompt_prefix_hashes=b"x" * 8 * 5000),
     "prompt_prefix_hashes: 5000 hashes, more than the limit of 1024"),
])
def test_bad_requests_name_the_field(request_: estimator_pb2.EstimateRequest, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        estimate_call(request_, "q")


def test_a_replay_estimate_fills_every_field() -> None:
    estimate = TtftEstimate("a", 0.25, Method.REPLAY, snapshot_age_s=0.03, num_batches=7, lower_bound=True,
                            reason="", prefill_tps_ttft_s=0.2, cached_tokens=320, idle_s=0.4)
    reply = instance_estimate(estimate, InstanceFacts(num_running=3, num_waiting=2, pending_decode_tokens=120.0))
    assert reply == estimator_pb2.InstanceEstimate(
        instance_id="a", method=estimator_pb2.ESTIMATE_METHOD_REPLAY, known=True, feasible=True, ttft_ms=250.0,
        lower_bound=True, snapshot_age_ms=30.0, num_batches=7, prefill_tps_ttft_ms=200.0, num_running=3,
        num_waiting=2, pending_decode_tokens=120.0, cached_prompt_tokens=320, idle_ms=400.0)
    busy = instance_estimate(dataclasses.replace(estimate, idle_s=None), InstanceFacts(num_running=3))
    assert not busy.HasField("idle_ms")  # it had work: unset, not 0 (an engine idle for no time at all)


@pytest.mark.parametrize("method", [Method.REPLAY, Method.NONE])  # NONE: the engine's settings refuse the prompt
def test_an_infeasible_estimate_is_known_infeasible_and_infinite(method: Method) -> None:
    reply = instance_estimate(TtftEstimate("a", math.inf, method, 0.0, reason="prompt too long"), InstanceFacts())
    assert reply.known and not reply.feasible and math.isinf(reply.ttft_ms) and reply.reason == "prompt too long"


def test_an_overloaded_lps_estimate_is_feasible_but_unbounded() -> None:
    reply = instance_estimate(TtftEstimate("a", math.inf, Method.LPS, 5.0, reason="snapshot 5.000 s old: LPS"),
                              InstanceFacts())
    assert reply.method == estimator_pb2.ESTIMATE_METHOD_LPS and reply.known and reply.feasible
    assert math.isinf(reply.ttft_ms) and "unbounded" in reply.reason and reply.snapshot_age_ms == 5000.0


def test_no_estimate_is_unknown() -> None:
    reply = instance_estimate(TtftEstimate("a", None, Method.NONE, reason="unknown instance"), InstanceFacts())
    assert (reply.method, reply.known, reply.feasible, reply.ttft_ms, reply.snapshot_age_ms) == (
        estimator_pb2.ESTIMATE_METHOD_NONE, False, True, 0.0, 0.0)


def test_a_dispatch_record_becomes_a_dispatch() -> None:
    record = dispatch_record("r1", "a", 10.0, prompt_tokens=300, predicted_output_tokens=0.4, model="")
    assert dispatch_from_record(record, "ignored", "m") == Dispatch("r1", "a", "m", 10.0, 300, 1.0)
    record.instance_id = ""
    assert dispatch_from_record(record, "b", "m").instance_id == "b"  # type: ignore[union-attr]
    record.max_tokens = 64  # the request's cap, where Route was given it
    assert dispatch_from_record(record, "b", "m").max_tokens == 64  # type: ignore[union-attr]
    record.prompt_prefix_hashes = bytes(range(24))
    assert dispatch_from_record(record, "b", "m").prefix_hashes == bytes(range(24))  # type: ignore[union-attr]
    record.prompt_prefix_hashes = bytes(range(13))  # not whole hashes: the record stands without them
    assert dispatch_from_record(record, "b", "m").prefix_hashes == b""  # type: ignore[union-attr]


@pytest.mark.parametrize("field_value", [("request_id", ""), ("prompt_tokens", 0),
                                         ("predicted_output_tokens", math.nan), ("dispatched_at_s", math.inf)])
def test_an_unusable_dispatch_record_is_none(field_value: tuple[str, object]) -> None:
    record = dispatch_record("r1", "a", 10.0)
    setattr(record, *field_value)
    assert dispatch_from_record(record, "a", "m") is None


def test_coefficients_only_from_a_fit() -> None:
    assert coefficients_from_message(batch_time()) == COEFFICIENTS
    assert coefficients_from_message(calibration_pb2.BatchTimeCoefficients()) is None  # not fitted yet
    assert coefficients_from_message(calibration_pb2.BatchTimeCoefficients(num_samples=5, intercept_s=-1)) is None
    # A fit that makes a step of few tokens free (no per-step, no per-token time) describes no engine: every TTFT 0.
    assert coefficients_from_message(calibration_pb2.BatchTimeCoefficients(
        num_samples=5, per_decode_context_token_s=1e-8, per_prefill_attention_token_s=1e-9)) is None
    assert coefficients_from_message(calibration_pb2.BatchTimeCoefficients(num_samples=5, per_token_s=2e-5)) \
        == BatchTimeCoefficients(0.0, 2e-5, 0.0, 0.0)
