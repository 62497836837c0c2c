"""The reading side of the snapshot region (format in `region`): consistent copies, parsed into plain records.

`RegionReader.read()` copies what it needs between two reads of the sequence counter and keeps the copy only if the
counter was even and unchanged (otherwise the copy is discarded and counted as torn, and it tries again). Parsing
happens on the copy, after the check, so a torn copy is never parsed. The reader follows the region across engine
restarts: when the file at the path is replaced or removed it reopens it, or reports it absent.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import time
from dataclasses import dataclass, replace

from bear.common.messages import described

from bear.snapshotter.region import (ENGINE, ENGINE_OFFSET, HEADER, NO_SLOT, NOT_REPORTED, RECORD_ENTRIES_INCOMPLETE,
                                     RECORD_FOLLOWS_STEP, RECORD_HEAD, SLOT_HEAD, SLOT_ID_TRUNCATED, SLOTS_OFFSET,
                                     STATE, STATE_OFFSET, STATE_SLOTS_EXHAUSTED, STATE_TRUNCATED, STATE_VALID,
                                     EngineSettings, Layout, RegionError, alive_at_view, counter_view,
                                     open_region)

MAX_ATTEMPTS = 64  # copies tried per read() before giving up until the next one
REOPEN_CHECK_S = 0.5  # how often an unchanged region's path is checked for a newer file


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One resident request as vLLM's scheduler held it."""

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    arrival_time_s: float
    num_computed_tokens: int
    num_output_tokens: int
    num_allocated_blocks: int
    num_output_placeholders: int
    num_preemptions: int
    id_truncated: bool = False
    # A preempted request waiting to resume, prefix caching on (`cached_blocks`): its prefix tokens the cache holds,
    # how many of those blocks are in the free queue and how many free blocks precede the first of them. None: not
    # reported (other requests, engines without prefix caching, version-1 regions).
    num_cached_tokens: int | None = None
    num_evictable_blocks: int | None = None
    num_free_blocks_ahead: int | None = None


@dataclass(frozen=True, slots=True)
class StepEntryRecord:
    """One request's share of a step."""

    request_id: str
    num_prompt_tokens: int
    num_scheduled_tokens: int
    num_computed_tokens: int  # before the step
    arrival_time_s: float = 0.0  # when the request reached the engine (vLLM's arrival_time), from its slot


@dataclass(frozen=True, slots=True)
class StepRecord:
    step_index: int
    scheduled_at_s: float
    execution_started_at_s: float  # 0: still waiting behind another step in flight
    duration_s: float  # 0: in flight
    entries: tuple[StepEntryRecord, ...]
    complete: bool  # False: more requests than entries, or one without a slot (not usable for calibration)
    follows_step: bool = False  # scheduled straight after the previous step's output (RECORD_FOLLOWS_STEP)
    # Executed steps: the engine's own work after this step before the next began executing (applying and sending
    # its output, reading new requests, scheduling), when the next followed it straight on; else 0. Async
    # scheduling does that work while the next step executes: 0 there.
    overhead_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RegionSnapshot:
    """One consistent read of the region."""

    sequence_number: int  # the write counter: increases with every write, across engine restarts too
    writer_pid: int
    created_at_s: float
    engine: EngineSettings
    valid: bool  # False: the last state write failed half-way; running/waiting are empty
    truncated: bool  # more residents than rows: `waiting` is the head of the queue
    slots_exhausted: bool
    written_at_s: float
    next_step_index: int  # the first step scheduled after this state (async: the step before it may be in flight)
    num_free_blocks: int
    num_running: int  # as the engine counts them (more than len(running) only if truncated)
    num_waiting: int
    running: tuple[RequestRecord, ...]
    waiting: tuple[RequestRecord, ...]
    num_scheduled_steps: int
    num_processed_steps: int
    num_errors: int  # exceptions the plugin contained
    num_writes: int
    in_flight: tuple[StepRecord, ...]  # scheduled, not yet processed; the first one is executing
    # Executed steps this reader had not returned before, oldest first; the latest one only once the next step is
    # scheduled (its overhead_s) or the engine is idle.
    executed: tuple[StepRecord, ...]
    num_missed_steps: int  # executed steps that left the ring before this reader could return them


class RegionReader:
    """Reads one region by path. Not thread-safe: one reader per thread."""

    def __init__(self, path: str):
        self.path = path
        self._map: mmap.mmap | None = None
        self._counter: memoryview | None = None
        self._alive_at: memoryview | None = None
        self._layout: Layout | None = None
        self._inode = 0
        self._last_sequence = -1
        self._next_executed = 0  # first executed step index not yet returned
        self._checked_at = 0.0
        self.num_reads = 0  # accepted copies
        self.num_torn = 0  # copies discarded because a write overlapped them
        self.num_busy = 0  # counter found odd (a write in progress)
        self.num_gave_up = 0  # read() calls that found no quiet moment in MAX_ATTEMPTS tries

    @property
    def attached(self) -> bool:
        return self._map is not None

    def read(self, changed_only: bool = True) -> RegionSnapshot | None:
        """The region's state if it changed since the last accepted read (or in any case, if not `changed_only`);
        None if unchanged, absent or busy.

        Raises RegionError if the file at the path is not a region this reader understands, cannot be read, or holds
        a state that contradicts itself (that state is then passed over: the next read waits for another write).
        """
        try:
            return self._read(changed_only)
        except RegionError:
            raise
        except (OSError, ValueError, MemoryError, struct.error, OverflowError) as error:
            raise RegionError(f"{self.path}: {described(error)}") from error

    def _read(self, changed_only: bool) -> RegionSnapshot | None:
        if not self._attach():
            return None
        mapping, layout = self._map, self._layout
        assert mapping is not None and layout is not None
        if mapping.size() < layout.size:  # cut short in place: touching the mapping past its end would kill us
            self.close()
            raise RegionError(f"{self.path}: the file shrank below its region's {layout.size} bytes")
        counter = self._counter
        assert counter is not None
        for _ in range(MAX_ATTEMPTS):
            before = counter[0]
            if before & 1:
                self.num_busy += 1
                time.sleep(0)
                continue
            if changed_only and before == self._last_sequence:
                return None
            copy = self._copy(mapping, layout)
            if counter[0] != before:
                self.num_torn += 1
                continue
            self._last_sequence = before
            self.num_reads += 1
            return self._parse(before, copy, layout)
        self.num_gave_up += 1
        return None

    def alive_at_s(self) -> float:
        """The engine's latest heartbeat (Unix seconds); 0 if no region is attached."""
        return self._alive_at[0] if self._alive_at is not None else 0.0

    def close(self) -> None:
        for view in (self._counter, self._alive_at):
            if view is not None:
                view.release()
        if self._map is not None:
            self._map.close()
        self._map, self._layout, self._counter, self._alive_at = None, None, None, None

    # Attaching ----------------------------------------------------------------------------------------------------

    def _attach(self) -> bool:
        """Opens the region if needed, and reopens it when the path names a newer file (an engine restart)."""
        now = time.monotonic()
        if self._map is not None and now - self._checked_at < REOPEN_CHECK_S:
            return True
        self._checked_at = now
        try:
            inode = os.stat(self.path).st_ino
        except FileNotFoundError:
            self.close()
            return False
        if self._map is not None and inode == self._inode:
            return True
        self.close()
        try:
            self._map, self._layout, self._inode = open_region(self.path)
        except FileNotFoundError:
            return False
        self._counter = counter_view(self._map)
        self._alive_at = alive_at_view(self._map)
        self._last_sequence, self._next_executed = -1, 0
        return True

    # Copying (between the two counter reads: bytes only, no parsing) ----------------------------------------------

    def _copy(self, mapping: mmap.mmap, layout: Layout) -> tuple[bytes, bytes, bytes, bytes, list[bytes], int]:
        header = mapping[:HEADER.size]
        fixed = mapping[ENGINE_OFFSET:STATE_OFFSET + STATE.size]
        _, _, _, _, num_running_rows, num_waiting_rows, num_slots_used, _, _, num_scheduled, num_processed, *_ = (
            STATE.unpack_from(fixed, STATE_OFFSET - ENGINE_OFFSET))
        num_rows = min(num_running_rows + num_waiting_rows, layout.capacities.max_rows)
        rows = mapping[layout.rows_offset:layout.rows_offset + num_rows * layout.row.size]
        num_slots = min(num_slots_used, layout.capacities.max_slots)
        slots = mapping[SLOTS_OFFSET:SLOTS_OFFSET + num_slots * layout.slot_size]
        first = max(min(self._next_executed, num_processed), num_scheduled - layout.capacities.num_ring_steps, 0)
        last = min(num_scheduled, first + layout.capacities.num_ring_steps)
        records = [mapping[offset:offset + layout.record_size]
                   for offset in map(layout.record_offset, range(first, last))]
        return header, fixed, rows, slots, records, first

    # Parsing (on the accepted copy) -------------------------------------------------------------------------------

    def _parse(self, sequence: int, copy: tuple[bytes, bytes, bytes, bytes, list[bytes], int],
               layout: Layout) -> RegionSnapshot:
        header, fixed, rows, slots, records, first = copy
        _, _, _, _, _, _, _, _, _, _, writer_pid, created_at_s, _ = HEADER.unpack(header)
        engine = _engine(fixed)
        (flags, num_free_blocks, num_running, num_waiting, num_running_rows, num_waiting_rows, _, written_at_s,
         next_step_index, num_scheduled, num_processed, num_errors, num_writes) = STATE.unpack_from(
            fixed, STATE_OFFSET - ENGINE_OFFSET)
        problem = _state_problem(num_running, num_waiting, num_running_rows, num_waiting_rows, written_at_s,
                                 num_scheduled, num_processed)
        if problem:
            raise RegionError(f"{self.path}: a state that contradicts itself ({problem})")
        slot_table = _SlotTable(slots, layout.slot_size)
        valid = bool(flags & STATE_VALID)
        residents = [slot_table.resident(row) for row in layout.row.iter_unpack(rows)] if valid else []
        steps = [_step(record, index, slot_table, layout) for index, record in enumerate(records, start=first)]
        steps = [step for step in steps if step is not None]
        # The latest executed step waits for the next to be scheduled (which tells its overhead) while the engine
        # has requests; once the engine is idle, it comes without.
        ready = num_processed - (num_scheduled == num_processed and num_running + num_waiting > 0)
        executed = tuple(_with_overhead(s, steps[i + 1] if i + 1 < len(steps) else None)
                         for i, s in enumerate(steps) if self._next_executed <= s.step_index < ready)
        missed = max(0, first - self._next_executed) if self._next_executed < ready else 0
        self._next_executed = max(self._next_executed, ready)
        return RegionSnapshot(
            sequence_number=sequence // 2,
            writer_pid=writer_pid,
            created_at_s=created_at_s,
            engine=engine,
            valid=valid,
            truncated=bool(flags & STATE_TRUNCATED),
            slots_exhausted=bool(flags & STATE_SLOTS_EXHAUSTED),
            written_at_s=written_at_s,
            next_step_index=next_step_index,
            num_free_blocks=num_free_blocks,
            num_running=num_running,
            num_waiting=num_waiting,
            running=tuple(residents[:num_running_rows]),
            waiting=tuple(residents[num_running_rows:num_running_rows + num_waiting_rows]),
            num_scheduled_steps=num_scheduled,
            num_processed_steps=num_processed,
            num_errors=num_errors,
            num_writes=num_writes,
            in_flight=tuple(s for s in steps if s.step_index >= num_processed),
            executed=executed,
            num_missed_steps=missed,
        )


class _SlotTable:
    """Decodes slots of a copied slot table."""

    def __init__(self, slots: bytes, slot_size: int):
        self._slots = slots
        self._slot_size = slot_size
        self._decoded: dict[int, tuple[str, int, int, float, bool]] = {}

    def get(self, slot: int) -> tuple[str, int, int, float, bool] | None:
        """(request id, prompt tokens, max tokens, arrival time, id truncated), or None for NO_SLOT / out of range."""
        decoded = self._decoded.get(slot)
        if decoded is None:
            offset = slot * self._slot_size
            if slot == NO_SLOT or offset + self._slot_size > len(self._slots):
                return None
            id_len, slot_flags, num_prompt_tokens, max_tokens, arrival_time_s = SLOT_HEAD.unpack_from(self._slots,
                                                                                                      offset)
            start = offset + SLOT_HEAD.size
            request_id = self._slots[start:start + min(id_len, self._slot_size - SLOT_HEAD.size)].decode("utf-8",
                                                                                                        "replace")
            truncated = bool(slot_flags & SLOT_ID_TRUNCATED)
            if truncated:  # ids that differ only past the cut stay apart: a request keeps its slot while resident
                request_id = f"{request_id}#{slot}"
            decoded = (request_id, num_prompt_tokens, max_tokens, arrival_time_s, truncated)
            self._decoded[slot] = decoded
        return decoded

    def resident(self, row: tuple[int, ...]) -> RequestRecord:
        """A row of either version: 9 fields, or version 1's first 6."""
        slot, computed, outputs, blocks, placeholders, preemptions, *cached_prefix = row
        fixed = self.get(slot)
        if fixed is None:
            raise RegionError(f"a row names slot {slot}, which the region does not hold")
        request_id, num_prompt_tokens, max_tokens, arrival_time_s, id_truncated = fixed
        cached, evictable, ahead = cached_prefix if cached_prefix and cached_prefix[0] != NOT_REPORTED else (None,) * 3
        return RequestRecord(request_id, num_prompt_tokens, max_tokens, arrival_time_s, computed, outputs, blocks,
                             placeholders, preemptions, id_truncated, cached, evictable, ahead)


def _state_problem(num_running: int, num_waiting: int, num_running_rows: int, num_waiting_rows: int,
                   written_at_s: float, num_scheduled: int, num_processed: int) -> str:
    """What makes a state impossible for the plugin to have written ("" if nothing)."""
    if num_running_rows > num_running or num_waiting_rows > num_waiting:
        return (f"{num_running_rows} running and {num_waiting_rows} waiting rows for {num_running} running and "
                f"{num_waiting} waiting requests")
    if not math.isfinite(written_at_s):
        return f"written at {written_at_s}"
    if num_processed > num_scheduled:
        return f"{num_processed} steps processed of {num_scheduled} scheduled"
    return ""


def _engine(fixed: bytes) -> EngineSettings:
    (budget, max_num_seqs, block_size, num_gpu_blocks, threshold, max_model_len, watermark, chunked, reserve_full_isl,
     is_async, prefix_caching, model_len, model) = ENGINE.unpack_from(fixed, 0)
    return EngineSettings(budget, max_num_seqs, block_size, num_gpu_blocks, threshold, max_model_len, watermark,
                          bool(chunked), bool(reserve_full_isl), bool(is_async),
                          model[:model_len].decode("utf-8", "replace"), bool(prefix_caching))


def _with_overhead(step: StepRecord, following: StepRecord | None) -> StepRecord:
    if (following is None or following.step_index != step.step_index + 1 or not following.follows_step
            or following.execution_started_at_s <= 0 or step.execution_started_at_s <= 0):
        return step
    end_s = step.execution_started_at_s + step.duration_s
    return replace(step, overhead_s=max(0.0, following.execution_started_at_s - end_s))


def _step(record: bytes, step_index: int, slot_table: _SlotTable, layout: Layout) -> StepRecord | None:
    """The step record, or None if the ring slot does not hold step `step_index` (never written, or a write of it
    failed before its head)."""
    stored_index, scheduled_at_s, started_at_s, duration_s, num_entries, record_flags = RECORD_HEAD.unpack_from(record)
    if stored_index != step_index or num_entries > layout.capacities.max_step_entries:
        return None
    scheduled = struct.unpack_from(f"<{num_entries}I", record, RECORD_HEAD.size)
    first_row = layout.entry_rows_offset(0)
    rows = layout.row.iter_unpack(record[first_row:first_row + num_entries * layout.row.size])
    entries = []
    complete = not record_flags & RECORD_ENTRIES_INCOMPLETE
    for num_scheduled_tokens, (slot, num_computed_tokens, *_) in zip(scheduled, rows):
        fixed = slot_table.get(slot)
        if fixed is None:
            complete = False
            continue
        entries.append(StepEntryRecord(fixed[0], fixed[1], num_scheduled_tokens, num_computed_tokens, fixed[3]))
    return StepRecord(step_index, scheduled_at_s, started_at_s, duration_s, tuple(entries), complete,
                      bool(record_flags & RECORD_FOLLOWS_STEP))
