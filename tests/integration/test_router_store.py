"""The router's Redis store against a real redis-server: every router sharing a Redis tells when it came back empty."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from bear.common import redis_keys
from bear.router.decision import DispatchRecord
from bear.router.store import RedisStore
from tests.redis_server import RedisServer, running_redis
from tests.router_fakes import THREE_INSTANCES, register_instances


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


def test_every_router_sharing_a_redis_sees_it_come_back_empty(redis_server: RedisServer) -> None:
    """Each router keeps the instances it held while their sidecars register again, and writes its latest dispatch
    records again: all of them, not only the one whose write recreated the marker."""
    sync = redis.Redis.from_url(redis_server.url)
    register_instances(sync, THREE_INSTANCES)

    async def scenario() -> list[list[bool]]:
        clients = [redis.asyncio.Redis.from_url(redis_server.url) for _ in range(3)]
        stores = [RedisStore(client, timeout_s=2.0) for client in clients]
        try:
            rounds = []
            for flush in (False, False, True, False, True, False):
                if flush:
                    sync.flushall()
                rounds.append([(await store.registrations())[1] for store in stores])
            found, _ = await stores[0].registrations()
            assert found == {}  # flushed
            return rounds
        finally:
            for client in clients:
                await client.aclose()

    try:
        rounds = asyncio.run(scenario())
    finally:
        sync.close()
    assert rounds == [[True] * 3, [False] * 3, [True] * 3, [False] * 3, [True] * 3, [False] * 3]


def test_a_registration_under_another_instances_key_is_skipped(redis_server: RedisServer) -> None:
    """A value under one instance's key must not register another (or one that does not exist)."""
    sync = redis.Redis.from_url(redis_server.url)
    register_instances(sync, THREE_INSTANCES)
    sync.set(redis_keys.instance_key("small-0"), sync.get(redis_keys.instance_key("large-0")))

    async def scenario() -> dict:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            return (await RedisStore(client, timeout_s=2.0).registrations())[0]
        finally:
            await client.aclose()

    try:
        found = asyncio.run(scenario())
    finally:
        sync.close()
    assert sorted(found) == ["large-0", "medium-0"] and found["large-0"].model == "Qwen3-32B"


def _dispatch(request_id: str, instance_id: str, at_s: float) -> DispatchRecord:
    return DispatchRecord(request_id, instance_id, "m", at_s, prompt_tokens=10, predicted_output_tokens=20.0,
                          predicted_ttft_ms=30.0, ttft_slo_ms=500.0)


def test_dispatch_sets_are_trimmed_and_pods_long_gone_are_forgotten(redis_server: RedisServer) -> None:
    """Each instance's dispatch set loses its entries past the TTL (at most once a second per instance) and expires
    with its last one; the store remembers when it trimmed an instance only while that set can exist, not for every
    pod ever routed to."""
    sync = redis.Redis.from_url(redis_server.url)
    ttl_s = redis_keys.DISPATCH_TTL_S
    start = 1_000_000.0

    async def scenario() -> RedisStore:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        store = RedisStore(client, timeout_s=2.0)
        await store.record_dispatches([_dispatch("old", "pod-a", start)])
        # the next dispatch to pod-a trims the entries past the TTL; one within a second of a trim does not
        await store.record_dispatches([_dispatch("new", "pod-a", start + ttl_s + 5)])
        await store.record_dispatches([_dispatch("late", "pod-a", start + ttl_s + 5.5)])
        # pod-a and pod-b receive nothing more: once their sets are gone, the store forgets them too
        await store.record_dispatches([_dispatch("b", "pod-b", start + ttl_s + 6)])
        await store.record_dispatches([_dispatch("c", "pod-c", start + 3 * ttl_s)])
        await client.aclose()
        return store

    try:
        store = asyncio.run(scenario())
        assert [m.decode() for m in sync.zrange(redis_keys.dispatches_key("pod-a"), 0, -1)] == ["new", "late"]
        assert 0 < sync.ttl(redis_keys.dispatches_key("pod-a")) <= ttl_s + 2
        assert sorted(store._trimmed_at) == ["pod-c"]
    finally:
        sync.close()


def test_a_closed_store_opens_no_connection_again(redis_server: RedisServer) -> None:
    from bear.router.signals import DependencyUnavailable

    async def scenario() -> tuple[int, str]:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        store = RedisStore(client, timeout_s=2.0)
        await store.registrations()
        await store.close()
        with pytest.raises(DependencyUnavailable) as refused:
            await store.record_dispatches([_dispatch("late", "pod-a", 1.0)])
        pool = client.connection_pool
        connections = [*pool._available_connections, *pool._in_use_connections]
        return sum(c.is_connected for c in connections), refused.value.detail

    open_connections, message = asyncio.run(scenario())
    assert open_connections == 0 and "the router is stopping" in message


class _PausedMget(redis.asyncio.Redis):
    """A real client whose MGET waits until released: a call of the store in flight between two round trips."""

    entered: asyncio.Event
    released: asyncio.Event

    async def mget(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.entered.set()
        await self.released.wait()
        return await super().mget(*args, **kwargs)


def test_closing_waits_for_the_calls_in_flight(redis_server: RedisServer) -> None:
    """A call in flight as the store closes ends before the connections close: otherwise its next round trip opens a
    connection that nothing closes (a fresh-clone CI run failed on one, garbage-collected in a later test)."""
    sync = redis.Redis.from_url(redis_server.url)
    register_instances(sync, THREE_INSTANCES)

    async def scenario() -> tuple[int, int, bool]:
        client = _PausedMget.from_url(redis_server.url)  # closes its pool with it, as the router's
        client.entered, client.released = asyncio.Event(), asyncio.Event()
        store = RedisStore(client, timeout_s=2.0)
        reading = asyncio.create_task(store.registrations())
        await client.entered.wait()  # the pipeline is done, the MGET not sent
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0.05)
        closed_early = closing.done()
        client.released.set()
        found, _ = await reading
        await closing
        pool = client.connection_pool
        return len(found), sum(c.is_connected for c in [*pool._available_connections, *pool._in_use_connections]), \
            closed_early

    try:
        found, open_connections, closed_early = asyncio.run(scenario())
    finally:
        sync.close()
    assert (found, open_connections, closed_early) == (3, 0, False)
