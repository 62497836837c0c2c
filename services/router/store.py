"""What the router reads from and writes to Redis (key names: bear.common.redis_keys), never failing a decision.

    record_dispatches bear:dispatch:<request id> (DispatchRecord, TTL DISPATCH_TTL_S) and bear:dispatches:<instance>
                      (sorted set by dispatch time; at most once a second per instance, entries older than
                      the TTL are trimmed and the set's own TTL renewed, so it expires with its last entry)
    dispatch          a dispatch record by request id (ReportOutcome on a replica that did not route the query)
    queue_lengths     queue lengths from the latest snapshots (the fallback when the estimator is down)
    registrations     every registered instance (bear:instances within INSTANCES_WINDOW_S, then bear:instance:<id>;
                      older entries of bear:instances are removed), and whether Redis is new or came back empty
                      (the epoch in bear:present changed since the last read)

Every operation has a deadline (the dispatch records' writes, off the Route path, one of their own; until one has
succeeded, at least FIRST_CALL_TIMEOUT_S: the first also opens the connection, and the first Route calls wait for
the registrations it reads). After a failure the store stops calling
Redis for `retry_after_s` (each call in that time fails at once), so that a Redis that hangs costs one deadline, not
one per query; callers count the failures.
`close` waits for the calls in flight (each ends by its deadline) before it closes the connections: a call that
went on past them would open a new one, left open.
A value that does not decode (another program's, or a broken writer's, under one of BEAR's keys) is skipped as if
absent, with a warning the first time and every 100th per key (`bear.common.log_throttle`): it never fails a read of
the others.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from bear.common import redis_keys
from bear.common.log_throttle import LogThrottle
from bear.router import wire
from bear.router.decision import DispatchRecord
from bear.router.pool import Registration
from bear.router.signals import SKIPPED, DependencyUnavailable, QueueLengths

if TYPE_CHECKING:
    import redis.asyncio

T = TypeVar("T")
TRIM_INTERVAL_S = 1.0
FIRST_CALL_TIMEOUT_S = 0.5

logger = logging.getLogger("bear.router")


class RedisStore:
    def __init__(self, client: redis.asyncio.Redis, timeout_s: float, retry_after_s: float = 0.5,
                 clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._epoch: bytes | None = None  # bear:present as last read
        self._down_until = 0.0  # monotonic time before which Redis is not called
        self._succeeded = False  # a call has succeeded (the connection is open)
        self._trimmed_at: dict[str, float] = {}  # by instance id: when its dispatches set was last trimmed
        self._forgotten_at = float("-inf")  # the last pass of _forget_expired
        self._undecodable = LogThrottle()  # by Redis key
        self._closed = False  # after close(), no call opens a connection again (it would be left open)
        self._in_flight = 0  # calls started and not ended
        self._deadline = 0.0  # monotonic: the latest deadline of a call started so far

    async def record_dispatches(self, records: Sequence[DispatchRecord], timeout_s: float | None = None) -> None:
        """Writes the records, with a deadline of `timeout_s` if given (off the Route path) instead of the store's."""
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
            self._forget_expired(max((r.dispatched_at_s for r in records), default=0.0) - ttl_s - TRIM_INTERVAL_S)

        await self._call("record", write, timeout_s)

    def _forget_expired(self, before_s: float) -> None:
        """Forgets the instances not trimmed since `before_s`: their sets have expired with their last entries (pods
        replaced long ago), and a dispatch to one trims it anew. Otherwise: an entry per pod ever routed to."""
        if before_s - self._forgotten_at < TRIM_INTERVAL_S:
            return  # at most once a second: a pass over every instance
        self._forgotten_at = before_s
        for instance_id in [i for i, at in self._trimmed_at.items() if at < before_s]:
            del self._trimmed_at[instance_id]

    async def dispatch(self, request_id: str) -> DispatchRecord | None:
        key = redis_keys.dispatch_key(request_id)
        payload = await self._call("dispatch", lambda: self._client.get(key))
        return None if payload is None else self._decoded(key, wire.dispatch_from_bytes, payload)

    async def queue_lengths(self, instance_ids: Sequence[str], max_age_s: float) -> dict[str, QueueLengths]:
        """Queue lengths of the instances whose latest snapshot is at most `max_age_s` old."""
        keys = [redis_keys.snapshot_key(i) for i in instance_ids]
        payloads = await self._call("snapshots", lambda: self._client.mget(keys)) if keys else []
        now_s = self._clock()
        queues = {}
        for key, instance_id, payload in zip(keys, instance_ids, payloads, strict=True):
            queue = None if payload is None else self._decoded(
                key, lambda p: wire.queue_lengths_from_bytes(p, now_s), payload)
            if queue is not None and queue.snapshot_age_ms <= max_age_s * 1000:
                queues[instance_id] = queue
        return queues

    async def registrations(self) -> tuple[dict[str, Registration], bool]:
        """The registered instances, and whether this Redis is new or came back empty (then instances missing from
        it may register again soon; otherwise a missing one was withdrawn or expired)."""
        async def read() -> tuple[list[str], list[bytes | None], bool]:
            stale_before = self._clock() - redis_keys.INSTANCES_WINDOW_S
            pipe = self._client.pipeline(transaction=False)
            pipe.zremrangebyscore(redis_keys.INSTANCES, "-inf", f"({stale_before}")  # pods long replaced
            pipe.zrangebyscore(redis_keys.INSTANCES, stale_before, "+inf")
            pipe.set(redis_keys.PRESENT, uuid.uuid4().hex, nx=True)  # a new epoch, if the key is missing
            pipe.get(redis_keys.PRESENT)
            _, members, _, epoch = await pipe.execute()
            ids = [i for i in (self._decoded(redis_keys.INSTANCES, bytes.decode, m) for m in members) if i]
            payloads = await self._client.mget([redis_keys.instance_key(i) for i in ids]) if ids else []
            return ids, payloads, epoch

        ids, payloads, epoch = await self._call("registrations", read)
        # Redis is new or came back empty when its epoch changed: whichever router wrote the new one, every router
        # sees it change (a SET NX alone tells only the router whose SET created the key)
        redis_new, self._epoch = epoch != self._epoch, epoch
        found = {}
        for instance_id, payload in zip(ids, payloads, strict=True):
            registration = None if payload is None else self._decoded(
                redis_keys.instance_key(instance_id), functools.partial(_registration_of, instance_id), payload)
            if registration is not None:
                found[instance_id] = registration
        return found, redis_new

    async def close(self) -> None:
        self._closed = True
        while self._in_flight and time.monotonic() < self._deadline + 0.1:  # the latest deadline of a call in flight
            await asyncio.sleep(0.005)
        await self._client.aclose()

    def _decoded(self, key: str, decode: Callable[[bytes], T], payload: bytes) -> T | None:
        try:
            return decode(payload)
        except Exception as error:  # noqa: BLE001 - DecodeError, UnicodeDecodeError: not a value BEAR wrote
            if self._undecodable.should_log(key):
                logger.warning("Redis key %s holds a value that does not decode (%s: %s): skipped (%d times so far)",
                               key, type(error).__name__, error, self._undecodable.count(key))
            return None

    async def _call(self, operation: str, call: Callable[[], Awaitable[T]], timeout_s: float | None = None) -> T:
        if self._closed:
            raise DependencyUnavailable("redis", SKIPPED, f"{operation}: the router is stopping")
        if time.monotonic() < self._down_until:
            raise DependencyUnavailable("redis", SKIPPED, f"{operation}: Redis failed less than "
                                                          f"{self._retry_after_s:g} s ago")
        timeout_s = timeout_s or self._timeout_s
        if not self._succeeded:
            timeout_s = max(timeout_s, FIRST_CALL_TIMEOUT_S)
        self._in_flight += 1
        self._deadline = max(self._deadline, time.monotonic() + timeout_s)
        try:
            async with asyncio.timeout(timeout_s):  # in this task: nothing is left running after a deadline
                result = await call()
        except TimeoutError:
            self._down_until = time.monotonic() + self._retry_after_s
            raise DependencyUnavailable("redis", "DEADLINE_EXCEEDED", f"{operation} after "
                                                                      f"{timeout_s * 1000:g} ms") from None
        except Exception as error:  # noqa: BLE001 - redis.RedisError, OSError: Redis is unavailable
            self._down_until = time.monotonic() + self._retry_after_s
            raise DependencyUnavailable("redis", redis_failure_code(error),
                                        f"{operation}: {type(error).__name__}: {error}") from None
        finally:
            self._in_flight -= 1
        self._succeeded = True
        return result


def redis_failure_code(error: BaseException) -> str:
    """A Redis client's failure as a gRPC status name, so that metrics and reasons use one vocabulary."""
    import redis.exceptions

    if isinstance(error, (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError,
                          redis.exceptions.NoPermissionError)):
        return "UNAUTHENTICATED"
    if isinstance(error, (redis.exceptions.TimeoutError, TimeoutError)):
        return "DEADLINE_EXCEEDED"
    if isinstance(error, (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError, OSError)):
        return "UNAVAILABLE"
    return "INTERNAL"  # a reply Redis refused (ResponseError: a read-only replica, out of memory, ...)


def _registration_of(instance_id: str, payload: bytes) -> Registration:
    """The registration under `instance_id`'s key (ValueError: it names another instance, or none)."""
    registration = wire.registration_from_bytes(payload)
    if registration.instance_id != instance_id:
        raise ValueError(f"a registration of instance {registration.instance_id!r}")
    return registration
