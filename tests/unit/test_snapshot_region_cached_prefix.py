"""The snapshot region's cached-prefix figures (version 2): written for preempted waiting requests only, read back as
written, absent from version-1 regions (older plugins), which the reader still reads; and their wire form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from bear.snapshotter.reader import RegionReader, RegionSnapshot
from bear.snapshotter.region import HEADER, RECORD_HEAD, ROW, ROW_V1, VERSION, Capacities, Layout
from bear.snapshotter.wire import request_to_proto
from tests.region_builders import FakeEngine, FakeRequest, decoding, small_capacities, waiting


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "region")


class Figures:
    """A stand-in for `cached_blocks.evictable_prefixes` bound to an engine: fixed figures per request id, and the
    calls it got."""

    def __init__(self, **figures: tuple[int, int, int]):
        self.figures = figures
        self.calls: list[list[str]] = []

    def __call__(self, requests: Sequence[FakeRequest]) -> list[tuple[int, int, int]]:
        self.calls.append([r.request_id for r in requests])
        return [self.figures[r.request_id] for r in requests]


def preempted(request_id: str, prompt: int = 100, outputs: int = 0, **fields: object) -> FakeRequest:
    return waiting(request_id, prompt, num_preemptions=1, _output_token_ids=[7] * outputs, **fields)


def cached_prefix(snapshot: RegionSnapshot) -> dict[str, tuple[int | None, int | None, int | None]]:
    return {r.request_id: (r.num_cached_tokens, r.num_evictable_blocks, r.num_free_blocks_ahead)
            for r in snapshot.running + snapshot.waiting}


def test_only_preempted_waiting_requests_without_computed_tokens_report_their_cached_prefix(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    figures = Figures(p1=(96, 2, 5), p2=(0, 0, 0), p3=(130, 8, 0))
    running = [decoding("r", num_preemptions=3)]  # preempted before, running again
    queue = [waiting("fresh"), preempted("p1"), preempted("p2", prompt=40),
             preempted("holding", num_computed_tokens=32),  # holds KV while it waits (kv_holding_waiting)
             preempted("p3", prompt=120, outputs=11)]
    engine.write_state(running, queue, num_free_blocks=20, cached_prefixes=figures)
    snapshot = RegionReader(path).read()
    assert snapshot is not None and snapshot.valid
    assert cached_prefix(snapshot) == {"r": (None,) * 3, "fresh": (None,) * 3, "p1": (96, 2, 5), "p2": (0, 0, 0),
                                       "holding": (None,) * 3, "p3": (130, 8, 0)}
    assert figures.calls == [["p1", "p2", "p3"]]  # one call (one walk of vLLM's free queue) for all of them
    assert [r.num_preemptions for r in snapshot.waiting] == [0, 1, 1, 1, 1]


def test_without_prefix_caching_nothing_is_reported_and_nothing_asked(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    engine.write_state([], [preempted("p1")])
    snapshot = RegionReader(path).read()
    assert snapshot is not None and cached_prefix(snapshot) == {"p1": (None,) * 3}


def test_a_cut_queue_reports_the_rows_it_holds(path: str) -> None:
    engine = FakeEngine(path, small_capacities(max_rows=2))
    figures = Figures(p0=(16, 1, 0), p1=(32, 2, 1), p2=(48, 3, 2))
    engine.write_state([], [preempted("p0"), preempted("p1"), preempted("p2")], cached_prefixes=figures)
    snapshot = RegionReader(path).read()
    assert snapshot is not None and snapshot.truncated
    assert cached_prefix(snapshot) == {"p0": (16, 1, 0), "p1": (32, 2, 1)} and figures.calls == [["p0", "p1"]]


def test_step_entries_are_read_as_before(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    p1 = preempted("p1", prompt=40)
    engine.write_state([decoding("a")], [p1], cached_prefixes=Figures(p1=(32, 2, 0)))
    p1.num_computed_tokens = 32  # resumed from its cached blocks
    engine.schedule({"a": 1, "p1": 8}, from_state=1)
    snapshot = RegionReader(path).read()
    assert snapshot is not None
    assert [(e.request_id, e.num_scheduled_tokens, e.num_computed_tokens) for e in snapshot.in_flight[0].entries
            ] == [("a", 1, 102), ("p1", 8, 32)]


def test_a_version_1_region_reads_as_before_with_no_cached_prefix(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    engine.write_state([decoding("a", outputs=5)], [preempted("p1", outputs=4), waiting("w")], num_free_blocks=77,
                       cached_prefixes=Figures(p1=(96, 6, 3)))
    engine.finish_step(engine.schedule({"a": 1}, from_state=1, at_s=5.0), 0.25)
    engine.schedule({"a": 1}, from_state=1, at_s=6.0)
    current = RegionReader(path).read()
    assert current is not None and current.waiting[0].num_cached_tokens == 96
    _rewrite_as_version_1(path)
    old = RegionReader(path).read()
    assert old is not None
    unreported = {"num_cached_tokens": None, "num_evictable_blocks": None, "num_free_blocks_ahead": None}
    assert old.running == current.running and old.waiting[1] == current.waiting[1]
    assert old.waiting[0] == replace(current.waiting[0], **unreported)
    assert (old.in_flight, old.executed, old.num_free_blocks, old.engine) == (
        current.in_flight, current.executed, current.num_free_blocks, current.engine)


def test_the_wire_carries_the_figures_only_when_reported(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    engine.write_state([], [waiting("w"), preempted("p1"), preempted("p2")],
                       cached_prefixes=Figures(p1=(96, 6, 3), p2=(0, 0, 0)))
    snapshot = RegionReader(path).read()
    assert snapshot is not None
    w, p1, p2 = (request_to_proto(r) for r in snapshot.waiting)
    assert not any(w.HasField(f) for f in ("num_cached_tokens", "num_evictable_blocks", "num_free_blocks_ahead"))
    assert (p1.num_cached_tokens, p1.num_evictable_blocks, p1.num_free_blocks_ahead) == (96, 6, 3)
    assert all(p2.HasField(f) for f in ("num_cached_tokens", "num_evictable_blocks", "num_free_blocks_ahead"))
    assert (p2.num_cached_tokens, p2.num_evictable_blocks, p2.num_free_blocks_ahead) == (0, 0, 0)


def _rewrite_as_version_1(path: str) -> None:
    """Replaces the region with what a version-1 writer would have written for the same state and steps: the same
    header (but for version and size), engine, state and slots, and every row (state and step entries) cut to the
    first six fields."""
    data = Path(path).read_bytes()
    header = list(HEADER.unpack_from(data, 0))
    assert header[1] == VERSION == 2
    max_id_bytes, max_slots, max_rows, max_step_entries, num_ring_steps = header[5:10]
    capacities = Capacities(max_rows, max_step_entries, num_ring_steps, max_slots, max_id_bytes)
    new, old = Layout.of(capacities, version=1), Layout.of(capacities)
    assert new.row is ROW_V1 and old.row is ROW and new.rows_offset == old.rows_offset
    out = bytearray(new.size)
    out[:old.rows_offset] = data[:old.rows_offset]
    header[1], header[4] = 1, new.size
    HEADER.pack_into(out, 0, *header)

    def copy_rows(source: int, target: int, count: int) -> None:
        for i in range(count):
            out[target + i * ROW_V1.size:target + (i + 1) * ROW_V1.size] = (
                data[source + i * ROW.size:source + i * ROW.size + ROW_V1.size])

    copy_rows(old.rows_offset, new.rows_offset, max_rows)
    for step in range(num_ring_steps):
        source, target = old.record_offset(step), new.record_offset(step)
        head = RECORD_HEAD.size + 4 * max_step_entries
        out[target:target + head] = data[source:source + head]
        copy_rows(old.entry_rows_offset(source), new.entry_rows_offset(target), max_step_entries)
    replacement = f"{path}.v1"
    Path(replacement).write_bytes(bytes(out))
    Path(replacement).replace(path)
