"""What a replay returns, whichever engine (compiled core or Python reference) ran it."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from bear.core.batch_time import BatchFeatures
from bear.core.state import EngineConfig, InstanceState, Query


class ReplayStatus(enum.StrEnum):
    FIRST_TOKEN = "first_token"  # the query's first token was reached
    EXCEEDS_HORIZON = "exceeds_horizon"  # the simulated time passed the horizon (or the step limit was hit) first
    INFEASIBLE = "infeasible"  # the query can never get its first token


class Infeasibility(enum.StrEnum):
    NONE = "none"
    PROMPT_TOO_LONG = "prompt_too_long"  # prompt not shorter than max_model_len
    PROMPT_EXCEEDS_CACHE = "prompt_exceeds_cache"  # more KV blocks than the whole cache
    STUCK = "stuck"  # a request that can never complete (the query or one ahead of it) blocks the query
    STEP_LIMIT = "step_limit"  # gave up after the step limit (status EXCEEDS_HORIZON: not a verdict on feasibility)


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """One simulated batch: (request id, tokens) in vLLM's order (running first, then newly admitted)."""

    scheduled: tuple[tuple[str, int], ...]
    features: BatchFeatures
    time_s: float


@dataclass(frozen=True, slots=True)
class ReplayResult:
    status: ReplayStatus
    first_token_batch: int | None  # 1-based index of the batch sampling the query's first token
    ttft_s: float | None  # summed time of the batches up to and including that one
    elapsed_s: float  # simulated time when the replay stopped (= ttft_s on success)
    num_batches: int  # batches simulated, fast-forwarded ones included
    num_steps: int  # batches simulated one at a time
    num_preemptions: int
    reason: str = ""  # why, when the status is not FIRST_TOKEN
    batches: tuple[ScheduledBatch, ...] = ()  # only when asked to record them

    @property
    def feasible(self) -> bool:
        return self.status is not ReplayStatus.INFEASIBLE


def refused_prompt(engine: EngineConfig, num_prompt_tokens: int) -> Infeasibility:
    """Why an engine of these settings can never serve a prompt this long, whatever its load (NONE: it can)."""
    if num_prompt_tokens >= engine.max_model_len:
        return Infeasibility.PROMPT_TOO_LONG
    if -(-num_prompt_tokens // engine.block_size) > engine.num_gpu_blocks:
        return Infeasibility.PROMPT_EXCEEDS_CACHE
    return Infeasibility.NONE


def explain_refused_prompt(kind: Infeasibility, engine: EngineConfig, num_prompt_tokens: int) -> str:
    """A sentence saying why an engine refuses the prompt (`kind`: what `refused_prompt` found)."""
    if kind is Infeasibility.PROMPT_TOO_LONG:
        return (f"the query's prompt ({num_prompt_tokens} tokens) is not shorter than max_model_len "
                f"({engine.max_model_len})")
    blocks = -(-num_prompt_tokens // engine.block_size)
    return f"the query's prompt needs {blocks} KV blocks, more than the cache's {engine.num_gpu_blocks}"


def explain(kind: Infeasibility, blocking_id: str | None, state: InstanceState, query: Query, horizon_s: float) -> str:
    """A sentence saying why the replay stopped before the query's first token."""
    engine = state.engine
    if kind in (Infeasibility.PROMPT_TOO_LONG, Infeasibility.PROMPT_EXCEEDS_CACHE):
        return explain_refused_prompt(kind, engine, query.num_prompt_tokens)
    if kind is Infeasibility.STUCK:
        if blocking_id == query.id:
            who, tokens, ahead = "the query", query.num_prompt_tokens, ""
        else:
            resident = next((r for r in (*state.running, *state.waiting) if r.id == blocking_id), None)
            tokens = None if resident is None else resident.num_prompt_tokens + resident.num_output_tokens
            who, ahead = f"request {blocking_id!r}", ", ahead of the query"
        if not engine.enable_chunked_prefill and tokens is not None and tokens > engine.max_num_batched_tokens:
            why = (f"its {tokens} tokens exceed the token budget ({engine.max_num_batched_tokens}) and chunked "
                   f"prefill is off")
        else:
            why = "it needs more KV blocks than the engine can give it"
        return f"{who} can never be scheduled to completion ({why}){ahead}"
    if kind is Infeasibility.STEP_LIMIT:
        return "the replay gave up after its step limit"
    return f"the simulated time passed the horizon ({horizon_s} s) before the query's first token"
