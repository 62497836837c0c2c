"""What an operator reads off the router's metrics and spans: refusals counted by code, per-instance series gone with
their instance, Redis failures in one vocabulary, and failing stages marked on their spans."""

from __future__ import annotations

import asyncio

import pytest
import redis.exceptions

from bear.router.decision import Outcome
from bear.router.query import InvalidQuery
from bear.router.router import NoInstances
from bear.router.server import RouterServicer
from bear.router.signals import DependencyUnavailable, QueueLengths
from bear.router.store import redis_failure_code

from .builders import INSTANCES, Harness, make_router, route


def report(harness: Harness, request_id: str, ttft_ms: float) -> None:
    asyncio.run(harness.router.report_outcome(Outcome(request_id, ttft_ms, 10, ttft_ms + 100)))


def series_of(harness: Harness, instance_id: str) -> list[str]:
    return [f"{sample.name}{sample.labels}" for metric in harness.registry.collect() for sample in metric.samples
            if sample.labels.get("instance") == instance_id]


def test_no_ready_instance_is_counted_as_a_refusal() -> None:
    harness = make_router(instances=())
    for _ in range(3):
        with pytest.raises(NoInstances):
            route(harness)
    assert harness.metric("bear_router_refusals_total", method="Route", code="UNAVAILABLE") == 3


def test_an_invalid_outcome_report_is_counted_as_a_refusal() -> None:
    harness = make_router()
    with pytest.raises(InvalidQuery, match="observed_ttft_ms"):
        asyncio.run(harness.router.report_outcome(Outcome("q1", -1.0)))
    assert harness.metric("bear_router_refusals_total", method="ReportOutcome", code="INVALID_ARGUMENT") == 1


def test_a_model_whose_last_instance_went_away_is_unavailable_not_unknown() -> None:
    harness = make_router()
    route(harness, allowed_models=("Qwen3-32B",))
    harness.store.registrations_.pop("large-0")
    harness.clock[0] += 60  # past the time a registration missing from Redis is kept
    asyncio.run(harness.router.refresh_instances())
    with pytest.raises(NoInstances, match="no ready instance serves Qwen3-32B"):
        route(harness, allowed_models=("Qwen3-32B",))
    with pytest.raises(InvalidQuery, match="allowed_models: unknown model 'gpt-9'"):
        route(harness, allowed_models=("gpt-9",))


def test_every_series_of_an_instance_goes_with_it() -> None:
    harness = make_router()
    route(harness, request_id="any")  # every instance's snapshot age
    for n in range(3):
        result = route(harness, request_id=f"q{n}", allowed_models=("Qwen3-0.6B",))
        report(harness, result.request_id, 80.0)
    assert result.instance_id == "small-0"
    held = series_of(harness, "small-0")
    assert any("bear_router_ttft_error_seconds" in s for s in held)
    assert any("bear_router_routes_total" in s for s in held)
    assert any("bear_router_snapshot_age_seconds" in s for s in held)
    harness.store.registrations_.pop("small-0")
    harness.clock[0] += 60
    asyncio.run(harness.router.refresh_instances())
    assert series_of(harness, "small-0") == []
    assert series_of(harness, "medium-0") != []  # the others keep theirs
    assert "small-0" not in harness.router._observations._by_instance


def test_no_offset_series_while_ttft_feedback_is_off() -> None:
    off, on = make_router(ttft_feedback_window=0), make_router(ttft_feedback_window=64)
    for harness in (off, on):
        result = route(harness, request_id="q1")
        report(harness, "q1", 80.0)
    assert not any("ttft_offset" in s for s in series_of(off, result.instance_id))
    assert any("ttft_offset" in s for s in series_of(on, result.instance_id))


def test_the_snapshot_age_follows_the_fallbacks_snapshots_while_the_estimator_is_down() -> None:
    harness = make_router()
    route(harness)
    assert harness.metric("bear_router_snapshot_age_seconds", instance="small-0") == pytest.approx(0.005)
    harness.estimator.error = DependencyUnavailable("estimator", "UNAVAILABLE")
    harness.store.queues = {r.instance_id: QueueLengths(1, 0, 420.0) for r in INSTANCES}
    assert route(harness).degraded
    assert harness.metric("bear_router_snapshot_age_seconds", instance="small-0") == pytest.approx(0.42)


def test_a_failing_stage_marks_its_span_and_counts_a_call_made() -> None:
    harness = make_router()
    harness.predictor.error = DependencyUnavailable("predictor", "DEADLINE_EXCEEDED", "after 100 ms")
    harness.store.down = True
    harness.estimator.error = DependencyUnavailable("estimator", "UNAVAILABLE")
    assert route(harness).degraded
    spans = {s.name: s for s in harness.spans.get_finished_spans()}
    for name in ("bear.predict", "bear.estimate", "bear.snapshots"):
        assert not spans[name].status.is_ok and spans[name].attributes["bear.error"], name
    assert harness.metric("bear_router_dependency_errors_total", service="predictor", code="DEADLINE_EXCEEDED") == 1


def test_calls_the_redis_back_off_skipped_are_not_counted_as_failures() -> None:
    harness = make_router()
    harness.router._metrics.dependency_failed("redis", "SKIPPED")
    harness.router._metrics.dependency_failed("redis", "UNAVAILABLE")
    assert harness.metric("bear_router_dependency_errors_total", service="redis", code="SKIPPED") == 0
    assert harness.metric("bear_router_dependency_errors_total", service="redis", code="UNAVAILABLE") == 1


@pytest.mark.parametrize(("error", "code"), [
    (redis.exceptions.ConnectionError("refused"), "UNAVAILABLE"),
    (ConnectionRefusedError(111, "refused"), "UNAVAILABLE"),
    (redis.exceptions.BusyLoadingError("loading"), "UNAVAILABLE"),
    (redis.exceptions.TimeoutError("timed out"), "DEADLINE_EXCEEDED"),
    (redis.exceptions.AuthenticationError("bad password"), "UNAUTHENTICATED"),
    (redis.exceptions.NoPermissionError("no"), "UNAUTHENTICATED"),
    (redis.exceptions.ResponseError("READONLY"), "INTERNAL"),
])
def test_redis_failures_get_grpc_status_names(error: Exception, code: str) -> None:
    assert redis_failure_code(error) == code


def test_a_query_refused_while_deciding_is_no_error_of_the_routers_on_its_span() -> None:
    harness = make_router()
    with pytest.raises(InvalidQuery):
        route(harness, allowed_models=("gpt-9",))
    refused = next(s for s in harness.spans.get_finished_spans() if s.name == "bear.route")
    assert refused.status.is_unset and not refused.events
    assert refused.attributes["bear.refused"].startswith("allowed_models: unknown model 'gpt-9'")
    harness.spans.clear()
    harness.store.registrations_.clear()
    harness.clock[0] += 60
    asyncio.run(harness.router.refresh_instances())
    with pytest.raises(NoInstances):
        route(harness)
    failed = next(s for s in harness.spans.get_finished_spans() if s.name == "bear.route")
    assert not failed.status.is_ok and [e.name for e in failed.events] == ["exception"]


def test_before_any_instance_registered_an_allowed_model_is_unavailable_not_unknown() -> None:
    harness = make_router(instances=())
    with pytest.raises(NoInstances, match="no ready instance serves Qwen3-8B"):
        route(harness, allowed_models=("Qwen3-8B",))


def test_after_redis_came_back_empty_the_latest_dispatch_records_are_written_again() -> None:
    """The estimator needs the predicted lengths of requests still running; another replica, the decisions."""
    harness = make_router()
    for n in range(3):
        route(harness, request_id=f"q{n}")
    harness.store.records.clear()  # Redis lost them
    harness.store.redis_new = True

    async def refresh() -> None:
        await harness.router.refresh_instances()
        await harness.router.flush()

    asyncio.run(refresh())
    assert [r.request_id for r in harness.store.records] == ["q0", "q1", "q2"]
    asyncio.run(refresh())  # only once
    assert len(harness.store.records) == 3
    assert not [s for s in harness.spans.get_finished_spans() if s.name == "bear.record"][3:]  # no spans of their own


def test_a_request_that_did_not_decode_counts_as_a_refusal_and_an_error_of_its_method() -> None:
    """(QA: answered INVALID_ARGUMENT by the server's guard, but missing from the router's error counts.)"""
    harness = make_router()
    servicer = RouterServicer(harness.router)
    for method in ("/bear.v1.Router/Route", "/bear.v1.Router/RouteStream", "/bear.v1.Router/ReportOutcome",
                   "/grpc.health.v1.Health/Check"):
        servicer.malformed(method)
    for name, count in (("Route", 2), ("ReportOutcome", 1)):
        assert harness.metric("bear_router_errors_total", method=name, code="INVALID_ARGUMENT") == count
        assert harness.metric("bear_router_refusals_total", method=name, code="INVALID_ARGUMENT") == count
    assert harness.metric("bear_router_errors_total", method="Check", code="INVALID_ARGUMENT") == 0
