"""The sequence-counter protocol under load: a writer process rewrites the region as fast as it can while this
process reads it; every accepted copy is checked against invariants that any mix of two writes breaks.

Write g makes every number in the region a function of g: the state's time is g, its free blocks g mod 2^32, the
counts (g mod 5 running, g mod 4 waiting) and, for request i, computed tokens 7g + i, outputs (g + i) mod 50, blocks
g + 2i, preemptions (g + i) mod 3; each step record written with it has scheduled time g, duration g µs and entries
(g mod 5 + 1 tokens, 7g + i computed). A copy that mixed two writes would show two values of g.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from bear.snapshotter.reader import RegionReader, RegionSnapshot
from bear.snapshotter.region import Capacities
from bear.snapshotter.writer import RegionWriter
from tests.region_builders import ENGINE

MIN_READS = 1_000_000  # reads aimed at (~40-60 s on the development machines) ...
MAX_SECONDS = 150  # ... unless this runs out first (a host 2x slower, or busy, read ~800,000 in it)
ENOUGH_READS = 200_000  # reads needed: a test of the protocol, not a benchmark of the host
CAPACITIES = Capacities(max_rows=8, max_step_entries=4, num_ring_steps=8, max_slots=16, max_id_bytes=8)
NUM_REQUESTS = 8


class Count:
    """A sized object (vLLM's outputs list and blocks list are only measured)."""

    def __init__(self, n: int = 0):
        self.n = n

    def __len__(self) -> int:
        return self.n


class Request:
    def __init__(self, index: int):
        self.request_id = f"r{index}"
        self.index = index
        self.num_prompt_tokens, self.max_tokens, self.arrival_time = 100 + index, 1000, 1.7e9 + index
        self.num_computed_tokens = self.num_output_placeholders = self.num_preemptions = 0
        self._output_token_ids = Count()


def write_forever(path: str, stop: multiprocessing.synchronize.Event, ready: multiprocessing.synchronize.Event
                  ) -> None:
    requests = [Request(i) for i in range(NUM_REQUESTS)]
    by_id = {r.request_id: r for r in requests}
    blocks = {r.request_id: Count() for r in requests}
    writer = RegionWriter(path, CAPACITIES, by_id.get, with_placeholders=True)
    writer.write_engine(ENGINE)
    g = 0
    while not stop.is_set():
        g += 1
        num_running, num_waiting = g % 5, g % 4
        for request in requests:
            i = request.index
            request.num_computed_tokens = 7 * g + i
            request._output_token_ids.n = (g + i) % 50
            request.num_output_placeholders = (g + i) % 2
            request.num_preemptions = (g + i) % 3
            blocks[request.request_id].n = g + 2 * i
        running, waiting = requests[:num_running], requests[num_running:num_running + num_waiting]
        writer.write_state(running, (waiting,), blocks, g % 2**32, float(g))
        if num_running:
            scheduled = {r.request_id: g % 5 + 1 for r in running}
            index = writer.write_scheduled_step(float(g), float(g), scheduled, num_running, {})
            writer.write_processed_step(index, g * 1e-6, None)
        ready.set()  # from the first state on, every copy must show exactly one write
    writer.close()


def violations(snapshot: RegionSnapshot) -> list[str]:
    """Everything in an accepted copy that does not belong to one single write."""
    g = int(snapshot.written_at_s)
    problems = []
    if (snapshot.num_free_blocks, snapshot.num_running, snapshot.num_waiting) != (g % 2**32, g % 5, g % 4):
        problems.append(f"state counts of write {g}: {snapshot.num_free_blocks, snapshot.num_running}")
    if not snapshot.valid or len(snapshot.running) != g % 5 or len(snapshot.waiting) != g % 4:
        problems.append(f"rows of write {g}: {len(snapshot.running)} running, {len(snapshot.waiting)} waiting")
    for request in snapshot.running + snapshot.waiting:
        i = int(request.request_id[1:])
        expected = (100 + i, 7 * g + i, (g + i) % 50, g + 2 * i, (g + i) % 3, 1.7e9 + i)
        got = (request.num_prompt_tokens, request.num_computed_tokens, request.num_output_tokens,
               request.num_allocated_blocks, request.num_preemptions, request.arrival_time_s)
        if got != expected:
            problems.append(f"{request.request_id} in write {g}: {got} vs {expected}")
    for step in snapshot.executed + snapshot.in_flight:
        s = int(step.scheduled_at_s)
        if step.duration_s not in (0.0, s * 1e-6):
            problems.append(f"step {step.step_index} of write {s}: duration {step.duration_s}")
        if [(e.num_scheduled_tokens, e.num_computed_tokens) for e in step.entries] != [
                (s % 5 + 1, 7 * s + int(e.request_id[1:])) for e in step.entries] or len(step.entries) != s % 5:
            problems.append(f"step {step.step_index} of write {s}: entries {step.entries}")
    return problems


def test_no_torn_copy_is_ever_accepted(tmp_path: Path) -> None:
    path = str(tmp_path / "region")
    context = multiprocessing.get_context("spawn")
    stop, ready = context.Event(), context.Event()
    writer = context.Process(target=write_forever, args=(path, stop, ready), daemon=True)
    writer.start()
    try:
        assert ready.wait(60), "the writer did not start"
        reader = RegionReader(path)
        accepted, bad, last_sequence = 0, [], -1
        deadline = time.monotonic() + MAX_SECONDS
        while reader.num_reads + reader.num_torn < MIN_READS and time.monotonic() < deadline:
            snapshot = reader.read(changed_only=False)
            if snapshot is None:
                continue
            accepted += 1
            if snapshot.sequence_number < last_sequence:
                bad.append(f"sequence went back: {snapshot.sequence_number} after {last_sequence}")
            last_sequence = snapshot.sequence_number
            bad += violations(snapshot)
    finally:
        stop.set()
        writer.join(30)
    reads = reader.num_reads + reader.num_torn
    print(f"\nregion stress: {reads} reads ({reader.num_reads} accepted, {reader.num_torn} discarded as torn, "
          f"{reader.num_busy} found a write in progress), {len(bad)} torn records accepted")
    assert not bad, bad[:5]
    assert reads >= ENOUGH_READS, f"only {reads} reads in {MAX_SECONDS} s"
    # Liveness: this writer rewrites the region back to back (a real engine writes once per step, milliseconds
    # apart), so most copies overlap a write and are discarded; some must still get through.
    assert accepted >= 1_000, "the reader made too little progress"
    assert reader.num_torn > 0, "the writer never overlapped a read: the test did not exercise the protocol"
