"""Publishing to Redis (fakeredis): latest values with TTLs, the pub/sub notice, heartbeats, and retries."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import fakeredis
import pytest

from bear.common import redis_keys
from bear.snapshotter.backoff import Backoff
from bear.snapshotter.publisher import RedisPublisher
from bear.v1 import calibration_pb2, snapshot_pb2


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def client(server: fakeredis.FakeServer) -> Iterator[fakeredis.FakeRedis]:
    client = fakeredis.FakeRedis(server=server)
    yield client
    client.close()


@pytest.fixture
def publisher(client: fakeredis.FakeRedis) -> Iterator[RedisPublisher]:
    publisher = RedisPublisher(client, "pod-1", ttl_s=5.0, heartbeat_s=0.2, backoff=Backoff(base_s=0.01, cap_s=0.05))
    publisher.start()
    yield publisher
    publisher.stop()


def snapshot(sequence_number: int) -> snapshot_pb2.InstanceSnapshot:
    return snapshot_pb2.InstanceSnapshot(instance_id="pod-1", sequence_number=sequence_number)


def stored(client: fakeredis.FakeRedis, key: str, message_type: type) -> object | None:
    payload = client.get(key)
    return None if payload is None else message_type.FromString(payload)


def test_the_latest_snapshot_is_stored_with_a_ttl_and_announced(client: fakeredis.FakeRedis,
                                                                publisher: RedisPublisher) -> None:
    subscription = client.pubsub(ignore_subscribe_messages=True)
    subscription.subscribe(redis_keys.SNAPSHOTS_CHANNEL)
    publisher.offer_snapshot(snapshot(7))
    wait_until(lambda: client.get(redis_keys.snapshot_key("pod-1")) is not None)
    assert stored(client, redis_keys.snapshot_key("pod-1"), snapshot_pb2.InstanceSnapshot) == snapshot(7)
    assert 4000 < client.pttl(redis_keys.snapshot_key("pod-1")) <= 5000
    messages = [subscription.get_message(timeout=0.1) for _ in range(20)]  # the first read may be the subscription
    payloads = [m["data"] for m in messages if m is not None]
    assert [snapshot_pb2.InstanceSnapshot.FromString(p) for p in payloads] == [snapshot(7)]
    subscription.close()


def test_registration_and_coefficients_are_refreshed_every_heartbeat(client: fakeredis.FakeRedis,
                                                                     publisher: RedisPublisher) -> None:
    publisher.set_registration(snapshot_pb2.InstanceRegistration(instance_id="pod-1", pool="small", model="m"))
    publisher.offer_coefficients(calibration_pb2.BatchTimeCoefficients(intercept_s=0.004, num_samples=60))
    wait_until(lambda: client.get(redis_keys.instance_key("pod-1")) is not None)
    first = stored(client, redis_keys.instance_key("pod-1"), snapshot_pb2.InstanceRegistration)
    assert first is not None and (first.pool, first.model) == ("small", "m") and first.registered_at_s > 0
    assert client.zscore(redis_keys.INSTANCES, "pod-1") == pytest.approx(first.registered_at_s)
    wait_until(lambda: client.get(redis_keys.coefficients_key("pod-1")) is not None)
    client.delete(redis_keys.coefficients_key("pod-1"))  # lost (a Redis restart): the next heartbeat restores it
    wait_until(lambda: client.get(redis_keys.coefficients_key("pod-1")) is not None)
    refreshed = stored(client, redis_keys.instance_key("pod-1"), snapshot_pb2.InstanceRegistration)
    assert refreshed is not None and refreshed.registered_at_s > first.registered_at_s


def test_only_the_latest_pending_snapshot_is_sent(client: fakeredis.FakeRedis, publisher: RedisPublisher,
                                                  server: fakeredis.FakeServer) -> None:
    server.connected = False
    for sequence_number in range(1, 50):
        publisher.offer_snapshot(snapshot(sequence_number))
    wait_until(lambda: publisher.num_failures >= 2)
    server.connected = True
    wait_until(lambda: client.get(redis_keys.snapshot_key("pod-1")) is not None)
    assert stored(client, redis_keys.snapshot_key("pod-1"), snapshot_pb2.InstanceSnapshot) == snapshot(49)
    assert publisher.num_snapshots_published == 1


def test_redis_down_means_retries_with_back_off_and_offers_never_block(client: fakeredis.FakeRedis,
                                                                        server: fakeredis.FakeServer) -> None:
    # Seeded: full jitter may draw three waits under 50 ms in all (about 2% of draws); these are 42, 76, 84 ms.
    backoff = Backoff(base_s=0.05, cap_s=0.2, rng=random.Random(0))
    publisher = RedisPublisher(client, "pod-1", ttl_s=5.0, heartbeat_s=10.0, backoff=backoff)
    publisher.start()
    try:
        server.connected = False
        started = time.monotonic()
        publisher.offer_snapshot(snapshot(1))
        wait_until(lambda: publisher.num_failures >= 4)
        elapsed = time.monotonic() - started
        assert publisher.last_error is not None and "ConnectionError" in publisher.last_error
        assert elapsed > 0.05  # it waited between attempts ...
        assert publisher.num_failures < 50  # ... instead of spinning
        offer_started = time.monotonic()
        publisher.offer_snapshot(snapshot(2))
        assert time.monotonic() - offer_started < 0.05
        server.connected = True
        wait_until(lambda: client.get(redis_keys.snapshot_key("pod-1")) is not None)
        assert stored(client, redis_keys.snapshot_key("pod-1"), snapshot_pb2.InstanceSnapshot) == snapshot(2)
        assert backoff.failures == 0 and publisher.last_error is None
    finally:
        publisher.stop()


def test_a_withdrawn_registration_is_deleted_at_once_and_again_after_redis_comes_back(
        client: fakeredis.FakeRedis, server: fakeredis.FakeServer) -> None:
    publisher = RedisPublisher(client, "pod-1", ttl_s=5.0, heartbeat_s=0.05,
                               backoff=Backoff(base_s=0.01, cap_s=0.05, rng=random.Random(0)))
    publisher.start()
    keys = (redis_keys.instance_key("pod-1"), redis_keys.snapshot_key("pod-1"))
    try:
        publisher.set_registration(snapshot_pb2.InstanceRegistration(instance_id="pod-1", pool="p"))
        publisher.offer_snapshot(snapshot(1))
        wait_until(lambda: all(client.get(k) is not None for k in keys))
        publisher.withdraw_registration()
        wait_until(lambda: all(client.get(k) is None for k in keys))
        assert client.zscore(redis_keys.INSTANCES, "pod-1") is None
        time.sleep(0.2)  # heartbeats later: not registered again
        assert client.get(keys[0]) is None
        publisher.set_registration(snapshot_pb2.InstanceRegistration(instance_id="pod-1", pool="p"))  # a new engine
        wait_until(lambda: client.get(keys[0]) is not None)
        server.connected = False
        publisher.withdraw_registration()
        wait_until(lambda: publisher.num_failures >= 2)
        server.connected = True
        wait_until(lambda: client.get(keys[0]) is None and client.zscore(redis_keys.INSTANCES, "pod-1") is None)
    finally:
        publisher.stop()


def test_a_pool_in_another_database_announces_on_a_channel_of_its_own(server: fakeredis.FakeServer) -> None:
    """Redis' channels span its databases: a pool in database 5 must not feed the estimators of database 0."""
    client = fakeredis.FakeRedis(server=server, db=5)
    publisher = RedisPublisher(client, "pod-1", ttl_s=5.0, heartbeat_s=0.2, backoff=Backoff(base_s=0.01, cap_s=0.05))
    default, own = client.pubsub(ignore_subscribe_messages=True), client.pubsub(ignore_subscribe_messages=True)
    default.subscribe(redis_keys.SNAPSHOTS_CHANNEL)
    own.subscribe("bear:snapshots:db5")
    publisher.start()
    try:
        publisher.offer_snapshot(snapshot(3))
        wait_until(lambda: client.get(redis_keys.snapshot_key("pod-1")) is not None)
        received = [m for m in (own.get_message(timeout=0.1) for _ in range(20)) if m is not None]
        assert [snapshot_pb2.InstanceSnapshot.FromString(m["data"]) for m in received] == [snapshot(3)]
        assert all(default.get_message(timeout=0.02) is None for _ in range(5))
    finally:
        publisher.stop()
        default.close()
        own.close()
        client.close()
    assert redis_keys.snapshots_channel(0) == "bear:snapshots"


def test_a_sidecar_that_stops_withdraws_its_instance(client: fakeredis.FakeRedis) -> None:
    """Routers drop it at once, and a new pool under the same ids (a demo run again) is not mistaken for it."""
    publisher = RedisPublisher(client, "pod-1", ttl_s=5.0, heartbeat_s=0.2, backoff=Backoff(base_s=0.01, cap_s=0.05))
    publisher.start()
    publisher.set_registration(snapshot_pb2.InstanceRegistration(instance_id="pod-1", pool="small", model="m"))
    publisher.offer_snapshot(snapshot(1))
    wait_until(lambda: client.get(redis_keys.instance_key("pod-1")) is not None
               and client.get(redis_keys.snapshot_key("pod-1")) is not None)
    publisher.stop(withdraw=True)
    assert client.get(redis_keys.instance_key("pod-1")) is None and client.get(redis_keys.snapshot_key("pod-1")) is None
    assert client.zscore(redis_keys.INSTANCES, "pod-1") is None


def test_a_sidecar_stopping_while_redis_is_down_says_so_and_stops(server: fakeredis.FakeServer,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    client = fakeredis.FakeRedis(server=server)
    publisher = RedisPublisher(client, "pod-1", ttl_s=5.0, heartbeat_s=0.2, backoff=Backoff(base_s=0.01, cap_s=0.05))
    publisher.start()
    publisher.set_registration(snapshot_pb2.InstanceRegistration(instance_id="pod-1", pool="small", model="m"))
    wait_until(lambda: client.get(redis_keys.instance_key("pod-1")) is not None)
    server.connected = False
    publisher.stop(withdraw=True)
    assert "not withdrawn from Redis at shutdown" in caplog.text
    client.close()
