"""The writing side of the snapshot region (format in `region`): transactions under the sequence counter, the slot
table of request ids, and the per-step hot loops.

Every write is one transaction: the counter goes odd, the sections change, the counter goes even. Inside a transaction
the sections are written in an order that leaves the region consistent if the transaction stops half-way (an exception
the caller contains): the STATE flags lose STATE_VALID before any row changes and regain it last; a ring record's head,
which carries its step index, is written after its entries, and the step counters after the record.

Requests are read through the attributes vLLM's `Request` has (`RequestLike`). The per-step work is written for speed:
one `struct.pack_into` per resident row, and a step's entries copied from the state's rows with one memory copy when
the step scheduled every running request (the common case), instead of being looked up one by one.
"""

from __future__ import annotations

import functools
import os
import struct
from array import array
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence, Sized
from itertools import chain, islice
from typing import Protocol

from bear.snapshotter.region import (ENGINE, ENGINE_OFFSET, MAX_MODEL_NAME_BYTES, NO_SLOT, NOT_REPORTED,
                                     RECORD_ENTRIES_INCOMPLETE, RECORD_FOLLOWS_STEP, RECORD_HEAD, ROW,
                                     ROW_CACHED_PREFIX, ROW_CACHED_PREFIX_OFFSET, SLOT_HEAD, SLOT_ID_TRUNCATED, STATE, STATE_OFFSET,
                                     STATE_SLOTS_EXHAUSTED, STATE_SLOTS_USED_OFFSET, STATE_STEPS_OFFSET,
                                     STATE_TRUNCATED, STATE_VALID, U32, Capacities, EngineSettings, alive_at_view,
                                     counter_view, create_region)

# Fields written on their own: inside STATE and inside a ring record head (see the formats in `region`).
_STEPS = struct.Struct("<QQ")
_ROW_WORDS = ROW.size // 4  # u32 fields of a row, its slot first (array("I"): 4-byte little-endian ints on x86, Arm)
_F64 = struct.Struct("<d")
_EXECUTION_STARTED_AT = 16
_DURATION = 24
_NO_BLOCKS: tuple[()] = ()

# A preempted waiting request's (cached_tokens, num_evictable_blocks, num_free_blocks_ahead), for several requests at
# once (`cached_blocks.evictable_prefixes` bound to the engine's KV cache manager).
CachedPrefixes = Callable[[Sequence["RequestLike"]], Sequence[tuple[int, int, int]]]


@functools.lru_cache(maxsize=None)  # one per entry count, at most max_step_entries
def _u32s(count: int) -> struct.Struct:
    return struct.Struct(f"<{count}I")


class RequestLike(Protocol):
    """What the writer reads from a request (vLLM's `Request` has all of it)."""

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    arrival_time: float
    num_computed_tokens: int
    num_output_placeholders: int
    num_preemptions: int
    _output_token_ids: Sized  # vLLM's list of output tokens (its num_output_tokens is the length)


class SlotTable(dict[str, int]):
    """Request id → slot. A miss assigns a free slot and writes the request's id and fixed fields into it.

    Must be used inside a transaction. A released slot that a step record named is reused only after
    `quarantine_steps` more steps have been recorded, by when the ring holds no record that could name it; one no step
    named (a waiting request aborted before it ran) once the next state is written, which names it no more. When no
    slot is free a miss returns NO_SLOT.
    """

    def __init__(self, writer: RegionWriter, lookup: Callable[[str], RequestLike | None], quarantine_steps: int):
        super().__init__()
        self._writer = writer
        self._lookup = lookup
        self._quarantine_steps = quarantine_steps
        self._num_used = 0
        self._released: deque[tuple[int, int]] = deque()  # (reusable from this many recorded steps on, slot)
        self._released_unnamed: deque[tuple[int, int]] = deque()  # the same, of slots no step record named
        self.named: set[int] = set()  # slots a step record named

    def __missing__(self, request_id: str) -> int:
        request = self._lookup(request_id)
        slot = self._free_slot() if request is not None else NO_SLOT
        if slot != NO_SLOT:
            self._writer.write_slot(slot, request)
            self[request_id] = slot
        return slot

    def release(self, request_ids: Iterable[str], num_recorded_steps: int) -> None:
        """Frees the slots of finished requests (recorded steps may still name them: they wait out the ring)."""
        for request_id in request_ids:
            slot = self.pop(request_id, None)
            if slot is None:
                continue
            if slot in self.named:
                self.named.discard(slot)
                self._released.append((num_recorded_steps + self._quarantine_steps, slot))
            else:
                self._released_unnamed.append((num_recorded_steps + 1, slot))

    @property
    def num_used(self) -> int:
        """Slots below this were assigned at some point; readers need not look above it."""
        return self._num_used

    def _free_slot(self) -> int:
        """A released slot once no record names it, else a never used one (keeping num_used low)."""
        for released in (self._released_unnamed, self._released):
            if released and released[0][0] <= self._writer.num_scheduled_steps:
                return released.popleft()[1]
        if self._num_used < self._writer.capacities.max_slots:
            self._num_used += 1
            return self._num_used - 1
        return NO_SLOT


class RegionWriter:
    """Creates a region and writes it. One writer per region, called from one thread (vLLM's engine loop)."""

    def __init__(self, path: str, capacities: Capacities, lookup: Callable[[str], RequestLike | None],
                 with_placeholders: bool):
        self.path = path
        self.with_placeholders = with_placeholders  # async scheduling: requests carry output placeholders
        self.capacities = capacities
        self._map, self.layout, self._sequence = create_region(path, capacities)
        self._counter = counter_view(self._map)
        self._alive_at = alive_at_view(self._map)
        self.slots = SlotTable(self, lookup, quarantine_steps=capacities.num_ring_steps + 2)
        self.num_scheduled_steps = 0
        self.num_processed_steps = 0
        self.num_errors = 0  # exceptions the caller contained; published with the next state
        self.num_writes = 0
        self.num_running_rows = 0  # running rows of the last state written, if it holds all running requests
        self._slot_flags = 0

    # Transactions -------------------------------------------------------------------------------------------------

    def _begin(self) -> None:
        self._sequence += 1
        self._counter[0] = self._sequence

    def _end(self) -> None:
        self._sequence += 1
        self.num_writes += 1
        self._counter[0] = self._sequence

    def beat(self, now_s: float) -> None:
        """The heartbeat: proof of life for readers while the engine has nothing to write. Any thread."""
        self._alive_at[0] = now_s

    # Sections -----------------------------------------------------------------------------------------------------

    def write_engine(self, engine: EngineSettings) -> None:
        model = engine.model.encode()[:MAX_MODEL_NAME_BYTES]
        self._begin()
        try:
            ENGINE.pack_into(self._map, ENGINE_OFFSET, engine.max_num_batched_tokens, engine.max_num_seqs,
                             engine.block_size, engine.num_gpu_blocks, engine.long_prefill_token_threshold,
                             engine.max_model_len, engine.watermark, engine.enable_chunked_prefill,
                             engine.scheduler_reserve_full_isl, engine.async_scheduling, engine.enable_prefix_caching,
                             len(model), model)
        finally:
            self._end()

    def write_slot(self, slot: int, request: RequestLike) -> None:
        """Called by the slot table inside a transaction."""
        encoded = request.request_id.encode()
        limit = self.capacities.max_id_bytes
        flags = SLOT_ID_TRUNCATED if len(encoded) > limit else 0
        encoded = encoded[:limit]
        offset = self.layout.slot_offset(slot)
        SLOT_HEAD.pack_into(self._map, offset, len(encoded), flags, request.num_prompt_tokens,
                            request.max_tokens or 0, float(request.arrival_time))
        offset += SLOT_HEAD.size
        self._map[offset:offset + len(encoded)] = encoded

    def write_state(self, running: Sequence[RequestLike], waiting: Sequence[Collection[RequestLike]],
                    blocks: Mapping[str, Sized], num_free_blocks: int, written_at_s: float,
                    cached_prefixes: CachedPrefixes | None = None) -> None:
        """Writes the scheduler state: rows for the running requests, then the waiting queues drained in the order
        given, as many as fit. The state precedes step `num_scheduled_steps` (its next_step_index). With
        `cached_prefixes` (prefix caching on), waiting requests preempted and not resumed report what the cache holds
        of them."""
        mapping = self._map
        self.num_running_rows = self._slot_flags = 0
        self._begin()
        try:
            U32.pack_into(mapping, STATE_OFFSET, 0)  # not valid until the rows are complete
            capacity = self.capacities.max_rows
            num_running_rows = self._write_rows(running, 0, capacity, blocks)
            num_waiting = sum(len(queue) for queue in waiting)
            num_waiting_rows = 0
            if num_running_rows == len(running):
                num_waiting_rows = self._write_rows(chain.from_iterable(waiting), num_running_rows, capacity, blocks,
                                                    cached_prefixes)
            flags = STATE_VALID | self._slot_flags
            if num_running_rows < len(running) or num_waiting_rows < num_waiting:
                flags |= STATE_TRUNCATED
            self.num_running_rows = num_running_rows if num_running_rows == len(running) else 0
            STATE.pack_into(mapping, STATE_OFFSET, flags, num_free_blocks, len(running), num_waiting,
                            num_running_rows, num_waiting_rows, self.slots.num_used, written_at_s,
                            self.num_scheduled_steps, self.num_scheduled_steps, self.num_processed_steps,
                            self.num_errors, self.num_writes)
        finally:
            self._end()

    def write_scheduled_step(self, scheduled_at_s: float, execution_started_at_s: float,
                             num_scheduled_tokens: Mapping[str, int], num_from_state: int,
                             num_computed_tokens: Mapping[str, int], follows_step: bool = False) -> int:
        """Records the step just scheduled (duration 0: in flight) and returns its index. `follows_step`: scheduled
        straight after the previous step's output (RECORD_FOLLOWS_STEP).

        `num_scheduled_tokens` maps each scheduled request to its tokens, in vLLM's order. Its first `num_from_state`
        requests are the running rows of the state just written, in order (all of them: `num_running_rows`): their
        entry rows are copied from the state. The others are looked up by id, with their tokens computed before the
        step (prefix-cache hits included) from `num_computed_tokens`.
        """
        step_index = self.num_scheduled_steps
        layout, mapping = self.layout, self._map
        record = layout.record_offset(step_index)
        entries = layout.entry_rows_offset(record)
        capacity = self.capacities.max_step_entries
        if num_from_state and num_from_state != self.num_running_rows:
            raise ValueError(f"{num_from_state} entries from the state, which has {self.num_running_rows} running rows")
        self._begin()
        try:
            count = min(len(num_scheduled_tokens), capacity)
            complete = len(num_scheduled_tokens) <= capacity
            _u32s(count).pack_into(mapping, record + RECORD_HEAD.size, *islice(num_scheduled_tokens.values(), count))
            start = min(num_from_state, count)
            slots, named = self.slots, self.slots.named
            if start:
                rows = layout.rows_offset
                copied = mapping[rows:rows + start * ROW.size]
                mapping[entries:entries + start * ROW.size] = copied
                named.update(array("I", copied)[::_ROW_WORDS])  # each row's first field: its slot
            offset, pack = entries + start * ROW.size, ROW.pack_into
            for request_id in islice(num_scheduled_tokens, start, count):
                slot = slots[request_id]
                if slot == NO_SLOT:
                    complete = False
                else:
                    named.add(slot)
                pack(mapping, offset, slot, num_computed_tokens[request_id], 0, 0, 0, 0, NOT_REPORTED, 0, 0)
                offset += ROW.size
            flags = (0 if complete else RECORD_ENTRIES_INCOMPLETE) | (RECORD_FOLLOWS_STEP if follows_step else 0)
            RECORD_HEAD.pack_into(mapping, record, step_index, scheduled_at_s, execution_started_at_s, 0.0, count,
                                  flags)
            self.num_scheduled_steps = step_index + 1
            _STEPS.pack_into(mapping, STATE_OFFSET + STATE_STEPS_OFFSET, self.num_scheduled_steps,
                             self.num_processed_steps)
            U32.pack_into(mapping, STATE_OFFSET + STATE_SLOTS_USED_OFFSET, self.slots.num_used)
        finally:
            self._end()
        return step_index

    def write_processed_step(self, step_index: int | None, duration_s: float,
                             next_step: tuple[int, float] | None) -> None:
        """Completes the record of executed step `step_index` (None: a step that was not recorded) with its duration,
        and stamps when the next step in flight (index, time) began executing."""
        mapping = self._map
        self._begin()
        try:
            if step_index is not None:
                _F64.pack_into(mapping, self.layout.record_offset(step_index) + _DURATION, duration_s)
                self.num_processed_steps = step_index + 1
            if next_step is not None:
                _F64.pack_into(mapping, self.layout.record_offset(next_step[0]) + _EXECUTION_STARTED_AT, next_step[1])
            _STEPS.pack_into(mapping, STATE_OFFSET + STATE_STEPS_OFFSET, self.num_scheduled_steps,
                             self.num_processed_steps)
        finally:
            self._end()

    def _write_rows(self, requests: Iterable[RequestLike], first_row: int, capacity: int,
                    blocks: Mapping[str, Sized], cached_prefixes: CachedPrefixes | None = None) -> int:
        """Writes rows from `first_row` on, stopping at capacity or at a request without a slot; returns how many.
        Invariant: the rows written so far name, in order, the first requests.

        The hot loop of the plugin (one row per resident per step): locals only, one pack per row, and the output
        count read as `len(request._output_token_ids)` (what vLLM's `num_output_tokens` property returns, without the
        property call). Placeholders exist only under async scheduling; elsewhere they are 0 and not read. Rows are
        written with their cached prefix not reported; with `cached_prefixes`, those of preempted requests without
        computed tokens are then filled in with one call for all of them (rare: preemptions mean memory pressure)."""
        mapping, pack, get_slot, get_blocks = self._map, ROW.pack_into, self.slots.get, blocks.get
        with_placeholders, with_prefixes = self.with_placeholders, cached_prefixes is not None
        offset = self.layout.rows_offset + first_row * ROW.size
        written = 0
        preempted: list[tuple[int, RequestLike]] = []
        for request in islice(requests, capacity - first_row):
            request_id = request.request_id
            slot = get_slot(request_id)
            if slot is None:
                slot = self.slots[request_id]
                if slot == NO_SLOT:
                    self._slot_flags |= STATE_SLOTS_EXHAUSTED
                    break
            num_preemptions = request.num_preemptions
            pack(mapping, offset, slot, request.num_computed_tokens, len(request._output_token_ids),
                 len(get_blocks(request_id, _NO_BLOCKS)),
                 request.num_output_placeholders if with_placeholders else 0, num_preemptions, NOT_REPORTED, 0, 0)
            if with_prefixes and num_preemptions and not request.num_computed_tokens:
                preempted.append((offset, request))
            offset += ROW.size
            written += 1
        if preempted and cached_prefixes is not None:
            pack_prefix = ROW_CACHED_PREFIX.pack_into
            for (row_offset, _), figures in zip(preempted, cached_prefixes([r for _, r in preempted]), strict=True):
                pack_prefix(mapping, row_offset + ROW_CACHED_PREFIX_OFFSET, *figures)
        return written

    def close(self) -> None:
        """Unmaps the region and removes its file, so that readers see the engine is gone."""
        if not self._map.closed:
            self._counter.release()
            self._alive_at.release()
            self._map.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
