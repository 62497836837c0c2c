"""Dispatch records go to Redis off the Route path: queued as the decision is answered, written in batches (one
pipeline per batch, gathering what arrives within 2 ms) by a task of their own.

The estimator polls the dispatches every few tens of milliseconds, so waiting for the write would delay every
answer without making the record visible any sooner. Each record has a `bear.record` span, a child of its decision's
span, that ends when the record is in Redis (or failed): its duration, also in the `record` stage histogram, is how
long the record took to become visible. A Redis that fails loses the batch (counted); a queue over `max_pending`
drops new records (counted) rather than grow without bound.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from opentelemetry import trace

from bear.router.decision import DispatchRecord
from bear.router.signals import DependencyUnavailable
from bear.router.telemetry import RouterMetrics


class DispatchWriter(Protocol):
    async def record_dispatches(self, records: Sequence[DispatchRecord]) -> None: ...


class DispatchRecorder:
    def __init__(self, store: DispatchWriter, tracer: trace.Tracer, metrics: RouterMetrics,
                 max_pending: int = 10_000, max_batch: int = 500, gather_s: float = 0.002) -> None:
        self._store, self._tracer, self._metrics = store, tracer, metrics
        self._max_pending, self._max_batch = max_pending, max_batch
        self._gather_s = gather_s  # after a wake-up, records arriving this soon join the batch
        self._tracing = not isinstance(tracer, trace.NoOpTracer)
        self._pending: deque[tuple[DispatchRecord, trace.Span, float]] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._writing = 0  # records being written now
        self._closed = False  # after close(), a decision that ends late records nothing (Redis is being closed)

    def submit(self, record: DispatchRecord, traced: bool = True) -> None:
        """Queues the record (in the caller's span context: its span is a child of the decision's; none with
        `traced` false, for a record written again)."""
        span = (self._tracer.start_span("bear.record", attributes={"bear.request_id": record.request_id,
                                                                  "bear.instance_id": record.instance_id})
                if self._tracing and traced else trace.INVALID_SPAN)
        if self._closed or len(self._pending) >= self._max_pending:
            self._metrics.unrecorded_dispatches.labels("closed" if self._closed else "queue-full").inc()
            why = "router stopping" if self._closed else "dispatch queue full"
            span.set_attribute("bear.error", why)
            span.set_status(trace.StatusCode.ERROR, why)
            span.end()
            return
        self._pending.append((record, span, time.perf_counter()))
        self._writer().set()

    async def flush(self) -> None:
        """Returns once every record queued so far is written (or failed)."""
        while self._pending or self._writing:
            await asyncio.sleep(0.001)

    async def close(self) -> None:
        """Writes what is queued (briefly), then stops the writer; later records are dropped (counted)."""
        self._closed = True
        try:
            await asyncio.wait_for(self.flush(), 1.0)
        except TimeoutError:
            pass
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

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
                batch = [self._pending.popleft() for _ in range(min(len(self._pending), self._max_batch))]
                self._writing = len(batch)
                try:
                    await self._write(batch)
                finally:
                    self._writing = 0

    async def _write(self, batch: list[tuple[DispatchRecord, trace.Span, float]]) -> None:
        error = None
        try:
            await self._store.record_dispatches([record for record, _, _ in batch])
        except DependencyUnavailable as failure:
            error = failure
            self._metrics.dependency_failed("redis", failure.code)
            self._metrics.unrecorded_dispatches.labels("redis-unavailable").inc(len(batch))
        written_at = time.perf_counter()
        stage = self._metrics.stage("record")
        for _, span, queued_at in batch:
            stage.observe(written_at - queued_at)
            if error is not None:
                span.set_attribute("bear.error", str(error))
                span.set_status(trace.StatusCode.ERROR, str(error))
            span.end()
