"""The dispatch recorder on its own: what it keeps, retries and drops when Redis does not take the records."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from opentelemetry import trace
from prometheus_client import CollectorRegistry

from bear.router.decision import DispatchRecord
from bear.router.recorder import DispatchRecorder
from bear.router.signals import DependencyUnavailable
from bear.router.telemetry import RouterMetrics


class Writer:
    def __init__(self) -> None:
        self.down = False
        self.hang = False
        self.written: list[str] = []
        self.timeouts: list[float | None] = []

    async def record_dispatches(self, records: Sequence[DispatchRecord], timeout_s: float | None = None) -> None:
        self.timeouts.append(timeout_s)
        if self.hang:
            await asyncio.Event().wait()
        if self.down:
            raise DependencyUnavailable("redis", "UNAVAILABLE", "ConnectionError: down")
        self.written.extend(r.request_id for r in records)


def record(request_id: str) -> DispatchRecord:
    return DispatchRecord(request_id, "small-0", "m", 1000.0, 10, 20.0, 0.0, 500.0)


def recorder(writer: Writer, **settings: float) -> tuple[DispatchRecorder, CollectorRegistry]:
    registry = CollectorRegistry()
    return DispatchRecorder(writer, trace.NoOpTracer(), RouterMetrics(registry), **settings), registry  # type: ignore[arg-type]


def unrecorded(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("bear_router_unrecorded_dispatches_total", {"reason": reason}) or 0.0


def test_writes_have_the_recorders_own_deadline_not_the_route_paths() -> None:
    writer = Writer()
    records, _ = recorder(writer, write_timeout_s=0.75)

    async def scenario() -> None:
        records.submit(record("a"))
        await records.flush()

    asyncio.run(scenario())
    assert writer.written == ["a"] and writer.timeouts == [0.75]


def test_over_the_limit_while_redis_is_down_the_oldest_records_go_and_the_rest_are_written_when_it_is_back() -> None:
    writer = Writer()
    writer.down = True
    records, registry = recorder(writer, max_pending=3, retry_s=0.05)

    async def scenario() -> None:
        for name in "abcde":
            records.submit(record(name))
            await records.flush()
        writer.down = False
        async with asyncio.timeout(5):
            while len(writer.written) < 3:
                await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert writer.written == ["c", "d", "e"]
    assert unrecorded(registry, "queue-full") == 2 and unrecorded(registry, "redis-unavailable") == 0


def test_records_older_than_the_dispatch_ttl_are_dropped_not_written() -> None:
    writer = Writer()
    writer.down = True
    records, registry = recorder(writer, retry_s=0.05, max_age_s=0.2)

    async def scenario() -> None:
        records.submit(record("old"))
        await records.flush()
        await asyncio.sleep(0.3)
        writer.down = False
        records.submit(record("new"))
        async with asyncio.timeout(5):
            while not writer.written:
                await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert writer.written == ["new"] and unrecorded(registry, "redis-unavailable") == 1


def test_a_write_cut_short_by_close_counts_its_records_as_closed() -> None:
    writer = Writer()
    writer.hang = True
    records, registry = recorder(writer)

    async def scenario() -> None:
        records.submit(record("a"))
        records.submit(record("b"))
        await asyncio.sleep(0.05)  # the writer is inside the hanging write
        await records.close(wait_s=0.05)
        records.submit(record("late"))

    asyncio.run(scenario())
    assert writer.written == [] and unrecorded(registry, "closed") == 3
