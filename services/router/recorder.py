"""Dispatch records go to Redis off the Route path: queued as the decision is answered, written in batches (one
pipeline per batch, gathering what arrives within 2 ms) by a task of their own.

The estimator polls the dispatches every few tens of milliseconds, so waiting for the write would delay every
answer without making the record visible any sooner. Being off the path, a write has a deadline of its own
(`write_timeout_s`, 1 s), not the Route path's short one: a loaded host or a busy Redis delays a record rather than
loses it. A batch that fails anyway (Redis down, or left alone for a moment after another call failed) is kept and
tried again after `retry_s`, so that an outage delays the records decided during it rather than drops them: the
estimator needs them for the requests still queued or running, another replica for their outcomes. Each record has
a `bear.record` span, a child of its decision's span, that ends when the record is in Redis (or dropped): its
duration, also in the `record` stage histogram, is how long the record took to become visible. Records are dropped
(counted by reason, logged) only when the queue is over `max_pending` (the oldest go: the newest matter most to
the estimator), once older than the dispatch TTL (they would have expired in Redis by now), or at close.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from opentelemetry import trace

from bear.common.log_throttle import LogThrottle
from bear.common.redis_keys import DISPATCH_TTL_S
from bear.router.decision import DispatchRecord
from bear.router.signals import DependencyUnavailable
from bear.router.telemetry import RouterMetrics

logger = logging.getLogger("bear.router")


class DispatchWriter(Protocol):
    async def record_dispatches(self, records: Sequence[DispatchRecord], timeout_s: float | None = None) -> None: ...


@dataclass(slots=True)
class _Pending:
    record: DispatchRecord
    span: trace.Span
    queued_at: float  # perf_counter
    number: int  # 1, 2, ... in the order queued
    failed: bool = False  # a write of it has failed


class DispatchRecorder:
    def __init__(self, store: DispatchWriter, tracer: trace.Tracer, metrics: RouterMetrics,
                 max_pending: int = 10_000, max_batch: int = 500, gather_s: float = 0.002,
                 write_timeout_s: float = 1.0, retry_s: float = 0.5, max_age_s: float = DISPATCH_TTL_S) -> None:
        self._store, self._tracer, self._metrics = store, tracer, metrics
        self._max_pending, self._max_batch = max_pending, max_batch
        self._gather_s = gather_s  # after a wake-up, records arriving this soon join the batch
        self._write_timeout_s, self._retry_s, self._max_age_s = write_timeout_s, retry_s, max_age_s
        self._tracing = not isinstance(tracer, trace.NoOpTracer)
        self._pending: deque[_Pending] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._writing = 0  # records being written now
        self._queued = 0  # records queued so far (the latest one's number)
        self._tried = 0  # every record up to this number has been written, or tried at least once
        self._closed = False  # after close(), a decision that ends late records nothing (Redis is being closed)
        self._failures = LogThrottle()

    def submit(self, record: DispatchRecord, traced: bool = True) -> None:
        """Queues the record (in the caller's span context: its span is a child of the decision's; none with
        `traced` false, for a record written again)."""
        span = (self._tracer.start_span("bear.record", attributes={"bear.request_id": record.request_id,
                                                                  "bear.instance_id": record.instance_id})
                if self._tracing and traced else trace.INVALID_SPAN)
        if self._closed:
            self._drop([_Pending(record, span, time.perf_counter(), 0)], "closed", "router stopping")
            return
        if len(self._pending) >= self._max_pending:
            self._drop([self._pending.popleft()], "queue-full", "dispatch queue full")
        self._queued += 1
        self._pending.append(_Pending(record, span, time.perf_counter(), self._queued))
        self._writer().set()

    async def flush(self) -> None:
        """Returns once every record queued so far is written, or has been tried once (a failed one is tried again
        later)."""
        target = self._queued
        if self._pending and not self._closed:
            self._writer().set()  # records left by a write cut short in another event loop
        while self._tried < target and (self._pending or self._writing):
            await asyncio.sleep(0.001)

    async def close(self, wait_s: float = 1.0) -> None:
        """Writes what is queued (for at most `wait_s`), then stops the writer and drops what is left (counted);
        later records are dropped too."""
        self._closed = True
        try:
            async with asyncio.timeout(wait_s):
                while self._pending or self._writing:
                    await asyncio.sleep(0.001)
        except TimeoutError:
            pass
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        left = list(self._pending)
        self._pending.clear()
        self._drop([p for p in left if p.failed], "redis-unavailable", "not written before the router stopped")
        self._drop([p for p in left if not p.failed], "closed", "router stopping")

    def _writer(self) -> asyncio.Event:
        """The writer of the running loop (started on first use; a new loop gets a new one)."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(self._wake), name="bear-dispatch-recorder")
        assert self._wake is not None
        return self._wake

    async def _run(self, wake: asyncio.Event) -> None:
        while True:
            await wake.wait()
            await asyncio.sleep(self._gather_s)
            wake.clear()
            while self._pending:
                self._drop_expired()
                batch = [self._pending.popleft() for _ in range(min(len(self._pending), self._max_batch))]
                if not batch:
                    break
                self._writing = len(batch)
                try:
                    written = await self._write(batch)
                except BaseException:  # cancelled mid-write (the loop or the router closing): kept for later
                    self._pending.extendleft(reversed(batch))
                    raise
                finally:
                    self._writing = 0
                self._tried = max(self._tried, batch[-1].number)
                if not written:
                    self._pending.extendleft(reversed(batch))
                    excess = max(len(self._pending) - self._max_pending, 0)
                    self._drop([self._pending.popleft() for _ in range(excess)], "queue-full", "dispatch queue full")
                    await asyncio.sleep(self._retry_s)

    async def _write(self, batch: list[_Pending]) -> bool:
        """Writes the batch; False if Redis failed (the records are marked, their spans left open)."""
        try:
            await self._store.record_dispatches([p.record for p in batch], self._write_timeout_s)
        except DependencyUnavailable as failure:
            self._metrics.dependency_failed("redis", failure.code)
            for pending in batch:
                pending.failed = True
            if self._failures.should_log("write"):
                logger.warning("dispatch records not written to Redis (%s); kept and tried again every %g s "
                               "(%d failed writes so far)", failure, self._retry_s, self._failures.count("write"))
            return False
        if self._failures.count("write"):
            logger.info("dispatch records written to Redis again (after %d failed writes)", self._failures.count("write"))
            self._failures.ok("write")
        written_at = time.perf_counter()
        stage = self._metrics.stage("record")
        for pending in batch:
            stage.observe(written_at - pending.queued_at)
            pending.span.end()
        return True

    def _drop_expired(self) -> None:
        expired_before = time.perf_counter() - self._max_age_s
        expired = []
        while self._pending and self._pending[0].queued_at < expired_before:
            expired.append(self._pending.popleft())
        self._drop(expired, "redis-unavailable", "older than the dispatch TTL before Redis took it")

    def _drop(self, dropped: Sequence[_Pending], reason: str, why: str) -> None:
        if not dropped:
            return
        self._metrics.unrecorded_dispatches.labels(reason).inc(len(dropped))
        for pending in dropped:
            pending.span.set_attribute("bear.error", why)
            pending.span.set_status(trace.StatusCode.ERROR, why)
            pending.span.end()
        if reason != "closed" and self._failures.should_log(reason):
            logger.warning("%d dispatch record(s) dropped: %s (%d times so far); the estimator will not see them",
                           len(dropped), why, self._failures.count(reason))
