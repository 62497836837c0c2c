"""The snapshot region: one shared-memory file per engine, written by the plugin, read by the sidecar.

Binary format, version 2 (readers also read version 1: see ROWS). Integers are little-endian and unsigned; times are
float64 Unix seconds; offsets are in bytes.

    HEADER    at 0, 64 bytes, written once when the region is created (the sequence counter excepted)
      magic "BEAR", version u16, header_size u16, sequence u64 (at offset 8), region_size u64,
      max_id_bytes u32, max_slots u32, max_rows u32, max_step_entries u32, num_ring_steps u32, writer_pid u32,
      created_at_s f64, alive_at_s f64 (at offset 56: the plugin's heartbeat, stored every second by a thread of its
      own outside the sequence protocol, one atomic store; an engine killed without shutting down stops it)
    ENGINE    at 64, 176 bytes: the engine's scheduler settings and served model name, written once at start-up
      max_num_batched_tokens, max_num_seqs, block_size, num_gpu_blocks (usable: vLLM's count minus its null block),
      long_prefill_token_threshold, max_model_len (u32 each), watermark f64, enable_chunked_prefill u8,
      scheduler_reserve_full_isl u8, async_scheduling u8, enable_prefix_caching u8 (a padding byte before it was
      added: 0 from older writers), 4 padding bytes, model_len u16, 6 padding bytes, model bytes[128] (UTF-8)
    STATE     at 240, 80 bytes: written with the rows right before every schedule() (the replay's starting point)
      flags u32 (STATE_*), num_free_blocks, num_running, num_waiting, num_running_rows, num_waiting_rows,
      num_slots_used (u32 each; slots at and above it were never assigned), 4 padding bytes, written_at_s f64,
      next_step_index u64 (the first step scheduled after this state; under async scheduling the step before it may
      still be in flight, its tokens already counted in the state), num_scheduled_steps u64,
      num_processed_steps u64, num_errors u64, num_writes u64
    SLOTS     at 320, max_slots × slot_size: one slot per request id, written once when the request is first seen
      id_len u16, slot_flags u16 (SLOT_*), num_prompt_tokens u32, max_tokens u32, 4 padding bytes,
      arrival_time_s f64, id bytes[max_id_bytes]
    ROWS      max_rows × 36: RUNNING requests in admission order, then WAITING requests in queue order
      slot, num_computed_tokens, num_output_tokens, num_allocated_blocks, num_output_placeholders, num_preemptions,
      num_cached_tokens, num_evictable_blocks, num_free_blocks_ahead (u32 each). The last three are vLLM's prefix
      cache as a preempted request waiting to resume finds it (`cached_blocks`): its prefix tokens in cached blocks,
      how many of those blocks sit in the free queue, and how many free blocks are ahead of the first of them.
      Written only for WAITING requests with num_preemptions > 0 and no computed tokens on an engine with prefix
      caching; elsewhere num_cached_tokens is NOT_REPORTED (0xFFFFFFFF) and the other two 0. Version 1 rows are
      24 bytes, the first six fields only (nothing reported).
    RING      num_ring_steps × record_size: step i (counting the engine's non-empty steps from 0) lives in record
              i mod num_ring_steps, written when the step is scheduled and completed when its output is processed
      step_index u64, scheduled_at_s f64, execution_started_at_s f64 (0 while it waits behind another step in
      flight), duration_s f64 (0 while in flight), num_entries u32, record_flags u32 (RECORD_*), then
      num_scheduled_tokens u32[max_step_entries] and entry rows (ROW format)[max_step_entries]: entry i is a
      request's scheduled tokens and its row as the step found it; readers use its slot and its computed tokens
      before the step (prefix-cache hits included), the only fields filled for requests the step admitted

Steps `num_processed_steps` … `num_scheduled_steps − 1` are in flight (the oldest one executes); the earlier ones still
in the ring have executed. Every slot referenced by a row or a ring record names the request it was given to: a slot is
reused only once the ring no longer holds a step that could reference it.

Consistency (paper Appendix E): the writer makes `sequence` odd, writes, then makes it even again. A reader copies what
it needs and accepts the copy only if `sequence` was even before and unchanged after. The writer never waits. Both
sides access the counter with single aligned 8-byte loads and stores (`counter_view`; `struct` would move it byte by
byte, and a reader could see a counter half-written), and rely on stores and loads not being reordered across it,
which holds on x86-64 (TSO, little-endian). The counter starts at 2 × the creation time in microseconds, so it keeps
increasing when an engine restarts and recreates its region.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import time
from dataclasses import dataclass
from stat import S_ISREG

MAGIC = b"BEAR"
VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: rows without the cached-prefix fields

HEADER = struct.Struct("<4sHHQQIIIIIIdd")
SEQUENCE = struct.Struct("<Q")
SEQUENCE_OFFSET = 8
ALIVE_AT_OFFSET = 56
ENGINE = struct.Struct("<6Id4B4xH6x128s")
MAX_MODEL_NAME_BYTES = 128
# The most a region may hold beyond the engine's own max_num_seqs (the plugin's settings stay within them; a reader
# refuses a header past them rather than copy what a damaged or foreign file claims).
MAX_WAITING_ROWS_LIMIT = 65_536  # rows for waiting requests (BEAR_SNAPSHOT_MAX_WAITING)
MAX_RING_STEPS = 65_536  # step records (BEAR_SNAPSHOT_RING_STEPS; a million steps made a 7 GB region in /dev/shm)
MAX_ID_BYTES = 4096  # bytes of a request id (BEAR_SNAPSHOT_MAX_ID_BYTES; every slot reserves this much)
STATE = struct.Struct("<7I4xdQQQQQ")
STATE_SLOTS_USED_OFFSET = 24  # inside STATE: num_slots_used
STATE_STEPS_OFFSET = 48  # inside STATE: num_scheduled_steps, num_processed_steps
SLOT_HEAD = struct.Struct("<HHII4xd")
ROW = struct.Struct("<9I")
ROW_V1 = struct.Struct("<6I")
ROW_CACHED_PREFIX = struct.Struct("<3I")  # the last three fields of a ROW
ROW_CACHED_PREFIX_OFFSET = 24  # inside a ROW: num_cached_tokens
RECORD_HEAD = struct.Struct("<QdddII")
U32 = struct.Struct("<I")

ENGINE_OFFSET = HEADER.size
STATE_OFFSET = ENGINE_OFFSET + ENGINE.size
SLOTS_OFFSET = STATE_OFFSET + STATE.size

NO_SLOT = 0xFFFF_FFFF
NOT_REPORTED = 0xFFFF_FFFF  # a ROW's num_cached_tokens when the figures are not reported

# STATE.flags
STATE_VALID = 1  # the rows hold a complete state (cleared when a write failed half-way)
STATE_TRUNCATED = 2  # more residents than rows: the rows hold the running requests and the head of the queue
STATE_SLOTS_EXHAUSTED = 4  # a request found no free slot (it and the requests after it are left out)
# SLOT flags
SLOT_ID_TRUNCATED = 1  # the id was longer than max_id_bytes and is cut there
# RECORD flags
RECORD_ENTRIES_INCOMPLETE = 1  # more scheduled requests than entries, or one without a slot: entries are partial
# Scheduled, with no step in flight, straight after the previous step's output was applied: the engine had requests
# left and did not wait for new ones, so the time from that step's end to this one's start is the engine's own work
# between steps (applying and sending the output, reading new requests, scheduling). Readers that predate the flag
# ignore it.
RECORD_FOLLOWS_STEP = 2


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The ENGINE section: the scheduler settings the replay needs, as the running engine has them."""

    max_num_batched_tokens: int  # token budget per step (vLLM's max_num_scheduled_tokens)
    max_num_seqs: int
    block_size: int
    num_gpu_blocks: int  # usable KV blocks: vLLM's count minus its null block
    long_prefill_token_threshold: int
    max_model_len: int
    watermark: float
    enable_chunked_prefill: bool
    scheduler_reserve_full_isl: bool
    async_scheduling: bool
    model: str  # served model name (cut at MAX_MODEL_NAME_BYTES)
    enable_prefix_caching: bool = False  # vLLM reuses cached prompt prefixes


class RegionError(RuntimeError):
    """The file is not a snapshot region this code can read (wrong magic, version or size)."""


@dataclass(frozen=True, slots=True)
class Capacities:
    """How much one region holds; fixed when it is created."""

    max_rows: int  # resident requests (running + waiting)
    max_step_entries: int  # requests per step record (vLLM schedules at most max_num_seqs)
    num_ring_steps: int  # step records kept
    max_slots: int  # request ids, residents and recently finished ones
    max_id_bytes: int = 128

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_step_entries", "num_ring_steps", "max_slots", "max_id_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"region capacity {name} must be >= 1")
        if self.num_ring_steps < 4:
            raise ValueError("region capacity num_ring_steps must be >= 4 (two steps may be in flight)")
        if self.max_slots < self.max_rows:
            raise ValueError("region capacity max_slots must be >= max_rows")


@dataclass(frozen=True, slots=True)
class Layout:
    """Byte offsets of every section, derived from the capacities (the writer and the reader compute the same)."""

    capacities: Capacities
    slot_size: int
    rows_offset: int
    ring_offset: int
    record_size: int
    size: int
    row: struct.Struct = ROW  # the row format of the region's version (ROW_V1 for version 1)

    @staticmethod
    def of(capacities: Capacities, version: int = VERSION) -> Layout:
        row = ROW_V1 if version == 1 else ROW
        slot_size = _align8(SLOT_HEAD.size + capacities.max_id_bytes)
        rows_offset = SLOTS_OFFSET + capacities.max_slots * slot_size
        ring_offset = _align8(rows_offset + capacities.max_rows * row.size)
        record_size = _align8(RECORD_HEAD.size + (4 + row.size) * capacities.max_step_entries)
        size = ring_offset + capacities.num_ring_steps * record_size
        return Layout(capacities, slot_size, rows_offset, ring_offset, record_size, size, row)

    def slot_offset(self, slot: int) -> int:
        return SLOTS_OFFSET + slot * self.slot_size

    def record_offset(self, step_index: int) -> int:
        return self.ring_offset + (step_index % self.capacities.num_ring_steps) * self.record_size

    def entry_rows_offset(self, record_offset: int) -> int:
        """Start of the entry rows of the record at record_offset (its scheduled tokens start at RECORD_HEAD.size)."""
        return record_offset + RECORD_HEAD.size + 4 * self.capacities.max_step_entries


def counter_view(mapping: mmap.mmap) -> memoryview:
    """The sequence counter as a one-element native uint64 view: an item read or write is one aligned 8-byte load or
    store, atomic on x86-64. Release it before closing the mapping."""
    return memoryview(mapping)[SEQUENCE_OFFSET:SEQUENCE_OFFSET + SEQUENCE.size].cast("Q")


def alive_at_view(mapping: mmap.mmap) -> memoryview:
    """The heartbeat (alive_at_s) as a one-element float64 view: one aligned 8-byte load or store per access."""
    return memoryview(mapping)[ALIVE_AT_OFFSET:ALIVE_AT_OFFSET + 8].cast("d")


def region_path(name: str) -> str:
    """A region name is a file in /dev/shm (POSIX shared memory); a name containing '/' is taken as a path."""
    return name if "/" in name else os.path.join("/dev/shm", name)


def create_region(path: str, capacities: Capacities) -> tuple[mmap.mmap, Layout, int]:
    """Creates the region file atomically (a reader never sees it half-initialised) and maps it for writing.

    Returns the mapping, its layout and the initial (even) sequence counter. An existing region of the same name is
    replaced, not modified: a reader holding the old one keeps a valid (stale) mapping until it reopens the path.
    """
    layout = Layout.of(capacities)
    created_at_s = time.time()
    sequence = 2 * int(created_at_s * 1e6)
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, layout.size)
        mapping = mmap.mmap(fd, layout.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    HEADER.pack_into(mapping, 0, MAGIC, VERSION, HEADER.size, sequence, layout.size, capacities.max_id_bytes,
                     capacities.max_slots, capacities.max_rows, capacities.max_step_entries,
                     capacities.num_ring_steps, os.getpid(), created_at_s, created_at_s)
    os.replace(temporary, path)
    return mapping, layout, sequence


def open_region(path: str) -> tuple[mmap.mmap, Layout, int]:
    """Maps an existing region read-only and checks its header. Returns the mapping, layout and file inode."""
    # Not blocking: a FIFO at the path would hold the open (and the sidecar's poll loop) until a writer came.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        stat = os.fstat(fd)
        if not S_ISREG(stat.st_mode):
            raise RegionError(f"{path}: not a regular file")
        if stat.st_size < HEADER.size:
            raise RegionError(f"{path}: {stat.st_size} bytes, too small for a snapshot region")
        mapping = mmap.mmap(fd, stat.st_size, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        return mapping, _checked_layout(path, mapping, stat.st_size), stat.st_ino
    except RegionError:
        mapping.close()
        raise


def plugin_max_slots(max_rows: int, max_step_entries: int, num_ring_steps: int) -> int:
    """The request-id slots a plugin's region has: one per row twice over (rows change between states), and one per
    request the ring's steps (and the two just past it) may name, since a finished request's slot is reused only
    once no step record names it. Short requests finish up to max_num_seqs a step (max_tokens=1: a whole batch);
    fewer slots ran out under them, leaving queued requests out of the state and steps incomplete."""
    return 2 * max_rows + (num_ring_steps + 2) * max_step_entries


def _checked_layout(path: str, mapping: mmap.mmap, file_size: int) -> Layout:
    (magic, version, header_size, _, size, max_id_bytes, max_slots, max_rows, max_entries, num_ring_steps, _,
     created_at_s, _) = HEADER.unpack_from(mapping, 0)
    if magic != MAGIC or version not in READABLE_VERSIONS or header_size != HEADER.size:
        raise RegionError(f"{path}: not a snapshot region of version {' or '.join(map(str, READABLE_VERSIONS))} "
                          f"(magic {magic!r}, version {version})")
    if not math.isfinite(created_at_s):
        raise RegionError(f"{path}: its creation time is {created_at_s}")
    if (max_id_bytes > MAX_ID_BYTES or num_ring_steps > MAX_RING_STEPS
            or max_rows > max_entries + MAX_WAITING_ROWS_LIMIT
            or max_slots > 2 * plugin_max_slots(max_rows, max_entries, num_ring_steps)):  # twice a plugin's
        raise RegionError(f"{path}: capacities past what a plugin writes (ids of {max_id_bytes} bytes, {max_slots} "
                          f"slots, {max_rows} rows, {max_entries} step entries, {num_ring_steps} steps)")
    try:
        layout = Layout.of(Capacities(max_rows, max_entries, num_ring_steps, max_slots, max_id_bytes), version)
    except ValueError as error:
        raise RegionError(f"{path}: {error}") from None
    if layout.size != size or size > file_size:
        raise RegionError(f"{path}: header says {size} bytes, layout needs {layout.size}, file has {file_size}")
    return layout


def _align8(n: int) -> int:
    return (n + 7) & ~7
