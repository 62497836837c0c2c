"""The router under failure, with real gRPC and a real redis-server: Redis restarted mid-load, the estimator or the
predictor killed (or hanging), everything down, stale snapshots. Invariant: zero failed Route calls, and every
decision that could not use a dependency says so (`degraded`, the stated fallback, the reason)."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bear.common import redis_keys
from bear.router.client import RouterUnavailable
from bear.v1 import estimator_pb2, router_pb2
from tests.router_fakes import THREE_INSTANCES, InstanceState, put_snapshot, register_instances
from tests.router_stack import Load, RouterStack, wait_until

# Queue lengths in the snapshots in Redis (the fallback's signal when the estimator is down): medium is shortest.
SNAPSHOT_QUEUES = {"small-0": (5, 2), "medium-0": (0, 0), "large-0": (3, 0)}
# Open-loop Route calls per second: the router, the fakes and the load share this 2-core host. At 150/s a CI run on a
# slow host (a Python loop ~800 ns, 2.5x the usual) fell more than the calls' 5 s deadline behind while Redis was
# down, though the same test passed alone on that host.
RATE_RPS = 100.0


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[RouterStack]:
    stack = RouterStack(tmp_path)
    for instance_id, (running, waiting) in SNAPSHOT_QUEUES.items():
        put_snapshot(stack.redis, instance_id, running=running, waiting=waiting)
    yield stack
    stack.close()


def degraded(decisions: list[router_pb2.RouteDecision]) -> list[router_pb2.RouteDecision]:
    return [d for d in decisions if d.degraded]


def degraded_by(decisions: list[router_pb2.RouteDecision], service: str) -> list[router_pb2.RouteDecision]:
    """The decisions degraded because `service` alone was unavailable. The others must be deadlines missed on a
    loaded machine (a 500 ms stall of a fake's process), not what the test did."""
    other = {"estimator": "predictor", "predictor": "estimator"}[service]
    alone = [d for d in degraded(decisions) if d.degraded_reason.startswith(f"{service} unavailable (")
             and f"{other} unavailable" not in d.degraded_reason]
    others = [d.degraded_reason for d in degraded(decisions) if d not in alone]
    assert all("DEADLINE_EXCEEDED" in reason for reason in others), others
    return alone


def failure_code(decision: router_pb2.RouteDecision, service: str) -> str | None:
    """The status code `service` failed with in this decision, None if it answered."""
    match = re.search(rf"{service} unavailable \((\w+)", decision.degraded_reason)
    return match.group(1) if match else None


def answered_again(decisions: list[router_pb2.RouteDecision], service: str) -> bool:
    """Whether `service` answered a decision after the last one that found it gone: it came back. Missed deadlines
    (a loaded machine stalls the fakes' process: both at once, seen in CI) neither prove nor disprove it."""
    gone = [i for i, d in enumerate(decisions) if failure_code(d, service) not in (None, "DEADLINE_EXCEEDED")]
    return any(failure_code(d, service) is None for d in decisions[(gone[-1] if gone else -1) + 1:])


def redis_errors(stack: RouterStack) -> float:
    return sum(s.value for family in stack.registry.collect() for s in family.samples
               if s.name == "bear_router_dependency_errors_total" and s.labels.get("service") == "redis")


def test_redis_restarted_mid_load(stack: RouterStack) -> None:
    load = Load(stack.address, count=300, rate_rps=RATE_RPS)
    load.wait_until_sent(80)
    stack.redis_server.stop()
    load.wait_until_sent(160)
    stack.redis_server.start()  # same port, empty: the snapshotters would re-register within their heartbeat
    result = load.join()
    assert result.errors == [] and len(result.decisions) == 300
    # The predictor and the estimator answered throughout (but for deadlines a loaded machine may make them miss).
    assert all("DEADLINE_EXCEEDED" in d.degraded_reason for d in degraded(result.decisions))
    assert {d.instance_id for d in result.decisions} <= {i.instance_id for i in THREE_INSTANCES}
    assert redis_errors(stack) > 0  # the dispatches Redis missed were counted
    wait_until(lambda: stack.route().decision == router_pb2.DECISION_ROUTE)
    # Records resume on the restarted server (its registrations are gone: the router kept its own).
    assert wait_until(lambda: stack.redis.keys(redis_keys.dispatch_key("*")))
    assert stack.redis.zcard(redis_keys.INSTANCES) == 0


def test_estimator_killed_mid_load(stack: RouterStack) -> None:
    load = Load(stack.address, count=300, rate_rps=RATE_RPS)
    load.wait_until_sent(60)
    stack.estimator_server.kill()
    load.wait_until_sent(160)
    stack.estimator_server.revive()
    result = load.join()
    assert result.errors == [] and len(result.decisions) == 300
    fallbacks = degraded_by(result.decisions, "estimator")
    assert fallbacks, "no decision noticed the estimator was gone"
    for decision in fallbacks:
        assert decision.policy == "shortest-queue" and decision.instance_id == "medium-0", decision.degraded_reason
        assert decision.degraded_reason.startswith("estimator unavailable (")
        assert "queue lengths from the latest snapshots in Redis" in decision.degraded_reason
        assert {c.ttft_known for c in decision.candidates} == {False}
    assert answered_again(result.decisions, "estimator")  # back-off <= 1 s
    assert stack.metric("bear_router_fallbacks_total", reason="estimator-unavailable",
                        policy="shortest-queue") == len(fallbacks)


def test_predictor_killed_mid_load(stack: RouterStack) -> None:
    load = Load(stack.address, count=300, rate_rps=RATE_RPS)
    load.wait_until_sent(60)
    stack.predictor_server.kill()
    load.wait_until_sent(160)
    stack.predictor_server.revive()
    result = load.join()
    assert result.errors == [] and len(result.decisions) == 300
    fallbacks = degraded_by(result.decisions, "predictor")
    assert fallbacks
    for decision in fallbacks:
        # The estimator still answers: its queue lengths (small 0, medium 1, large 2 running) decide.
        assert decision.policy == "shortest-queue" and decision.instance_id == "small-0", decision.degraded_reason
        assert decision.degraded_reason.startswith("predictor unavailable (")
        assert "queue lengths from the estimator" in decision.degraded_reason
        assert {c.predicted_accuracy for c in decision.candidates} == {0.0}
        assert {c.ttft_known for c in decision.candidates} == {True}
    assert answered_again(result.decisions, "predictor")


def test_a_hanging_predictor_costs_one_deadline(stack: RouterStack) -> None:
    stack.predictor.behaviour.delay_s = 2.0
    started = time.perf_counter()
    decision = stack.route()
    elapsed_ms = (time.perf_counter() - started) * 1000
    assert decision.degraded and "predictor unavailable (DEADLINE_EXCEEDED" in decision.degraded_reason
    assert elapsed_ms < stack.config.predictor_timeout_s * 1000 + 400  # the deadline + the machinery, not the 2 s


def test_everything_down_is_round_robin(stack: RouterStack) -> None:
    assert not stack.route().degraded  # up, registrations read: then everything goes down
    stack.predictor_server.kill()
    stack.estimator_server.kill()
    stack.redis_server.stop()
    decisions = [stack.route() for _ in range(6)]
    assert {d.policy for d in decisions} == {"round-robin"} and all(d.degraded for d in decisions)
    assert [d.instance_id for d in decisions[:3]] == ["large-0", "medium-0", "small-0"]
    assert "predictor unavailable" in decisions[0].degraded_reason
    assert "estimator unavailable" in decisions[0].degraded_reason
    assert decisions[0].degraded_reason.endswith("round-robin (no queue lengths)")


def test_stale_snapshots(stack: RouterStack) -> None:
    # The estimator falls back to LPS on stale snapshots and says so: the decision is not degraded.
    for instance_id in ("small-0", "medium-0", "large-0"):
        stack.estimator.instances[instance_id] = InstanceState(
            ttft_ms=120.0, method=estimator_pb2.ESTIMATE_METHOD_LPS, snapshot_age_ms=30_000.0,
            reason="snapshot 30.000 s old: LPS closed form")
    decision = stack.route(ttft_slo_ms=500.0)
    assert not decision.degraded and {c.ttft_method for c in decision.candidates} == {"lps"}
    assert {c.snapshot_age_ms for c in decision.candidates} == {30_000.0}
    # With the estimator down, snapshots older than the limit give no queue lengths: round-robin.
    for instance_id in SNAPSHOT_QUEUES:
        put_snapshot(stack.redis, instance_id, running=1, taken_at_s=time.time() - 60.0)
    stack.estimator_server.kill()
    decision = stack.route()
    assert decision.degraded and decision.policy == "round-robin"
    assert decision.degraded_reason.endswith("round-robin (no queue lengths)")


def test_values_in_redis_that_do_not_decode_are_skipped(tmp_path: Path) -> None:
    # Another program's (or a broken writer's) values under BEAR's keys: skipped as if absent, never failing a Route,
    # the registration refresh, the fallback or ReportOutcome.
    stack = RouterStack(tmp_path, register=False)
    try:
        garbage = b"\xff\xff\xff\xff"
        stack.redis.zadd(redis_keys.INSTANCES, {b"bad\xff": time.time(), "broken-0": time.time()})
        stack.redis.set(redis_keys.instance_key("broken-0"), garbage)
        register_instances(stack.redis, THREE_INSTANCES)

        def routed_to() -> set[str]:
            try:
                return {c.instance_id for c in stack.route().candidates}
            except RouterUnavailable:  # not refreshed yet
                return set()

        assert wait_until(lambda: routed_to() == {"small-0", "medium-0", "large-0"})
        register_instances(stack.redis, [dataclasses.replace(THREE_INSTANCES[0], instance_id="small-1")])
        assert wait_until(lambda: "small-1" in routed_to())  # the refresh goes on
        stack.redis.set(redis_keys.dispatch_key("mangled"), garbage)
        assert not stack.client.report_outcome("mangled", observed_ttft_ms=90.0).known
        for instance_id, (running, waiting) in SNAPSHOT_QUEUES.items():
            put_snapshot(stack.redis, instance_id, running=running, waiting=waiting)
        stack.redis.set(redis_keys.snapshot_key("small-0"), garbage)
        stack.estimator_server.kill()
        decision = stack.route()
        assert decision.degraded and decision.policy == "shortest-queue" and decision.instance_id == "medium-0"
    finally:
        stack.close()


def test_an_instance_withdrawn_or_expired_is_dropped_at_once_and_stale_entries_are_trimmed(tmp_path: Path) -> None:
    """Its sidecar withdrew it (no live engine) or stopped refreshing it: queries sent there would be lost. Entries of
    bear:instances left by pods long replaced are removed, so that the set does not grow with every rollout."""
    stack = RouterStack(tmp_path)
    try:
        def candidates() -> set[str]:
            return {c.instance_id for c in stack.route().candidates}

        assert wait_until(lambda: candidates() == {"small-0", "medium-0", "large-0"})
        stale = {f"old-pod-{n}": time.time() - redis_keys.INSTANCES_WINDOW_S - 60 for n in range(1000)}
        stack.redis.zadd(redis_keys.INSTANCES, stale)
        stack.redis.delete(redis_keys.instance_key("large-0"))  # withdrawn; Redis kept the others
        stack.redis.zrem(redis_keys.INSTANCES, "large-0")
        withdrawn_at = time.monotonic()
        assert wait_until(lambda: candidates() == {"small-0", "medium-0"})
        assert time.monotonic() - withdrawn_at < 5  # the next refresh, not the 15 s kept after Redis came back empty
        assert wait_until(lambda: stack.redis.zcard(redis_keys.INSTANCES) == 2)  # the old pods' entries are gone
    finally:
        stack.close()
