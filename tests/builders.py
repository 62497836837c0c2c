"""Small builders of replay inputs, so that a test states only what it is about."""

from __future__ import annotations

import dataclasses

from bear.core.batch_time import BatchTimeCoefficients
from bear.core.replay import ReplayEngine, replay
from bear.core.result import ReplayResult
from bear.core.state import EngineConfig, InstanceState, Query, ResidentRequest

COEFFICIENTS = BatchTimeCoefficients(b0=0.004, b1=2e-5, b2=1e-8, b3=1e-9)


def make_engine(**overrides: object) -> EngineConfig:
    settings: dict[str, object] = dict(
        max_num_batched_tokens=2048, max_num_seqs=256, block_size=16, num_gpu_blocks=1000, max_model_len=32768
    )
    settings.update(overrides)
    return EngineConfig(**settings)  # type: ignore[arg-type]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def decoding(request_id: str, prompt: int = 100, output: int = 1, remaining: int = 10, *, block_size: int = 16,
             max_tokens: int | None = None, placeholders: int = 0) -> ResidentRequest:
    """A running request whose prompt is done: its next token to compute is its last one."""
    computed = prompt + output + placeholders - 1
    return ResidentRequest(request_id, prompt, computed, output, remaining, cdiv(computed, block_size),
                           max_tokens, placeholders)


def prefilling(request_id: str, prompt: int, computed: int, remaining: int = 10, *,
               block_size: int = 16) -> ResidentRequest:
    """A running request part way through its prompt (chunked prefill)."""
    return ResidentRequest(request_id, prompt, computed, 0, remaining, cdiv(computed, block_size))


def queued(request_id: str, prompt: int = 100, output: int = 0, remaining: int = 10,
           max_tokens: int | None = None) -> ResidentRequest:
    """A waiting request (output > 0: preempted earlier, it recomputes prompt and outputs)."""
    return ResidentRequest(request_id, prompt, 0, output, remaining, 0, max_tokens)


def make_state(running: tuple[ResidentRequest, ...] | list[ResidentRequest] = (),
               waiting: tuple[ResidentRequest, ...] | list[ResidentRequest] = (),
               engine: EngineConfig | None = None, free_blocks: int | None = None) -> InstanceState:
    """A state whose free blocks are whatever the running requests leave, unless given."""
    engine = engine or make_engine()
    if free_blocks is None:
        free_blocks = engine.num_gpu_blocks - sum(r.num_allocated_blocks for r in running)
    return InstanceState(engine, free_blocks, tuple(running), tuple(waiting))


def make_query(prompt: int = 100, output: int = 10, request_id: str = "q") -> Query:
    return Query(request_id, prompt, output)


def with_engine(state: InstanceState, **overrides: object) -> InstanceState:
    return dataclasses.replace(state, engine=dataclasses.replace(state.engine, **overrides))


def run(state: InstanceState, query: Query, engine: ReplayEngine, **options: object) -> ReplayResult:
    return replay(state, query, COEFFICIENTS, record_batches=True, engine=engine, **options)  # type: ignore[arg-type]


def scheduled(result: ReplayResult) -> list[dict[str, int]]:
    return [dict(batch.scheduled) for batch in result.batches]
