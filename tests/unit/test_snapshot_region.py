"""The snapshot region: what the writer puts in is what the reader gets out, and degraded cases say so."""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bear.estimator.request_ids import router_request_id
from bear.router.query import MAX_REQUEST_ID_BYTES
from bear.snapshotter.config import PluginConfig
from bear.snapshotter.reader import RegionReader
from bear.snapshotter.region import (HEADER, SEQUENCE, SEQUENCE_OFFSET, Capacities, Layout, RegionError,
                                     open_region)
from tests.region_builders import ENGINE, FakeEngine, decoding, small_capacities, waiting


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "region")


def test_state_round_trip(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    running = [decoding("a", prompt=900, outputs=4, num_preemptions=1, arrival_time=1.75e9),
               decoding("b", prompt=33, outputs=1, max_tokens=7)]
    queue = [waiting("c", prompt=12), waiting("d", prompt=5000, num_preemptions=2, _output_token_ids=[1, 2])]
    engine.write_state(running, queue, num_free_blocks=123, written_at_s=1.8e9 + 0.25)
    snapshot = RegionReader(path).read()
    assert snapshot is not None and snapshot.valid and not snapshot.truncated
    assert snapshot.engine == ENGINE
    assert (snapshot.num_free_blocks, snapshot.written_at_s, snapshot.num_running, snapshot.num_waiting) == (
        123, 1.8e9 + 0.25, 2, 2)
    got = [(r.request_id, r.num_prompt_tokens, r.num_computed_tokens, r.num_output_tokens, r.num_allocated_blocks,
            r.max_tokens, r.num_preemptions, r.arrival_time_s) for r in snapshot.running + snapshot.waiting]
    assert got == [("a", 900, 903, 4, 57, 50, 1, 1.75e9), ("b", 33, 33, 1, 3, 7, 0, 1.7e9),
                   ("c", 12, 0, 0, 0, 50, 0, 1.7e9), ("d", 5000, 0, 2, 0, 50, 2, 1.7e9)]


def test_an_unchanged_region_reads_as_none_and_every_write_as_new(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    reader = RegionReader(path)
    first = reader.read()
    assert first is not None and reader.read() is None
    engine.write_state([decoding("a")])
    second = reader.read()
    assert second is not None and second.sequence_number > first.sequence_number


def test_placeholders_are_recorded_only_under_async_scheduling(path: str, tmp_path: Path) -> None:
    request = decoding("a", num_output_placeholders=1)
    for with_placeholders, expected in ((True, 1), (False, 0)):
        region = str(tmp_path / f"region-{with_placeholders}")
        FakeEngine(region, small_capacities(), with_placeholders=with_placeholders).write_state([request])
        snapshot = RegionReader(region).read()
        assert snapshot is not None and snapshot.running[0].num_output_placeholders == expected


def test_a_state_larger_than_the_region_keeps_running_requests_and_the_head_of_the_queue(path: str) -> None:
    engine = FakeEngine(path, small_capacities(max_rows=4))
    engine.write_state([decoding("r0"), decoding("r1")], [waiting(f"w{i}") for i in range(5)])
    snapshot = RegionReader(path).read()
    assert snapshot is not None and snapshot.valid and snapshot.truncated
    assert [r.request_id for r in snapshot.running] == ["r0", "r1"]
    assert [r.request_id for r in snapshot.waiting] == ["w0", "w1"]
    assert (snapshot.num_running, snapshot.num_waiting) == (2, 5)


def test_running_requests_beyond_the_region_leave_out_the_whole_queue(path: str) -> None:
    engine = FakeEngine(path, small_capacities(max_rows=2))
    engine.write_state([decoding("r0"), decoding("r1"), decoding("r2")], [waiting("w0")])
    snapshot = RegionReader(path).read()
    assert snapshot is not None and snapshot.truncated
    assert [r.request_id for r in snapshot.running] == ["r0", "r1"] and snapshot.waiting == ()


def test_long_ids_are_cut_and_flagged_and_stay_apart(path: str) -> None:
    engine = FakeEngine(path, small_capacities(max_id_bytes=8))
    engine.write_state([decoding("exactly8"), decoding("much-longer-than-eight"), decoding("much-longer-still")])
    snapshot = RegionReader(path).read()
    assert snapshot is not None
    # Cut at the same 8 bytes, two ids would be one, and the estimator refuses a state whose ids repeat: a cut id
    # carries its slot, which a request keeps while it is resident.
    assert [(r.request_id, r.id_truncated) for r in snapshot.running] == [
        ("exactly8", False), ("much-lon#1", True), ("much-lon#2", True)]
    engine.write_state([decoding("much-longer-still")])
    again = RegionReader(path).read()
    assert again is not None and [r.request_id for r in again.running] == ["much-lon#2"]


def test_the_default_id_room_keeps_vllms_ids_of_the_longest_router_ids(path: str) -> None:
    # vLLM's engine id is the router's request id (X-Request-Id, up to MAX_REQUEST_ID_BYTES) with a prefix and a
    # random suffix; cut, it would match no dispatch record.
    router_id = "r" * MAX_REQUEST_ID_BYTES
    engine_ids = [f"chatcmpl-{router_id}-1a2b3c4d", f"cmpl-{router_id}-123-1a2b3c4d"]
    engine = FakeEngine(path, small_capacities(max_id_bytes=PluginConfig().max_id_bytes))
    engine.write_state([decoding(engine_id) for engine_id in engine_ids])
    snapshot = RegionReader(path).read()
    assert snapshot is not None
    assert [router_request_id(r.request_id) for r in snapshot.running] == [router_id, router_id]


def test_without_free_slots_the_state_stops_at_the_first_request_left_out(path: str) -> None:
    engine = FakeEngine(path, small_capacities(max_rows=4, max_slots=4, num_ring_steps=4))
    engine.write_state([decoding(f"r{i}") for i in range(4)])
    engine.finish("r0", "r1")  # released, but the ring may still name them: not reusable yet
    engine.write_state([decoding("r2"), decoding("r3"), decoding("new")])
    snapshot = RegionReader(path).read()
    assert snapshot is not None and snapshot.valid and snapshot.slots_exhausted and snapshot.truncated
    assert [r.request_id for r in snapshot.running] == ["r2", "r3"]


def test_a_released_slot_is_reused_only_once_the_ring_cannot_name_it(path: str) -> None:
    capacities = small_capacities(max_rows=2, max_slots=2, num_ring_steps=4)
    engine = FakeEngine(path, capacities)
    stay, old, new = decoding("stay"), decoding("old"), waiting("new")
    engine.write_state([stay, old])
    engine.finish_step(engine.schedule({"stay": 1, "old": 1}, from_state=2), 0.01)
    engine.finish("old")  # its slot is free, but step 0's record names it until the ring has moved on
    reader = RegionReader(path)
    names_of_step_0 = []
    for _ in range(capacities.num_ring_steps + 3):
        engine.write_state([stay], [new])
        snapshot = reader.read()
        assert snapshot is not None
        if not snapshot.slots_exhausted:
            break
        assert [r.request_id for r in snapshot.waiting] == []
        engine.finish_step(engine.schedule({"stay": 1}, from_state=1), 0.01)
        names_of_step_0 += [[e.request_id for e in s.entries] for s in reader.read().executed if s.step_index == 0]
    assert not snapshot.slots_exhausted and [r.request_id for r in snapshot.waiting] == ["new"]
    assert engine.writer.num_scheduled_steps > capacities.num_ring_steps  # not before the ring moved on
    assert all(names == ["stay", "old"] for names in names_of_step_0)


def test_steps_in_flight_and_executed_steps(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    a, b = decoding("a", prompt=10, outputs=2), waiting("b", prompt=40)
    engine.write_state([a], [b])
    reader = RegionReader(path)
    reader.read()
    b.num_computed_tokens = 16  # a prefix-cache hit found when it was admitted
    index = engine.schedule({"a": 1, "b": 24}, from_state=1, at_s=100.0)
    snapshot = reader.read()
    assert snapshot is not None and snapshot.next_step_index == 0 and snapshot.executed == ()
    (step,) = snapshot.in_flight
    assert (step.step_index, step.scheduled_at_s, step.execution_started_at_s, step.duration_s) == (0, 100.0, 100.0, 0)
    assert [(e.request_id, e.num_prompt_tokens, e.num_scheduled_tokens, e.num_computed_tokens) for e in step.entries
            ] == [("a", 10, 1, 11), ("b", 40, 24, 16)]
    queued = engine.schedule({"a": 1}, at_s=100.5, started_at_s=0.0)  # async: scheduled while step 0 executes
    engine.finish_step(index, 0.75, next_step=(queued, 100.75))
    snapshot = reader.read()
    assert snapshot is not None
    assert [(s.step_index, s.duration_s) for s in snapshot.executed] == [(0, 0.75)]
    assert [(s.step_index, s.execution_started_at_s) for s in snapshot.in_flight] == [(1, 100.75)]
    assert reader.read() is None  # nothing new: executed steps are returned once


def test_entries_copied_from_the_state_equal_entries_looked_up(path: str, tmp_path: Path) -> None:
    running = [decoding(f"r{i}", prompt=10 * i + 1, outputs=i + 1) for i in range(5)]
    entries = []
    for from_state, region in ((5, path), (0, str(tmp_path / "other"))):
        engine = FakeEngine(region, small_capacities())
        engine.write_state(running)
        engine.schedule({r.request_id: 1 for r in running}, from_state=from_state)
        snapshot = RegionReader(region).read()
        assert snapshot is not None
        entries.append(snapshot.in_flight[0].entries)
    assert entries[0] == entries[1] and len(entries[0]) == 5


def test_a_step_cannot_copy_rows_the_state_does_not_hold(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    engine.write_state([decoding("a")])
    with pytest.raises(ValueError, match="running rows"):
        engine.schedule({"a": 1, "b": 1}, from_state=2)


def test_a_reader_that_falls_behind_the_ring_counts_the_steps_it_missed(path: str) -> None:
    engine = FakeEngine(path, small_capacities(num_ring_steps=4))
    engine.write_state([decoding("a")])
    reader = RegionReader(path)
    reader.read()
    for _ in range(10):
        engine.finish_step(engine.schedule({"a": 1}, from_state=1), 0.01)
    snapshot = reader.read()
    assert snapshot is not None  # the latest step waits for the next one (the engine has requests)
    assert [s.step_index for s in snapshot.executed] == [6, 7, 8] and snapshot.num_missed_steps == 6
    engine.finish("a")
    engine.write_state([])
    snapshot = reader.read()
    assert snapshot is not None and [s.step_index for s in snapshot.executed] == [9] and not snapshot.num_missed_steps


def test_a_step_followed_straight_on_carries_the_engines_work_until_the_next_one(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    a = decoding("a")
    engine.write_state([a])
    reader = RegionReader(path)
    reader.read()
    engine.finish_step(engine.schedule({"a": 1}, from_state=1, at_s=100.0), 0.010)
    snapshot = reader.read()
    assert snapshot is not None and snapshot.executed == ()  # its overhead is not known yet
    engine.write_state([a])
    engine.schedule({"a": 1}, from_state=1, at_s=100.0125, follows_step=True)
    snapshot = reader.read()
    assert snapshot is not None and [s.follows_step for s in snapshot.in_flight] == [True]
    (step,) = snapshot.executed
    assert (step.step_index, step.duration_s) == (0, 0.010) and step.overhead_s == pytest.approx(0.0025)
    engine.finish_step(1, 0.010)
    engine.write_state([a])
    engine.schedule({"a": 1}, from_state=1, at_s=100.5)  # after the engine waited for requests: no overhead known
    engine.finish_step(2, 0.010)
    engine.finish("a")
    engine.write_state([])
    snapshot = reader.read()
    assert snapshot is not None
    assert [(s.step_index, s.follows_step, s.overhead_s) for s in snapshot.executed] == [(1, True, 0.0),
                                                                                          (2, False, 0.0)]


def test_a_write_that_fails_half_way_leaves_an_invalid_state_not_a_torn_one(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    engine.write_state([decoding("a"), decoding("b")])
    reader = RegionReader(path)
    reader.read()

    class Broken:
        request_id = "broken"

        def __getattr__(self, name: str) -> object:
            raise RuntimeError("a request that cannot be read")

    engine.requests["broken"] = Broken()  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        engine.writer.write_state([decoding("a"), Broken()], (), engine.blocks, 1, 1.0)  # type: ignore[list-item]
    mapping, _, _ = open_region(path)
    assert SEQUENCE.unpack_from(mapping, SEQUENCE_OFFSET)[0] % 2 == 0
    snapshot = reader.read()
    assert snapshot is not None and not snapshot.valid and snapshot.running == ()
    engine.write_state([decoding("a")])
    snapshot = reader.read()
    assert snapshot is not None and snapshot.valid and [r.request_id for r in snapshot.running] == ["a"]


def test_a_reader_never_accepts_a_copy_taken_during_a_write(path: str) -> None:
    engine = FakeEngine(path, small_capacities())
    engine.write_state([decoding("a")])
    engine.writer._begin()  # a write in progress: the counter is odd
    reader = RegionReader(path)
    assert reader.read() is None and reader.num_busy > 0 and reader.num_gave_up == 1
    engine.writer._end()
    assert reader.read() is not None


def test_the_reader_follows_a_restarted_engine_and_sequence_numbers_keep_growing(path: str,
                                                                                   monkeypatch: pytest.MonkeyPatch
                                                                                   ) -> None:
    monkeypatch.setattr("bear.snapshotter.reader.REOPEN_CHECK_S", 0.0)
    first = FakeEngine(path, small_capacities())
    first.write_state([decoding("before")])
    reader = RegionReader(path)
    before = reader.read()
    first.writer.close()
    assert reader.read() is None and not reader.attached
    second = FakeEngine(path, small_capacities(max_rows=16, max_slots=40))
    second.write_state([decoding("after")])
    after = reader.read()
    assert before is not None and after is not None and reader.attached
    assert [r.request_id for r in after.running] == ["after"]
    assert after.sequence_number > before.sequence_number


def test_the_writer_replaces_a_region_atomically_and_removes_it_on_close(path: str) -> None:
    Path(path).write_bytes(b"not a region")
    engine = FakeEngine(path, small_capacities())
    assert Path(path).stat().st_size == Layout.of(small_capacities()).size
    assert not [name for name in os.listdir(os.path.dirname(path)) if name.endswith(".tmp")]
    engine.writer.close()
    assert not Path(path).exists()


@pytest.mark.parametrize("damage", ["magic", "version", "size", "no rows", "creation time", "slots", "id bytes"])
def test_a_file_that_is_not_a_region_is_refused(path: str, damage: str) -> None:
    FakeEngine(path, small_capacities())
    data = bytearray(Path(path).read_bytes())
    if damage == "magic":
        data[0:4] = b"NOPE"
    elif damage == "version":
        data[4] = 99
    elif damage == "size":
        data = data[:HEADER.size + 10]
    elif damage == "no rows":
        struct.pack_into("<I", data, 32, 0)  # max_rows: Capacities refuses it (a ValueError before)
    elif damage == "creation time":
        struct.pack_into("<d", data, 48, math.nan)  # never equal to itself: the engine looked new at every state
    else:  # capacities past any plugin's: every read would copy what they claim (a sparse file costs nothing)
        struct.pack_into("<I", data, 28 if damage == "slots" else 24, 2**31)
    Path(path).write_bytes(bytes(data))
    with pytest.raises(RegionError):
        RegionReader(path).read()


@pytest.mark.parametrize("bad", [dict(max_rows=0), dict(num_ring_steps=3), dict(max_slots=4, max_rows=8)])
def test_capacities_are_checked(bad: dict[str, int]) -> None:
    values = dict(max_rows=8, max_step_entries=8, num_ring_steps=4, max_slots=32)
    values.update(bad)
    with pytest.raises(ValueError):
        Capacities(**values)


def test_a_fifo_or_a_symlink_loop_at_the_path_is_refused_at_once(path: str) -> None:
    os.mkfifo(path)  # opened for reading, it would wait for a writer (the sidecar's poll loop with it, for ever)
    done = threading.Event()

    def read() -> None:
        with pytest.raises(RegionError, match="not a regular file"):
            RegionReader(path).read()
        done.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(5.0)
    if not done.is_set():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # let the reader go
    assert done.is_set()
    os.remove(path)
    os.symlink(path, path)
    with pytest.raises(RegionError, match="symbolic links"):  # an OSError before
        RegionReader(path).read()


def test_a_region_cut_short_in_place_is_refused_not_a_crash(path: str) -> None:
    # Touching a mapping past the end of its file raises SIGBUS, which kills the process: run it in one of its own.
    script = f"""
import os, sys
from bear.snapshotter.reader import RegionReader
from bear.snapshotter.region import RegionError
from tests.region_builders import FakeEngine, decoding, small_capacities
engine = FakeEngine({path!r}, small_capacities())
engine.write_state([decoding("a")])
reader = RegionReader({path!r})
assert reader.read() is not None
os.truncate({path!r}, 0)
try:
    reader.read()
except RegionError as error:
    print("refused:", error)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "shrank" in done.stdout


@pytest.mark.parametrize("contradiction", [
    dict(num_waiting=0),  # one waiting row for no waiting request
    dict(num_running=1),  # two running rows for one
    dict(written_at_s=math.nan),
    dict(num_processed_steps=2**40),  # past the scheduled steps: calibration would have taken no step ever after
])
def test_a_state_that_contradicts_itself_is_refused_and_the_next_one_read(path: str,
                                                                          contradiction: dict[str, float]) -> None:
    engine = FakeEngine(path, small_capacities())
    engine.write_state([decoding("a"), decoding("b")], [waiting("c")])
    reader = RegionReader(path)
    assert reader.read() is not None
    engine.rewrite_state(**contradiction)
    with pytest.raises(RegionError, match="contradicts itself"):
        reader.read()
    assert reader.read() is None  # passed over, not refused again at every poll
    engine.write_state([decoding("a")])
    snapshot = reader.read()
    assert snapshot is not None and [r.request_id for r in snapshot.running] == ["a"]


@pytest.mark.parametrize("max_num_seqs, waiting_rows", [(16, 4), (64, 1024)])
def test_a_plugins_slots_last_when_whole_batches_finish_every_step(path: str, max_num_seqs: int,
                                                                   waiting_rows: int) -> None:
    """max_tokens=1 traffic: every step admits max_num_seqs new requests and finishes them all. A finished request's
    slot waits out the ring, so the region needs slots for every request the ring may name (QA: with the earlier
    2 × rows + 4 × ring steps, a third of the states left queued requests out and steps were incomplete)."""
    from bear.snapshotter.region import plugin_max_slots

    ring_steps, rows = 16, max_num_seqs + waiting_rows
    slots = plugin_max_slots(rows, max_num_seqs, ring_steps)
    engine = FakeEngine(path, Capacities(rows, max_num_seqs, ring_steps, slots, max_id_bytes=32))
    reader = RegionReader(path)
    states = steps = 0
    for step in range(5 * ring_steps):
        queued = [waiting(f"s{step}-r{i}", prompt=20) for i in range(max_num_seqs + min(waiting_rows, 8))]
        engine.write_state([], queued)
        snapshot = reader.read()
        assert snapshot is not None and not snapshot.slots_exhausted and len(snapshot.waiting) == len(queued)
        assert all(s.complete for s in snapshot.executed)
        steps += len(snapshot.executed)
        batch = queued[:max_num_seqs]
        index = engine.schedule({r.request_id: 20 for r in batch})
        engine.finish_step(index, 0.01)
        engine.finish(*(r.request_id for r in queued))  # the batch finished, the rest were aborted
        states += 1
    assert states == 5 * ring_steps and steps >= 4 * ring_steps
