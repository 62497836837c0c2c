"""Builders for snapshot-region tests: requests shaped like vLLM's, and a writer over them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from bear.snapshotter.region import STATE, STATE_OFFSET, Capacities, EngineSettings
from bear.snapshotter.writer import CachedPrefixes, RegionWriter

ENGINE = EngineSettings(max_num_batched_tokens=2048, max_num_seqs=8, block_size=16, num_gpu_blocks=999,
                        long_prefill_token_threshold=0, max_model_len=4096, watermark=0.01,
                        enable_chunked_prefill=True, scheduler_reserve_full_isl=True, async_scheduling=False,
                        model="qwen3-test", enable_prefix_caching=True)


@dataclass
class FakeRequest:
    """The attributes of vLLM's Request that the writer reads."""

    request_id: str
    num_prompt_tokens: int = 100
    max_tokens: int = 50
    arrival_time: float = 1.7e9
    num_computed_tokens: int = 0
    num_output_placeholders: int = 0
    num_preemptions: int = 0
    _output_token_ids: list[int] = field(default_factory=list)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)


def decoding(request_id: str, prompt: int = 100, outputs: int = 3, **fields: object) -> FakeRequest:
    return FakeRequest(request_id, num_prompt_tokens=prompt, num_computed_tokens=prompt + outputs - 1,
                       _output_token_ids=[7] * outputs, **fields)  # type: ignore[arg-type]


def waiting(request_id: str, prompt: int = 100, **fields: object) -> FakeRequest:
    return FakeRequest(request_id, num_prompt_tokens=prompt, **fields)  # type: ignore[arg-type]


class FakeEngine:
    """Requests by id and their KV blocks, as the writer looks them up."""

    def __init__(self, path: str, capacities: Capacities, engine: EngineSettings = ENGINE,
                 with_placeholders: bool = False):
        self.requests: dict[str, FakeRequest] = {}
        self.blocks: dict[str, list[int]] = {}
        self.writer = RegionWriter(path, capacities, self.requests.get, with_placeholders)
        self.writer.write_engine(engine)
        self.block_size = engine.block_size

    def add(self, *requests: FakeRequest) -> None:
        for request in requests:
            self.requests[request.request_id] = request
            self.blocks[request.request_id] = [0] * -(-request.num_computed_tokens // self.block_size)

    def write_state(self, running: Sequence[FakeRequest], waiting: Sequence[FakeRequest] = (),
                    num_free_blocks: int = 900, written_at_s: float = 1.8e9,
                    cached_prefixes: CachedPrefixes | None = None) -> None:
        self.add(*running, *waiting)
        self.writer.beat(time.time())  # the plugin's heartbeat thread, in short
        self.writer.write_state(running, (waiting,), self.blocks, num_free_blocks, written_at_s, cached_prefixes)

    def schedule(self, scheduled: dict[str, int], from_state: int = 0, at_s: float = 1.8e9,
                 started_at_s: float | None = None, follows_step: bool = False) -> int:
        """Records a step; requests not taken from the state rows have their computed tokens looked up."""
        computed = {rid: self.requests[rid].num_computed_tokens for rid in scheduled if rid in self.requests}
        return self.writer.write_scheduled_step(at_s, at_s if started_at_s is None else started_at_s, scheduled,
                                                from_state, computed, follows_step)

    def finish_step(self, index: int | None, duration_s: float, next_step: tuple[int, float] | None = None) -> None:
        self.writer.write_processed_step(index, duration_s, next_step)

    def finish(self, *request_ids: str) -> None:
        self.writer.slots.release(request_ids, self.writer.num_scheduled_steps)
        for request_id in request_ids:
            self.requests.pop(request_id, None)
            self.blocks.pop(request_id, None)

    def rewrite_state(self, **changes: float) -> None:
        """Overwrites fields of the state's STATE section (names as `StateFields`) in one write, as a plugin with a
        bug or a foreign writer might."""
        values = StateFields(*STATE.unpack_from(self.writer._map, STATE_OFFSET))
        for name, value in changes.items():
            setattr(values, name, value)
        self.writer._begin()
        STATE.pack_into(self.writer._map, STATE_OFFSET, *(getattr(values, f.name) for f in fields(StateFields)))
        self.writer._end()


def small_capacities(**overrides: int) -> Capacities:
    values = dict(max_rows=8, max_step_entries=8, num_ring_steps=4, max_slots=32, max_id_bytes=32)
    values.update(overrides)
    return Capacities(**values)


@dataclass
class StateFields:
    """The STATE section's fields in order (`bear.snapshotter.region`)."""

    flags: int
    num_free_blocks: int
    num_running: int
    num_waiting: int
    num_running_rows: int
    num_waiting_rows: int
    num_slots_used: int
    written_at_s: float
    next_step_index: int
    num_scheduled_steps: int
    num_processed_steps: int
    num_errors: int
    num_writes: int
