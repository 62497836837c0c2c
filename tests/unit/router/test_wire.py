"""bear.v1 messages ⇄ the router's domain objects."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bear.router import wire
from bear.router.decision import CandidateView, DispatchRecord, RouteResult
from bear.routing.contract import Decision
from bear.v1 import estimator_pb2, predictor_pb2, router_pb2, snapshot_pb2


def test_a_route_request_keeps_which_query_it_carries_and_which_optionals_are_set() -> None:
    text = wire.query_from_proto(router_pb2.RouteRequest(request_id="r", prompt="hi", ttft_slo_ms=300,
                                                         policy="bear", allowed_models=["a", "b"]))
    assert (text.prompt, text.prompt_tokens, text.ttft_slo_ms, text.policy) == ("hi", None, 300, "bear")
    assert text.allowed_models == ("a", "b") and text.lambda_per_micro_usd is None and text.delta_per_s is None
    assert text.max_tokens is None
    length = wire.query_from_proto(router_pb2.RouteRequest(prompt_tokens=700, lambda_per_micro_usd=0.0,
                                                           delta_per_s=0.5, max_tokens=0))
    assert length.max_tokens == 0  # set: refused by the router's checks (none would be None)
    assert (length.prompt, length.prompt_tokens, length.lambda_per_micro_usd, length.delta_per_s) == (
        None, 700, 0.0, 0.5)
    empty = wire.query_from_proto(router_pb2.RouteRequest(prompt=""))
    assert empty.prompt == "" and empty.prompt_tokens is None
    neither = wire.query_from_proto(router_pb2.RouteRequest())
    assert neither.prompt is None and neither.prompt_tokens is None


def test_a_decision_carries_every_candidate() -> None:
    view = CandidateView("i", "m", "http://i", 0.7, 120.0, 33, 55.5, 0.6, True, math.inf, "replay", False, 0.6,
                         12.0, 32, 250.0)
    message = wire.decision_to_proto(RouteResult("q", Decision.SHED, "", "", "", "bear", "shed", (view,), True,
                                                 "why", 1.5))
    assert message.decision == router_pb2.DECISION_SHED and message.degraded and message.degraded_reason == "why"
    candidate = message.candidates[0]
    assert (candidate.instance_id, candidate.prompt_tokens, candidate.ttft_method) == ("i", 33, "replay")
    assert math.isinf(candidate.predicted_ttft_ms) and candidate.snapshot_age_ms == 12.0
    assert candidate.cached_prompt_tokens == 32 and candidate.idle_ms == 250.0
    busy = wire.decision_to_proto(RouteResult("q", Decision.SHED, "", "", "", "bear", "shed",
                                              (replace(view, idle_ms=None),), True, "why", 1.5))
    assert not busy.candidates[0].HasField("idle_ms")


def test_estimates_give_queue_lengths_only_when_a_snapshot_was_used() -> None:
    reply = estimator_pb2.EstimateResponse(estimates=[
        estimator_pb2.InstanceEstimate(instance_id="a", method=estimator_pb2.ESTIMATE_METHOD_REPLAY, known=True,
                                       feasible=True, ttft_ms=80, num_running=0, num_waiting=0,
                                       prefill_tps_ttft_ms=60, cached_prompt_tokens=48, idle_ms=300),
        estimator_pb2.InstanceEstimate(instance_id="b", method=estimator_pb2.ESTIMATE_METHOD_LPS, known=True,
                                       feasible=True, ttft_ms=90, snapshot_age_ms=3000, num_running=4),
        estimator_pb2.InstanceEstimate(instance_id="c", method=estimator_pb2.ESTIMATE_METHOD_NONE),
    ])
    estimates = wire.estimates_from_proto(reply)
    assert (estimates["a"].num_running, estimates["a"].ttft_s, estimates["a"].prefill_tps_ttft_ms) == (0, 0.08, 60)
    assert estimates["a"].cached_prompt_tokens == 48 and estimates["a"].idle_ms == 300
    assert estimates["b"].idle_ms is None  # unset: the engine had work (or no replay ran)
    assert (estimates["b"].method, estimates["b"].num_running, estimates["b"].snapshot_age_ms) == ("lps", 4, 3000)
    c = estimates["c"]
    assert (c.method, c.ttft_s, c.num_running, c.snapshot_age_ms, c.prefill_tps_ttft_ms) == (
        "none", None, None, None, None)


def test_predictions_by_model() -> None:
    reply = predictor_pb2.PredictResponse(predictions=[predictor_pb2.ModelPrediction(
        model="m", accuracy=0.5, output_tokens=100, prompt_tokens=7, cost_micro_usd=12.5)])
    prediction = wire.predictions_from_proto(reply)["m"]
    assert (prediction.accuracy, prediction.output_tokens, prediction.prompt_tokens, prediction.cost_micro_usd) == (
        0.5, 100, 7, 12.5)


def test_dispatch_records_round_trip_and_an_infinite_ttft_is_stored_as_none() -> None:
    record = DispatchRecord("q", "i", "m", 1_700_000_000.5, 42, 123.0, 88.0, 500.0, 12.5, True, 64, b"12345678",
                            engine_idle=True)
    assert wire.dispatch_from_bytes(wire.dispatch_to_bytes(record)) == record
    infinite = DispatchRecord("q", "i", "m", 1.0, 1, 1.0, math.inf, 1.0)
    assert wire.dispatch_from_bytes(wire.dispatch_to_bytes(infinite)).predicted_ttft_ms == 0.0


def test_queue_lengths_from_a_snapshot_count_omitted_waiting_requests_and_age_from_the_last_read() -> None:
    snapshot = snapshot_pb2.InstanceSnapshot(
        instance_id="i", taken_at_s=100.0, read_at_s=104.0, num_omitted_waiting=10,
        running=[snapshot_pb2.RequestState(request_id="a")],
        waiting=[snapshot_pb2.RequestState(request_id="b"), snapshot_pb2.RequestState(request_id="c")])
    queue = wire.queue_lengths_from_bytes(snapshot.SerializeToString(), now_s=105.0)
    assert (queue.num_running, queue.num_waiting, queue.snapshot_age_ms) == (1, 12, 1000.0)


def test_registrations() -> None:
    payload = snapshot_pb2.InstanceRegistration(instance_id="i", pool="p", model="m", endpoint="http://i",
                                                input_usd_per_million_tokens=0.1,
                                                output_usd_per_million_tokens=0.2).SerializeToString()
    registration = wire.registration_from_bytes(payload)
    assert (registration.instance_id, registration.model, registration.input_usd_per_mtok) == ("i", "m", 0.1)


@pytest.mark.parametrize("price", [math.inf, math.nan, -5.0, 2e6])
def test_a_registration_with_a_price_no_sidecar_writes_does_not_decode(price: float) -> None:
    # An infinite price made the instance's utility NaN at λ = 0 (0 × inf), and max() kept a leading NaN: that
    # instance won every decision. The store skips a value that does not decode, with a throttled warning.
    payload = snapshot_pb2.InstanceRegistration(instance_id="i", model="m", endpoint="http://i",
                                                output_usd_per_million_tokens=price).SerializeToString()
    with pytest.raises(ValueError, match="output_usd_per_million_tokens is"):
        wire.registration_from_bytes(payload)
