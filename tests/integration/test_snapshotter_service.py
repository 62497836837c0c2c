"""The snapshotter sidecar end to end, without vLLM: a region written by a stand-in engine, the sidecar's real gRPC
server (port 0) and a real redis-server. What it serves and publishes, and how it rides out Redis and engine loss."""

from __future__ import annotations

import random
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bear.common import redis_keys
from bear.common.redis_config import RedisConfig
from bear.core.batch_time import BatchFeatures, BatchTimeCoefficients
from bear.snapshotter import main
from bear.snapshotter.config import SnapshotterConfig
from bear.snapshotter.server import MAX_WORKERS, RESERVED_WORKERS, SERVICE_NAME, WATCH_POLL_S
from bear.v1 import calibration_pb2, snapshot_pb2, snapshotter_pb2, snapshotter_pb2_grpc
from tests.http_health import HealthServer
from tests.redis_server import RedisServer
from tests.region_builders import FakeEngine, decoding, small_capacities, waiting

TRUE = BatchTimeCoefficients(b0=5e-3, b1=3e-5, b2=2e-8, b3=1e-9)


def wait_until(condition: Callable[[], object], timeout_s: float = 10.0) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


class Sidecar:
    def __init__(self, config: SnapshotterConfig):
        self.stop = threading.Event()
        ready: list[tuple[int, int | None]] = []
        self.thread = threading.Thread(target=main.run, args=(config, self.stop, lambda *ports: ready.append(ports)),
                                       daemon=True)
        self.thread.start()
        wait_until(lambda: ready)
        self.metrics_port = ready[0][1]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{ready[0][0]}")
        self.stub = snapshotter_pb2_grpc.SnapshotterStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def serving(self) -> bool:
        reply = self.health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=2)
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def snapshot(self) -> snapshot_pb2.InstanceSnapshot | None:
        try:
            return self.stub.GetSnapshot(snapshotter_pb2.GetSnapshotRequest(), timeout=2)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            return None

    def close(self) -> None:
        self.channel.close()
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def region(tmp_path: Path) -> str:
    return str(tmp_path / "region")


@pytest.fixture
def sidecar(redis_server: RedisServer, region: str) -> Iterator[Sidecar]:
    config = SnapshotterConfig(region=region, instance_id="pod-1", pool="small", endpoint="http://pod-1:8000",
                               input_usd_per_million_tokens=0.1, output_usd_per_million_tokens=0.4,
                               poll_interval_s=0.002, grpc_host="127.0.0.1", grpc_port=0, metrics_port=0,
                               snapshot_ttl_s=2.0,
                               engine_timeout_s=3.0,
                               calibration_window=400, calibration_min_samples=30, calibration_refit_s=0.0,
                               redis=RedisConfig(url=redis_server.url, timeout_s=0.5))
    running = Sidecar(config)
    yield running
    running.close()


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_server.url, socket_timeout=2)
    yield connection
    connection.close()


def stored_snapshot(client: redis.Redis) -> snapshot_pb2.InstanceSnapshot | None:
    try:
        payload = client.get(redis_keys.snapshot_key("pod-1"))
    except redis.RedisError:
        return None
    return None if payload is None else snapshot_pb2.InstanceSnapshot.FromString(payload)


def run_steps(engine: FakeEngine, rng: random.Random, count: int) -> None:
    """Steps of random composition, each lasting what TRUE says (± 2 %)."""
    for _ in range(count):
        running = [decoding(f"d{i}", prompt=rng.randint(10, 2000), outputs=rng.randint(1, 50))
                   for i in range(rng.randint(1, 8))]
        engine.write_state(running)
        scheduled = {r.request_id: 1 for r in running}
        features = BatchFeatures.of_batch((0, 1, r.num_computed_tokens) for r in running)
        if rng.random() < 0.5:
            prompt = waiting("p", prompt=rng.randint(16, 1024))
            engine.add(prompt)
            scheduled["p"] = prompt.num_prompt_tokens
            features = features + BatchFeatures.of_request(prompt.num_prompt_tokens, 0, 0)
        index = engine.schedule(scheduled, from_state=len(running))
        engine.finish_step(index, TRUE.time_s(features) * rng.uniform(0.98, 1.02))
        engine.finish("p")


def test_snapshots_are_served_and_published_as_the_engine_writes_them(sidecar: Sidecar, region: str,
                                                                      client: redis.Redis) -> None:
    assert not sidecar.serving() and sidecar.snapshot() is None  # no engine yet
    engine = FakeEngine(region, small_capacities())
    engine.write_state([decoding("a", prompt=900, outputs=3)], [waiting("b", prompt=50)], num_free_blocks=321)
    wait_until(sidecar.serving)
    served = wait_until(sidecar.snapshot)
    assert isinstance(served, snapshot_pb2.InstanceSnapshot)
    assert (served.instance_id, served.pool, served.model, served.num_free_blocks) == ("pod-1", "small",
                                                                                       "qwen3-test", 321)
    assert [(r.request_id, r.num_computed_tokens) for r in served.running] == [("a", 902)]
    assert [r.request_id for r in served.waiting] == ["b"]
    published = wait_until(lambda: stored_snapshot(client))
    assert published == served or published.sequence_number <= served.sequence_number
    assert 0 < client.pttl(redis_keys.snapshot_key("pod-1")) <= 2000
    registration = snapshot_pb2.InstanceRegistration.FromString(
        wait_until(lambda: client.get(redis_keys.instance_key("pod-1"))))
    assert (registration.endpoint, registration.output_usd_per_million_tokens, registration.engine.block_size) == (
        "http://pod-1:8000", 0.4, 16)
    assert client.zscore(redis_keys.INSTANCES, "pod-1") is not None


def test_watchers_get_every_new_snapshot_and_the_pub_sub_channel_announces_them(sidecar: Sidecar, region: str,
                                                                                client: redis.Redis) -> None:
    engine = FakeEngine(region, small_capacities())
    engine.write_state([decoding("a")])
    wait_until(sidecar.snapshot)
    subscription = client.pubsub(ignore_subscribe_messages=True)
    subscription.subscribe(redis_keys.SNAPSHOTS_CHANNEL)
    wait_until(lambda: subscription.get_message(timeout=0.05) is None)  # subscribed
    stream = sidecar.stub.WatchSnapshots(snapshotter_pb2.WatchSnapshotsRequest(), timeout=10)
    first = next(stream)
    for outputs in range(2, 5):
        time.sleep(0.05)
        engine.write_state([decoding("a", outputs=outputs)])
    seen = [first]
    while seen[-1].running[0].num_output_tokens < 4:
        seen.append(next(stream))
    stream.cancel()
    assert [s.sequence_number for s in seen] == sorted({s.sequence_number for s in seen})
    announced = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (not announced or announced[-1].running[0].num_output_tokens < 4):
        message = subscription.get_message(timeout=0.1)
        if message is not None:
            announced.append(snapshot_pb2.InstanceSnapshot.FromString(message["data"]))
    subscription.close()
    assert announced and announced[-1].running[0].num_output_tokens == 4


def test_watch_streams_never_take_the_threads_of_health_checks_and_unary_calls(sidecar: Sidecar, region: str) -> None:
    """Each WatchSnapshots stream holds a server thread: past MAX_WORKERS - RESERVED_WORKERS of them a new one is
    refused, the readiness probe's health check and GetSnapshot still answer at once, and a stream whose client left
    in the middle of a long interval gives its thread back within WATCH_POLL_S."""
    engine = FakeEngine(region, small_capacities())
    engine.write_state([decoding("a")])
    wait_until(sidecar.snapshot)
    with pytest.raises(grpc.RpcError) as refused:
        next(sidecar.stub.WatchSnapshots(snapshotter_pb2.WatchSnapshotsRequest(min_interval_ms=4_294_967_295),
                                         timeout=5))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "min_interval_ms must be at most 60000" in (refused.value.details() or "")

    allowed = MAX_WORKERS - RESERVED_WORKERS
    streams = [sidecar.stub.WatchSnapshots(snapshotter_pb2.WatchSnapshotsRequest(min_interval_ms=60_000), timeout=30)
               for _ in range(allowed)]
    for stream in streams:
        next(stream)  # the first snapshot at once; the next not before a minute
    with pytest.raises(grpc.RpcError) as full:
        next(sidecar.stub.WatchSnapshots(snapshotter_pb2.WatchSnapshotsRequest(), timeout=5))
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    engine.write_state([decoding("a", outputs=3)])  # the streams now wait out their interval
    started = time.monotonic()
    assert sidecar.serving() and sidecar.snapshot() is not None
    assert time.monotonic() - started < 1.0
    for stream in streams:
        stream.cancel()
    fresh = wait_until(lambda: _watch_once(sidecar), timeout_s=2 * WATCH_POLL_S + 1.0)
    assert fresh.running[0].num_output_tokens == 3


def _watch_once(sidecar: Sidecar) -> snapshot_pb2.InstanceSnapshot | None:
    stream = sidecar.stub.WatchSnapshots(snapshotter_pb2.WatchSnapshotsRequest(), timeout=5)
    try:
        return next(stream)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        return None
    finally:
        stream.cancel()


def test_bytes_that_are_no_request_are_invalid_argument(sidecar: Sidecar) -> None:
    get = sidecar.channel.unary_unary(f"/{SERVICE_NAME}/GetSnapshot")  # bytes in, bytes out
    with pytest.raises(grpc.RpcError) as refused:
        get(b"\xff\xff\xff", timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.value.details() or "").startswith("malformed request")
    assert not sidecar.serving()  # and the server goes on answering (no engine here yet)


def test_coefficients_are_fitted_online_and_travel_with_the_snapshots(sidecar: Sidecar, region: str,
                                                                      client: redis.Redis) -> None:
    engine = FakeEngine(region, small_capacities(max_rows=16, max_step_entries=16, max_slots=64))
    with pytest.raises(grpc.RpcError) as error:
        sidecar.stub.GetCoefficients(snapshotter_pb2.GetCoefficientsRequest(), timeout=2)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    rng = random.Random(7)
    for _ in range(6):  # in batches, so that the sidecar sees each step (the ring holds 4)
        run_steps(engine, rng, 3)
        time.sleep(0.02)
    run_steps(engine, rng, 40)

    def fitted() -> calibration_pb2.BatchTimeCoefficients | None:
        try:
            return sidecar.stub.GetCoefficients(snapshotter_pb2.GetCoefficientsRequest(), timeout=2)
        except grpc.RpcError:
            run_steps(engine, rng, 2)
            return None

    coefficients = wait_until(fitted)
    assert isinstance(coefficients, calibration_pb2.BatchTimeCoefficients)
    assert coefficients.num_samples >= 30 and coefficients.mape < 0.05
    assert coefficients.intercept_s == pytest.approx(TRUE.b0, rel=0.2)
    assert coefficients.per_token_s == pytest.approx(TRUE.b1, rel=0.2)
    run_steps(engine, rng, 1)
    snapshot = wait_until(lambda: (s := sidecar.snapshot()) is not None and s.HasField("batch_time") and s)
    assert snapshot.batch_time.num_samples >= 30
    assert calibration_pb2.BatchTimeCoefficients.FromString(
        wait_until(lambda: client.get(redis_keys.coefficients_key("pod-1")))).num_samples >= 30


def test_metrics_report_the_engine_the_snapshots_and_the_fit(sidecar: Sidecar, region: str) -> None:
    engine = FakeEngine(region, small_capacities(max_rows=16, max_step_entries=16, max_slots=64))
    engine.writer.num_errors = 3  # exceptions the plugin contained inside the engine
    engine.write_state([decoding("a"), decoding("b")], [waiting("c")], written_at_s=time.time())
    rng = random.Random(3)
    for _ in range(20):
        run_steps(engine, rng, 3)
        time.sleep(0.01)

    def scrape() -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{sidecar.metrics_port}/metrics", timeout=5).read().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples

    samples = wait_until(lambda: (m := scrape()).get("bear_snapshotter_calibration_samples", 0) >= 30 and m)
    assert isinstance(samples, dict)
    assert samples["bear_snapshotter_engine_available"] == 1.0
    assert samples["bear_snapshotter_snapshots_total"] >= 1 and samples["bear_snapshotter_published_total"] >= 1
    assert samples["bear_snapshotter_region_errors_total"] == 0
    assert samples["bear_snapshotter_plugin_errors_total"] == 3
    assert samples["bear_snapshotter_torn_reads_total"] >= 0 and samples["bear_snapshotter_missed_steps_total"] >= 0
    assert 0 <= samples["bear_snapshotter_snapshot_age_seconds"] < 5  # read (or refreshed) just now
    assert "bear_snapshotter_engine_state_age_seconds" in samples  # (these states carry made-up times)
    assert 0 <= samples["bear_snapshotter_calibration_mape"] < 0.05
    # The latest state was read with the fit or after it: it carries the steps' speed against it (they last what TRUE
    # says, ± 2 %).
    assert 0.95 < samples["bear_snapshotter_step_time_ratio"] < 1.05
    assert 'bear_snapshotter_residents{queue="running"}' in samples


def test_with_a_health_url_the_instance_is_registered_while_the_server_answers(redis_server: RedisServer, region: str,
                                                                            client: redis.Redis) -> None:
    """The whole sidecar with its health probe against a real HTTP server and a real Redis: an engine whose server
    does not answer yet is not registered; it is once the server answers, withdrawn when it stops, and back when it
    answers again (its region unchanged: the engine is idle); the probes are counted on /metrics."""
    health = HealthServer()
    health.status = 503
    config = SnapshotterConfig(region=region, instance_id="pod-1", pool="small", endpoint="http://pod-1:8000",
                               engine_health_url=health.url, engine_health_timeout_s=1.0, poll_interval_s=0.002,
                               grpc_host="127.0.0.1", grpc_port=0, metrics_port=0, snapshot_ttl_s=2.0,
                               redis=RedisConfig(url=redis_server.url, timeout_s=0.5))
    engine = FakeEngine(region, small_capacities(max_rows=16, max_step_entries=16, max_slots=64))
    engine.write_state([decoding("a")], written_at_s=time.time())
    sidecar = Sidecar(config)
    registered = lambda: client.exists(redis_keys.instance_key("pod-1")) == 1  # noqa: E731
    try:
        time.sleep(1.5)  # three probes answered 503
        assert not registered() and not sidecar.serving() and stored_snapshot(client) is None
        health.status = 200
        wait_until(registered, 5)
        assert sidecar.serving() and [r.request_id for r in wait_until(lambda: stored_snapshot(client)).running] == [
            "a"]
        health.status = 503
        started = time.monotonic()
        wait_until(lambda: not registered(), 5)
        assert time.monotonic() - started < 2.5 and stored_snapshot(client) is None and not sidecar.serving()
        health.status = 200
        wait_until(registered, 5)
        wait_until(lambda: stored_snapshot(client))  # republished though the region did not change
        text = urllib.request.urlopen(f"http://127.0.0.1:{sidecar.metrics_port}/metrics", timeout=5).read().decode()
        samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        assert float(samples["bear_snapshotter_engine_health_failures_total"]) >= 4
        assert float(samples["bear_snapshotter_engine_health_probes_total"]) > float(
            samples["bear_snapshotter_engine_health_failures_total"])
    finally:
        sidecar.close()
        health.close()


def test_losing_redis_does_not_stop_reading_and_publishing_resumes(sidecar: Sidecar, region: str,
                                                                   redis_server: RedisServer,
                                                                   client: redis.Redis) -> None:
    engine = FakeEngine(region, small_capacities())
    engine.write_state([decoding("a", outputs=1)])
    wait_until(lambda: stored_snapshot(client))
    redis_server.stop()
    for outputs in range(2, 30):
        engine.write_state([decoding("a", outputs=outputs)])
        time.sleep(0.01)
    served = wait_until(lambda: (s := sidecar.snapshot()) is not None and s.running[0].num_output_tokens == 29 and s)
    redis_server.start()  # same port, empty
    republished = wait_until(lambda: stored_snapshot(client), timeout_s=15)
    assert republished.running[0].num_output_tokens == 29
    assert republished.sequence_number == served.sequence_number
    wait_until(lambda: client.get(redis_keys.instance_key("pod-1")), timeout_s=15)  # the registration too


def test_an_idle_engine_stays_published_past_the_ttl(sidecar: Sidecar, region: str, client: redis.Redis) -> None:
    engine = FakeEngine(region, small_capacities())
    engine.write_state([decoding("a")])
    first = wait_until(lambda: stored_snapshot(client))
    for _ in range(8):  # 4 s: longer than the TTL (2 s) and the engine timeout (3 s)
        engine.writer.beat(time.time())  # what the plugin's heartbeat thread does every second
        time.sleep(0.5)
    latest = stored_snapshot(client)
    assert sidecar.serving()
    assert latest is not None and latest.sequence_number == first.sequence_number
    assert latest.read_at_s > first.read_at_s and latest.taken_at_s == first.taken_at_s


@pytest.mark.parametrize("how", ["shut down", "killed"])
def test_an_engine_that_stops_leaves_health_and_redis(sidecar: Sidecar, region: str, client: redis.Redis,
                                                      how: str) -> None:
    engine = FakeEngine(region, small_capacities())
    engine.write_state([decoding("a")])
    wait_until(lambda: stored_snapshot(client))
    wait_until(lambda: client.get(redis_keys.instance_key("pod-1")))
    assert sidecar.serving()
    if how == "shut down":
        engine.writer.close()  # the plugin removes its region when the scheduler shuts down
    # killed: the region stays, its heartbeat stops (vLLM kills EngineCore without shutting the scheduler down)
    wait_until(lambda: not sidecar.serving(), timeout_s=6)
    assert sidecar.snapshot() is None
    # Withdrawn at once: routers stop sending it queries (the heartbeat would have kept the registration for good).
    wait_until(lambda: client.get(redis_keys.instance_key("pod-1")) is None, timeout_s=1)
    assert stored_snapshot(client) is None and client.zscore(redis_keys.INSTANCES, "pod-1") is None
    time.sleep(1.5)  # a heartbeat later it is still gone
    assert client.get(redis_keys.instance_key("pod-1")) is None
    if how == "killed":  # a restarted engine replaces the region and is found again, and registers anew
        FakeEngine(region, small_capacities()).write_state([decoding("after-restart")])
        wait_until(sidecar.serving)
        restarted = wait_until(sidecar.snapshot)
        assert [r.request_id for r in restarted.running] == ["after-restart"]
        wait_until(lambda: client.get(redis_keys.instance_key("pod-1")))
        assert client.zscore(redis_keys.INSTANCES, "pod-1") is not None
