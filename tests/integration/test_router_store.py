"""The router's Redis store against a real redis-server: every router sharing a Redis tells when it came back empty."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

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
