"""What the router reads from and writes to Redis (key names: bear.common.redis_keys), never failing a decision.

    record_dispatches bear:dispatch:<request id> (DispatchRecord, TTL DISPATCH_TTL_S) and bear:dispatches:<instance>
                      (sorted set by dispatch time; at most once a second per instance, entries older than
                      the TTL are trimmed and the set's own TTL renewed, so it expires with its last entry)
    dispatch          a dispatch record by request id (ReportOutcome on a replica that did not route the query)
    queue_lengths     queue lengths from the latest snapshots (the fallback when the estimator is down)
    registrations     every registered instance (bear:instances, then bear:instance:<id>)

Every operation has a deadline. After a failure the store stops calling Redis for `retry_after_s` (each call in that
time fails at once), so that a Redis that hangs costs one deadline, not one per query; callers count the failures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from bear.common import redis_keys
from bear.router import wire
from bear.router.decision import DispatchRecord
from bear.router.pool import Registration
from bear.router.signals import DependencyUnavailable, QueueLengths

if TYPE_CHECKING:
    import redis.asyncio

T = TypeVar("T")
TRIM_INTERVAL_S = 1.0


class RedisStore:
    def __init__(self, client: redis.asyncio.Redis, timeout_s: float, retry_after_s: float = 0.5,
                 clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._down_until = 0.0  # monotonic time before which Redis is not called
        self._trimmed_at: dict[str, float] = {}

    async def record_dispatches(self, records: Sequence[DispatchRecord]) -> None:
        ttl_s = redis_keys.DISPATCH_TTL_S

        async def write() -> None:
            pipe = self._client.pipeline(transaction=False)
            for record in records:
                per_instance = redis_keys.dispatches_key(record.instance_id)
                pipe.set(redis_keys.dispatch_key(record.request_id), wire.dispatch_to_bytes(record),
                         px=int(ttl_s * 1000))
                pipe.zadd(per_instance, {record.request_id: record.dispatched_at_s})
                if record.dispatched_at_s - self._trimmed_at.get(record.instance_id, 0.0) >= TRIM_INTERVAL_S:
                    pipe.zremrangebyscore(per_instance, "-inf", f"({record.dispatched_at_s - ttl_s}")
                    pipe.expire(per_instance, int(ttl_s + TRIM_INTERVAL_S) + 1)
                    self._trimmed_at[record.instance_id] = record.dispatched_at_s
            await pipe.execute()

        await self._call("record", write)

    async def dispatch(self, request_id: str) -> DispatchRecord | None:
        payload = await self._call("dispatch", lambda: self._client.get(redis_keys.dispatch_key(request_id)))
        return None if payload is None else wire.dispatch_from_bytes(payload)

    async def queue_lengths(self, instance_ids: Sequence[str], max_age_s: float) -> dict[str, QueueLengths]:
        """Queue lengths of the instances whose latest snapshot is at most `max_age_s` old."""
        keys = [redis_keys.snapshot_key(i) for i in instance_ids]
        payloads = await self._call("snapshots", lambda: self._client.mget(keys)) if keys else []
        now_s = self._clock()
        queues = {}
        for instance_id, payload in zip(instance_ids, payloads, strict=True):
            if payload is None:
                continue
            queue = wire.queue_lengths_from_bytes(payload, now_s)
            if queue.snapshot_age_ms <= max_age_s * 1000:
                queues[instance_id] = queue
        return queues

    async def registrations(self) -> dict[str, Registration]:
        async def read() -> list[bytes | None]:
            ids = [i.decode() for i in await self._client.zrange(redis_keys.INSTANCES, 0, -1)]
            return await self._client.mget([redis_keys.instance_key(i) for i in ids]) if ids else []

        payloads = await self._call("registrations", read)
        found = [wire.registration_from_bytes(p) for p in payloads if p is not None]
        return {r.instance_id: r for r in found}

    async def close(self) -> None:
        await self._client.aclose()

    async def _call(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        if time.monotonic() < self._down_until:
            raise DependencyUnavailable("redis", "SKIPPED", f"{operation}: Redis failed less than "
                                                            f"{self._retry_after_s:g} s ago")
        try:
            async with asyncio.timeout(self._timeout_s):  # in this task: nothing is left running after a deadline
                return await call()
        except TimeoutError:
            self._down_until = time.monotonic() + self._retry_after_s
            raise DependencyUnavailable("redis", "DEADLINE_EXCEEDED", f"{operation} after "
                                                                      f"{self._timeout_s * 1000:g} ms") from None
        except Exception as error:  # noqa: BLE001 - redis.RedisError, OSError: Redis is unavailable
            self._down_until = time.monotonic() + self._retry_after_s
            raise DependencyUnavailable("redis", type(error).__name__, f"{operation}: {error}") from None
