"""The estimator service over real gRPC (port 0) and a real redis-server: snapshots published the way the snapshotter
publishes them (its `RedisPublisher`), dispatches recorded the way the router records them; Estimate checked against
the Python reference replay run directly; a stale snapshot → LPS; Redis restarted under load; residents' remaining
lengths from the predictor service or a local artifact; bad input; `bear serve estimator` as a process."""

from __future__ import annotations

import math
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

from bear.common.prefix_blocks import prefix_block_hashes
from bear.common.redis_config import RedisConfig
from bear.core.batch_time import BatchFeatures, BatchTimeCoefficients
from bear.core.lps import lps_ttft_s
from bear.core.prefill_throughput import prefill_throughput_ttft_s
from bear.core.replay import ReplayEngine, replay
from bear.core.state import Arrival, Query, ResidentRequest
from bear.core.wire import state_from_snapshot
from bear.estimator import main
from bear.estimator.config import EstimatorConfig
from bear.predictor.catalog import PAPER_POOL
from bear.predictor.config import PredictorServiceConfig
from bear.predictor.main import PredictorService
from bear.predictor.predictor import load_predictor
from bear.predictor.synthetic_corpus import generate
from bear.predictor.training import TrainingConfig, train
from bear.snapshotter.backoff import Backoff
from bear.snapshotter.publisher import RedisPublisher
from bear.v1 import estimator_pb2, estimator_pb2_grpc, router_pb2, snapshot_pb2
from tests.estimator_builders import (
    PREFILL_TOKENS_PER_S,
    FakeClock,
    batch_time,
    decoding,
    dispatch_record,
    engine,
    queued,
    record_dispatch,
    registration,
    snapshot,
)
from tests.redis_server import RedisServer
from tests.served import serving
from tests.service_loop import LoopThread

DEFAULT_OUTPUT_TOKENS = 256.0
MEDIUM = PAPER_POOL.names[1]


def wait_until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


class RunningEstimator:
    """The estimator service on a loop thread, with a fake wall clock, and a client."""

    def __init__(self, config: EstimatorConfig, clock: Callable[[], float]) -> None:
        self.loop = LoopThread()
        self.started = self.loop.run(main.start(config, clock))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.started.port}")
        self.stub = estimator_pb2_grpc.EstimatorStub(self.channel)
        self.service = self.started.service

    def estimate(self, prompt_tokens: int = 1000, output_tokens: float = 50.0, ids: tuple[str, ...] = (),
                 horizon_ms: float = 0.0, recent: tuple[router_pb2.DispatchRecord, ...] = (),
                 prefix_hashes: bytes = b"") -> dict[str, estimator_pb2.InstanceEstimate]:
        reply = self.stub.Estimate(estimator_pb2.EstimateRequest(
            query_id="q", prompt_tokens=prompt_tokens, predicted_output_tokens=output_tokens, instance_ids=ids,
            horizon_ms=horizon_ms, recent_dispatches=recent, prompt_prefix_hashes=prefix_hashes), timeout=5)
        return {e.instance_id: e for e in reply.estimates}

    def adopted(self, instance_id: str, taken_at_s: float) -> bool:
        current = self.service.estimator.snapshot(instance_id) if self.service.estimator.knows(instance_id) else None
        return current is not None and current.taken_at_s == taken_at_s

    def close(self) -> None:
        self.channel.close()
        self.loop.run(self.started.stop())
        self.loop.close()


class Publishers:
    """One snapshotter publisher per instance, on a real Redis."""

    def __init__(self, server: RedisServer, clock: Callable[[], float]) -> None:
        self.client = redis.Redis.from_url(server.url, socket_timeout=1)
        self._clock = clock
        self._publishers: dict[str, RedisPublisher] = {}

    def publish(self, message: snapshot_pb2.InstanceSnapshot) -> None:
        publisher = self._publishers.get(message.instance_id)
        if publisher is None:
            publisher = self._publishers[message.instance_id] = RedisPublisher(
                self.client, message.instance_id, ttl_s=60.0, heartbeat_s=30.0,
                backoff=Backoff(base_s=0.02, cap_s=0.2), clock=self._clock)
            publisher.set_registration(registration(message.instance_id, message.model))
            publisher.start()
        publisher.offer_snapshot(message)

    def close(self) -> None:
        for publisher in self._publishers.values():
            publisher.stop()
        self.client.close()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def publishers(redis_server: RedisServer, clock: FakeClock) -> Iterator[Publishers]:
    running = Publishers(redis_server, clock)
    yield running
    running.close()


def estimator_config(redis_server: RedisServer, **overrides: object) -> EstimatorConfig:
    settings: dict[str, object] = dict(host="127.0.0.1", grpc_port=0, metrics_port=None, max_snapshot_age_s=2.0,
                                       resync_interval_s=0.05, dispatch_poll_interval_s=0.01,
                                       default_output_tokens=DEFAULT_OUTPUT_TOKENS,
                                       redis=RedisConfig(url=redis_server.url, timeout_s=0.5))
    settings.update(overrides)
    return EstimatorConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture
def estimator(redis_server: RedisServer, clock: FakeClock) -> Iterator[RunningEstimator]:
    running = RunningEstimator(estimator_config(redis_server), clock)
    yield running
    running.close()


# Replays -----------------------------------------------------------------------------------------------------------

def three_instances(now: float) -> tuple[dict[str, snapshot_pb2.InstanceSnapshot], dict[str, float]]:
    """Three instances unlike each other, and the predicted length of each resident the router dispatched."""
    a = snapshot("a", now - 0.3, [decoding("cmpl-ra1-0-0000abcd", 700, 40), decoding("cmpl-ra2-0-1111abcd", 90, 3),
                                  decoding("cmpl-stranger-0-2222abcd", 300, 12)],
                 [queued("chatcmpl-ra4-3333abcd", 2500)], read_at_s=now - 0.1)
    slower = BatchTimeCoefficients(b0=0.009, b1=4e-5, b2=2e-8, b3=2e-9)
    b = snapshot("b", now - 0.05, [decoding("rb1", 400, 7, placeholders=1), decoding("rb2", 60, 200, placeholders=1,
                                                                                      max_tokens=230)],
                 engine_config=engine(async_scheduling=True, max_num_batched_tokens=512),
                 coefficients=batch_time(slower, 25_000.0))
    b.next_step_index = 41
    step = b.step_in_progress
    step.step_index, step.execution_started_at_s, step.started_at_s = 40, now - 0.052, now - 0.052
    for request in b.running:
        step.entries.add(num_decode_tokens=1, num_context_tokens=request.num_computed_tokens - 1)
    c = snapshot("c", now - 0.2, [decoding("rc1", 3000, 1)], engine_config=engine(num_gpu_blocks=400))
    predicted = {"ra1": 300.0, "ra2": 120.0, "ra4": 80.0, "rb1": 64.0, "rb2": 500.0, "rc1": 20.0}
    return {"a": a, "b": b, "c": c}, predicted


def expected_replay(message: snapshot_pb2.InstanceSnapshot, predicted: dict[str, float], query: Query, now: float,
                    arrivals: tuple[Arrival, ...] = (), query_cached_tokens: int = 0
                    ):  # noqa: ANN201 - (ReplayResult, state)
    """The Python reference replay of the snapshot, residents' lengths by the stated fallback."""

    def remaining(request: snapshot_pb2.RequestState) -> int:
        router_id = re.sub(r"^(chat)?cmpl-|(-0)?-[0-9a-f]{8}$", "", request.request_id)
        generated = request.num_output_tokens + request.num_output_placeholders
        left = max(1.0, predicted.get(router_id, DEFAULT_OUTPUT_TOKENS) - generated)
        if request.max_tokens:
            left = min(left, request.max_tokens - generated)
        return max(1, round(left + request.num_output_placeholders))

    coefficients = BatchTimeCoefficients(message.batch_time.intercept_s, message.batch_time.per_token_s,
                                         message.batch_time.per_decode_context_token_s,
                                         message.batch_time.per_prefill_attention_token_s)
    in_flight = 0.0
    step = message.step_in_progress
    if step.entries and step.step_index < message.next_step_index:
        features = BatchFeatures.of_batch((e.num_prefill_tokens, e.num_decode_tokens, e.num_context_tokens)
                                          for e in step.entries)
        in_flight = max(0.0, coefficients.time_s(features) - (message.taken_at_s - step.execution_started_at_s))
    state = state_from_snapshot(message, remaining)
    result = replay(state, query, coefficients, query_time_s=now - message.taken_at_s, in_flight_s=in_flight,
                    arrivals=arrivals, query_cached_tokens=query_cached_tokens, engine=ReplayEngine.REFERENCE)
    return result, state


def test_estimates_are_the_reference_replay_of_each_instance(estimator: RunningEstimator, publishers: Publishers,
                                                             clock: FakeClock) -> None:
    now = clock()
    snapshots, predicted = three_instances(now)
    for request_id, length in predicted.items():
        instance_id = "b" if request_id.startswith("rb") else "c" if request_id.startswith("rc") else "a"
        record_dispatch(publishers.client, dispatch_record(request_id, instance_id, now - 10, 100, length))
    since = (dispatch_record("c-new-1", "c", snapshots["c"].taken_at_s + 0.05, 900, 40.0),
             dispatch_record("c-new-2", "c", snapshots["c"].taken_at_s + 0.1, 200, 10.0))
    for record in since:
        record_dispatch(publishers.client, record)
    for message in snapshots.values():
        publishers.publish(message)
    wait_until(lambda: all(estimator.adopted(i, m.taken_at_s) for i, m in snapshots.items()))
    wait_until(lambda: all(estimator.service.estimator.has_dispatch("c", r.request_id) for r in since))

    query = Query("q", 1000, 50)
    for ids in (("a", "b", "c"), ()):
        got = estimator.estimate(1000, 50.0, ids)
        assert sorted(got) == ["a", "b", "c"]
        for instance_id, message in snapshots.items():
            arrivals = tuple(
                Arrival(r.dispatched_at_s - message.taken_at_s,
                        ResidentRequest(r.request_id, r.prompt_tokens, 0, 0, round(r.predicted_output_tokens)))
                for r in since if r.instance_id == instance_id)
            result, state = expected_replay(message, predicted, query, now, arrivals)
            reply = got[instance_id]
            assert reply.method == estimator_pb2.ESTIMATE_METHOD_REPLAY and reply.known and reply.feasible
            assert reply.ttft_ms == pytest.approx(result.ttft_s * 1000, rel=1e-9)
            assert reply.num_batches == result.num_batches and not reply.lower_bound
            assert reply.snapshot_age_ms == pytest.approx(1000 * (now - max(message.taken_at_s, message.read_at_s)))
            assert (reply.num_running, reply.num_waiting) == (len(message.running), len(message.waiting))
            assert reply.pending_decode_tokens == sum(r.remaining_output_tokens
                                                      for r in (*state.running, *state.waiting))
            assert reply.prefill_tps_ttft_ms == pytest.approx(
                1000 * prefill_throughput_ttft_s(state, query, message.batch_time.prefill_tokens_per_s))


def test_dispatches_sent_along_count_before_redis_has_them(estimator: RunningEstimator, publishers: Publishers,
                                                           clock: FakeClock) -> None:
    now = clock()
    message = snapshot("a", now - 0.02, [decoding("ra1", 300, 5)])
    publishers.publish(message)
    wait_until(lambda: estimator.adopted("a", message.taken_at_s))
    alone = estimator.estimate(200, 50.0, ("a",))["a"]
    ahead = dispatch_record("just-routed", "a", now - 0.01, 1500, 30.0)  # routed after the snapshot, not in Redis
    elsewhere = dispatch_record("to-nowhere", "unknown", now - 0.01, 1500, 30.0)  # ignored: an unknown instance
    broken = dispatch_record("", "a", now - 0.01, 1500, 30.0)  # ignored: no request id
    with_it = estimator.estimate(200, 50.0, ("a",), recent=(ahead, elsewhere, broken))["a"]
    query = Query("q", 200, 50)
    arrival = Arrival(ahead.dispatched_at_s - message.taken_at_s, ResidentRequest("just-routed", 1500, 0, 0, 30))
    result, _ = expected_replay(message, {}, query, now, (arrival,))
    assert with_it.ttft_ms == pytest.approx(result.ttft_s * 1000, rel=1e-9)
    assert with_it.ttft_ms > alone.ttft_ms + 10
    assert estimator.estimate(200, 50.0, ("a",))["a"].ttft_ms == with_it.ttft_ms  # recorded, as if read from Redis
    assert estimator.service.feed.stats.dispatches_recorded == 1
    assert publishers.client.exists("bear:dispatch:just-routed") == 0


def test_a_prompt_prefills_only_what_the_prompts_routed_there_before_left_in_its_prefix_cache(
        estimator: RunningEstimator, publishers: Publishers, clock: FakeClock) -> None:
    now = clock()
    system = np.arange(50_000, 50_000 + 1200)  # a shared 1,200-token system prompt: 75 prefix blocks
    earlier = dispatch_record("earlier", "a", now - 20, 1240, 30.0)  # through Redis, as every router's records
    earlier.prompt_prefix_hashes = prefix_block_hashes(np.concatenate([system, np.arange(40)]))
    record_dispatch(publishers.client, earlier)
    publishers.publish(snapshot("a", now - 0.02, [decoding("earlier", 1240, 5)]))  # looked up as a resident
    publishers.publish(snapshot("b", now - 0.02, [decoding("rb", 1240, 5)]))
    wait_until(lambda: estimator.adopted("a", now - 0.02) and estimator.adopted("b", now - 0.02))
    wait_until(lambda: estimator.service.estimator.has_dispatch("a", "earlier"))
    hashes = prefix_block_hashes(np.concatenate([system, np.arange(7, 307)]))  # 1,500 tokens: 93 blocks
    got = estimator.estimate(1500, 50.0, ("a", "b"), prefix_hashes=hashes)
    query = Query("q", 1500, 50)
    for instance_id, cached in (("a", 1200), ("b", 0)):
        expected, _ = expected_replay(estimator.service.estimator.snapshot(instance_id), {"earlier": 30.0}, query,
                                      now, query_cached_tokens=cached)
        assert got[instance_id].ttft_ms == pytest.approx(expected.ttft_s * 1000, rel=1e-9)
    assert got["a"].ttft_ms < 0.5 * got["b"].ttft_ms


def test_a_horizon_makes_a_lower_bound(estimator: RunningEstimator, publishers: Publishers, clock: FakeClock) -> None:
    message = snapshot("a", clock(), [decoding(f"r{i}", 1000, 1) for i in range(10)])
    publishers.publish(message)
    wait_until(lambda: estimator.adopted("a", message.taken_at_s))
    reply = estimator.estimate(5000, 50.0, ("a",), horizon_ms=5.0)["a"]
    assert reply.known and reply.lower_bound and reply.ttft_ms >= 5.0


def test_a_stale_snapshot_falls_back_to_lps(estimator: RunningEstimator, publishers: Publishers,
                                            clock: FakeClock) -> None:
    start = clock()
    for t in range(11):  # two requests running; every second one completes and another starts
        clock.now_s = start + t
        message = snapshot("a", start + t, [decoding(f"r{t}"), decoding(f"r{t + 1}")])
        publishers.publish(message)
        wait_until(lambda m=message: estimator.adopted("a", m.taken_at_s))  # type: ignore[misc]
    assert estimator.estimate(2000, ids=("a",))["a"].method == estimator_pb2.ESTIMATE_METHOD_REPLAY
    clock.advance(3.0)
    resyncs = estimator.service.feed.stats.resyncs
    wait_until(lambda: estimator.service.feed.stats.resyncs > resyncs + 1)  # the LPS parameters refreshed
    reply = estimator.estimate(2000, ids=("a",))["a"]
    lps = estimator.service.estimator.calibration("a").lps  # type: ignore[union-attr]
    assert lps is not None and (lps.service_rate_qps, lps.concurrency) == (pytest.approx(1.0), pytest.approx(2.0))
    assert reply.method == estimator_pb2.ESTIMATE_METHOD_LPS and reply.known and reply.feasible
    assert reply.ttft_ms == pytest.approx(1000 * lps_ttft_s(lps, 2000))
    assert reply.ttft_ms >= 1000 * 2000 / PREFILL_TOKENS_PER_S
    assert reply.snapshot_age_ms == pytest.approx(3000.0) and reply.reason.startswith("snapshot 3.000 s old")


def test_instances_without_a_snapshot_or_unknown_are_none(estimator: RunningEstimator, publishers: Publishers,
                                                          clock: FakeClock) -> None:
    publishers.client.set("bear:instance:idle", registration("idle").SerializeToString())
    publishers.client.zadd("bear:instances", {"idle": clock()})
    wait_until(lambda: estimator.service.estimator.knows("idle"))
    counted_before = REGISTRY.get_sample_value("bear_estimator_estimates_total", {"method": "none"}) or 0.0
    got = estimator.estimate(100, 10.0, ("idle", "nowhere"))
    assert REGISTRY.get_sample_value("bear_estimator_estimates_total", {"method": "none"}) == counted_before + 2
    assert got["idle"].method == estimator_pb2.ESTIMATE_METHOD_NONE and not got["idle"].known
    assert got["idle"].reason == "no snapshot, no LPS parameters"
    assert got["nowhere"].method == estimator_pb2.ESTIMATE_METHOD_NONE and got["nowhere"].reason == "unknown instance"


def test_estimates_keep_coming_while_redis_restarts(estimator: RunningEstimator, publishers: Publishers,
                                                    redis_server: RedisServer, clock: FakeClock) -> None:
    first = snapshot("a", clock(), [decoding("r1")])
    publishers.publish(first)
    wait_until(lambda: estimator.adopted("a", first.taken_at_s))
    answers: list[int] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                answers.append(estimator.estimate(500, ids=("a",))["a"].method)
            except grpc.RpcError as error:
                failures.append(error)

    caller = threading.Thread(target=load)
    caller.start()
    try:
        redis_server.stop()
        wait_until(lambda: estimator.service.feed.stats.redis_failures >= 2)
        asked = len(answers)
        wait_until(lambda: len(answers) > asked + 20)  # answering from memory while Redis is away
        redis_server.start()  # same port, empty
        wait_until(lambda: estimator.service.feed.stats.subscribed)
    finally:
        stop.set()
        caller.join(10)
    assert not failures and set(answers) == {estimator_pb2.ESTIMATE_METHOD_REPLAY}
    clock.advance(31.0)  # the snapshotter's next heartbeat registers the instance again
    second = snapshot("a", clock(), [decoding("r1", output=2), decoding("r2")])
    publishers.publish(second)
    wait_until(lambda: estimator.adopted("a", second.taken_at_s))
    assert estimator.estimate(500, ids=("a",))["a"].num_running == 2


def test_while_redis_is_away_the_last_snapshots_are_replayed_forward(estimator: RunningEstimator,
                                                                    publishers: Publishers,
                                                                    redis_server: RedisServer, clock: FakeClock) -> None:
    """No snapshot can arrive then, however healthy the engines: LPS would decide on rates alone."""
    first = snapshot("a", clock(), [decoding("r1")])
    publishers.publish(first)
    wait_until(lambda: estimator.adopted("a", first.taken_at_s))
    redis_server.stop()
    wait_until(lambda: estimator.service.estimator.feed_cut_off)
    clock.advance(5.0)  # past the 2 s limit
    held = estimator.estimate(500, ids=("a",))["a"]
    assert held.method == estimator_pb2.ESTIMATE_METHOD_REPLAY and "Redis unreachable" in held.reason
    redis_server.start()  # same port, empty: the instance's snapshot is 5 s old and no longer replayed
    wait_until(lambda: estimator.service.feed.stats.subscribed)
    assert estimator.estimate(500, ids=("a",))["a"].method != estimator_pb2.ESTIMATE_METHOD_REPLAY


def test_bad_requests_are_invalid_argument(estimator: RunningEstimator) -> None:
    for request in (estimator_pb2.EstimateRequest(prompt_tokens=0),
                    estimator_pb2.EstimateRequest(prompt_tokens=10, predicted_output_tokens=math.nan),
                    estimator_pb2.EstimateRequest(prompt_tokens=10, horizon_ms=-1)):
        with pytest.raises(grpc.RpcError) as error:
            estimator.stub.Estimate(request, timeout=5)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error.value.details()


def test_health_and_reflection(estimator: RunningEstimator) -> None:
    health = health_pb2_grpc.HealthStub(estimator.channel)
    for service in ("", "bear.v1.Estimator"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(estimator.channel)
    (answer,) = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                timeout=5)
    assert "bear.v1.Estimator" in {s.name for s in answer.list_services_response.service}


# Residents' remaining lengths from the predictor -------------------------------------------------------------------

@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("predictor") / "artifact"
    train(generate(450, seed=1).table, PAPER_POOL, TrainingConfig(num_trees=30)).save(folder)
    return folder


@pytest.fixture
def predictor_address(artifact_dir: Path) -> Iterator[str]:
    loop = LoopThread()
    service = PredictorService(PredictorServiceConfig(model_dir=str(artifact_dir), host="127.0.0.1", grpc_port=0,
                                                      metrics_port=None))
    running = loop.run(service.start())
    yield f"127.0.0.1:{running.port}"
    loop.run(running.stop())
    service.close()
    loop.close()


def residents_on_medium(now: float) -> snapshot_pb2.InstanceSnapshot:
    return snapshot("m1", now, [decoding("cmpl-p1-0-0000abcd", 200, 150), decoding("cmpl-p2-0-1111abcd", 50, 3,
                                                                                    max_tokens=400),
                                decoding("cmpl-unrecorded-0-2222abcd", 80, 900)], [queued("cmpl-p3-0-3333abcd", 900)],
                    model=MEDIUM)


def predictor_remaining(artifact_dir: Path, message: snapshot_pb2.InstanceSnapshot, predicted: dict[str, float],
                        default: float) -> float:
    """Σ residents' remaining lengths by the artifact's E[L − g | L > g] (what pending_decode_tokens reports)."""
    predictor = load_predictor(artifact_dir)
    try:
        total = 0.0
        for request in (*message.running, *message.waiting):
            router_id = request.request_id.split("-")[1]
            expected = predictor.expected_remaining_tokens(MEDIUM, predicted.get(router_id, default),
                                                           request.num_output_tokens, request.max_tokens or None)
            total += max(1, round(expected))
        return total
    finally:
        predictor.close()


@pytest.mark.parametrize("source", ["service", "artifact"])
def test_residents_remaining_lengths_come_from_the_predictor(source: str, request: pytest.FixtureRequest,
                                                             redis_server: RedisServer, publishers: Publishers,
                                                             clock: FakeClock, artifact_dir: Path) -> None:
    where = ({"predictor_address": request.getfixturevalue("predictor_address")} if source == "service"
             else {"predictor_model_dir": str(artifact_dir)})
    running = RunningEstimator(estimator_config(redis_server, **where), clock)
    try:
        predicted = {"p1": 180.0, "p2": 40.0, "p3": 600.0}
        for request_id, length in predicted.items():
            record_dispatch(publishers.client, dispatch_record(request_id, "m1", clock() - 5, 100, length, MEDIUM))
        message = residents_on_medium(clock())
        publishers.publish(message)
        wait_until(lambda: running.adopted("m1", message.taken_at_s))
        default = (load_predictor(artifact_dir).artifact.baselines[MEDIUM].output_tokens if source == "artifact"
                   else DEFAULT_OUTPUT_TOKENS)
        reply = running.estimate(300, ids=("m1",))["m1"]
        assert reply.method == estimator_pb2.ESTIMATE_METHOD_REPLAY
        assert reply.pending_decode_tokens == predictor_remaining(artifact_dir, message, predicted, default)
        assert running.service.remaining.stats.rows_fallback == 0
    finally:
        running.close()


def test_without_the_predictor_the_fallback_answers(redis_server: RedisServer, publishers: Publishers,
                                                    clock: FakeClock) -> None:
    config = estimator_config(redis_server, predictor_address="127.0.0.1:9", predictor_timeout_s=0.05)
    running = RunningEstimator(config, clock)
    try:
        message = residents_on_medium(clock())
        publishers.publish(message)
        wait_until(lambda: running.adopted("m1", message.taken_at_s))
        reply = running.estimate(300, ids=("m1",))["m1"]
        assert reply.method == estimator_pb2.ESTIMATE_METHOD_REPLAY
        default = DEFAULT_OUTPUT_TOKENS
        assert reply.pending_decode_tokens == (default - 150) + (default - 3) + 1 + default  # 900 > the default
        assert running.service.remaining.stats.source_failures >= 1
    finally:
        running.close()


# The process --------------------------------------------------------------------------------------------------------

def test_bear_serve_estimator_answers_serves_metrics_and_stops_on_sigterm(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    now = time.time()
    message = snapshot("a", now, [decoding("r1")])
    client.set("bear:snapshot:a", message.SerializeToString())
    client.set("bear:instance:a", registration("a").SerializeToString())
    client.zadd("bear:instances", {"a": now})
    client.close()
    with serving("estimator", "--redis-url", redis_server.url, "--grpc-port", "0", "--metrics-port", "0", "--host",
                 "127.0.0.1", "--max-snapshot-age-s", "60") as (process, grpc_port, metrics_port):
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = estimator_pb2_grpc.EstimatorStub(channel)

            def replayed() -> bool:
                reply = stub.Estimate(estimator_pb2.EstimateRequest(prompt_tokens=100), timeout=5)
                return [e.method for e in reply.estimates] == [estimator_pb2.ESTIMATE_METHOD_REPLAY]

            wait_until(replayed)
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        assert re.search(r"^bear_estimator_estimate_seconds_count [1-9]", scraped, re.MULTILINE)
        assert re.search(r'^bear_estimator_estimates_total\{method="replay"\} [1-9]', scraped, re.MULTILINE)
        assert re.search(r'^bear_estimator_snapshot_age_seconds\{instance="a"\} \d', scraped, re.MULTILINE)
        assert "bear_estimator_feed_subscribed 1.0" in scraped
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0



def test_sigterm_right_after_start_up_stops_it_without_a_traceback(redis_server: RedisServer) -> None:
    # QA: the feed's tasks were cancelled but not awaited, and Redis closed under them while they unwound: 7 of 10
    # such stops logged "Task exception was never retrieved" (ConnectionError) or an error during shutdown.
    for _ in range(4):
        with serving("estimator", "--redis-url", redis_server.url, "--grpc-port", "0", "--metrics-port", "0",
                     "--host", "127.0.0.1") as (process, _, _):
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=15) == 0
            assert process.stderr is not None
            log = process.stderr.read()
        assert "Traceback" not in log and "never retrieved" not in log and "exception" not in log.lower(), log
