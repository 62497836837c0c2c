"""An instance's scheduler state and a new query, in vLLM's own terms: what the replay starts from."""

from __future__ import annotations

import math
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass


class InvalidState(ValueError):
    """The state cannot be replayed; the message names the offending field."""


MAX_BLOCK_SIZE = 65_536  # tokens per KV block at most (vLLM uses tens to hundreds; the core's memory grows with it)
# max_model_len and max_num_batched_tokens at most (the longest contexts served are ~10M tokens): a step's eq. 12
# features, Σ prefill · (context + (prefill + 1) / 2), then stay far inside the core's 64-bit integers
MAX_ENGINE_TOKENS = 2**28

@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Scheduler settings of one vLLM engine."""

    max_num_batched_tokens: int  # token budget per step
    max_num_seqs: int  # most requests in RUNNING
    block_size: int  # tokens per KV block
    num_gpu_blocks: int  # usable KV blocks (vLLM's count minus its null block)
    max_model_len: int
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0 = off
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0  # fraction of all blocks (usable + null) kept free when admitting
    async_scheduling: bool = False
    # The caller gives each request's prompt hit (`cached_tokens`); with it, a request the replay preempts resumes from
    # its own blocks still cached (bear.core.reference).
    enable_prefix_caching: bool = False

    @property
    def watermark_blocks(self) -> int:
        # vLLM: int(watermark * num_blocks), its num_blocks counting the null block.
        return int(self.watermark * (self.num_gpu_blocks + 1))


@dataclass(frozen=True, slots=True)
class ResidentRequest:
    """A request resident at the instance, exactly as vLLM's scheduler holds it."""

    id: str
    num_prompt_tokens: int
    num_computed_tokens: int  # vLLM's: prompt and output tokens whose KV is computed, a step in flight included
    num_output_tokens: int
    remaining_output_tokens: int  # output tokens still to come (predicted), including any in flight
    num_allocated_blocks: int = 0
    max_tokens: int | None = None  # None: max_model_len - num_prompt_tokens, as vLLM sets it
    num_output_placeholders: int = 0  # async: tokens the step in flight appends to the output
    # Prefix tokens (its prompt's, and a preempted request's outputs too) the prefix cache is expected to hold whenever
    # the request is admitted from the waiting queue (a waiting request or an arrival; a running one once preempted):
    # bear.core.reference.prefix_cache_hit.
    cached_tokens: int = 0
    # A waiting request's own blocks still cached (prefix caching on; vLLM's block pool says, e.g. for a request it
    # preempted): of the blocks behind `cached_tokens`, the last `num_evictable_blocks` sit in vLLM's free queue,
    # `num_free_blocks_ahead` free blocks before the first of them to go. The replay evicts them as it takes blocks from
    # the front of the queue, and the request resumes from what is left.
    num_evictable_blocks: int = 0
    num_free_blocks_ahead: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def remaining_prefill_tokens(self) -> int:
        """Tokens still to compute before the request decodes: its prompt (and, after a preemption, its outputs)."""
        pending = self.num_tokens + self.num_output_placeholders - self.num_computed_tokens
        decoding = self.num_output_tokens + self.num_output_placeholders > 0 and pending <= 1
        return 0 if decoding else pending

    def stop_length(self, engine: EngineConfig) -> int:
        """Output length at which the request finishes: predicted length, max_tokens or max_model_len."""
        max_tokens = self.max_tokens if self.max_tokens is not None else engine.max_model_len - self.num_prompt_tokens
        return min(
            self.num_output_tokens + self.remaining_output_tokens,
            max_tokens,
            engine.max_model_len - self.num_prompt_tokens,
        )


@dataclass(frozen=True, slots=True)
class InstanceState:
    """One instance's engine settings, free KV blocks, RUNNING list (admission order) and WAITING queue.

    `shared_blocks`: references to blocks that another running request holds too (prefix caching: a request whose
    prompt starts like one still running takes that request's cached blocks). Each running request counts every block
    it holds, so the running requests' blocks add up to `shared_blocks` more than the blocks they hold. A block is
    freed with the last request holding it: the blocks of a request that finishes or is preempted go to the free
    pool once the shared references are paid off, the first of them paying first."""

    engine: EngineConfig
    free_blocks: int
    running: tuple[ResidentRequest, ...] = ()
    waiting: tuple[ResidentRequest, ...] = ()
    shared_blocks: int = 0


@dataclass(frozen=True, slots=True)
class Query:
    """The new query: it joins the back of the waiting queue just before the next step is scheduled."""

    id: str
    num_prompt_tokens: int
    output_tokens: int  # predicted output length (≥ 1)


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request reaching the instance `time_s` after the state was taken (e.g. dispatched since a snapshot); it joins
    the back of the waiting queue before the first step scheduled at or after that time."""

    time_s: float
    request: ResidentRequest  # as waiting: no computed tokens, blocks or placeholders


def check_engine(engine: EngineConfig) -> None:
    """Raises InvalidState unless the replay can run with these engine settings."""
    _require(
        min(engine.max_num_batched_tokens, engine.max_num_seqs, engine.block_size, engine.num_gpu_blocks) >= 1,
        "engine: max_num_batched_tokens, max_num_seqs, block_size and num_gpu_blocks must be >= 1",
    )
    _require(engine.block_size <= MAX_BLOCK_SIZE, f"engine.block_size must be at most {MAX_BLOCK_SIZE}")
    _require(engine.max_model_len >= 2, "engine.max_model_len must be >= 2")
    _require(max(engine.max_model_len, engine.max_num_batched_tokens) <= MAX_ENGINE_TOKENS,
             f"engine: max_model_len and max_num_batched_tokens must be at most {MAX_ENGINE_TOKENS}")
    _require(engine.long_prefill_token_threshold >= 0, "engine.long_prefill_token_threshold must be >= 0")
    _require(0.0 <= engine.watermark < 1.0, "engine.watermark must be in [0, 1)")


def check_state(state: InstanceState) -> None:
    """Raises InvalidState unless the replay can run on `state` (the compiled core checks the same)."""
    engine = state.engine
    check_engine(engine)
    _require(len(state.running) <= engine.max_num_seqs,
             f"{len(state.running)} running requests, more than engine.max_num_seqs ({engine.max_num_seqs})")
    _require(0 <= state.free_blocks <= engine.num_gpu_blocks, "free_blocks must be in [0, num_gpu_blocks]")
    for queue, requests in (("running", state.running), ("waiting", state.waiting)):
        for index, request in enumerate(requests):
            problem = _resident_problem(request, engine, waiting=queue == "waiting")
            _require(problem is None, f"{queue}[{index}] (id {request.id!r}): {problem}")
            _require(request.num_free_blocks_ahead + request.num_evictable_blocks <= state.free_blocks,
                     f"{queue}[{index}] (id {request.id!r}): num_free_blocks_ahead + num_evictable_blocks exceed "
                     f"free_blocks ({state.free_blocks})")
    # a shared block is a whole block of its holders' computed tokens
    shareable = sum(r.num_computed_tokens // engine.block_size for r in state.running)
    _require(0 <= state.shared_blocks <= shareable,
             f"shared_blocks must be in [0, {shareable}] (the running requests' full computed blocks), "
             f"got {state.shared_blocks}")
    held = state.free_blocks + sum(r.num_allocated_blocks for r in state.running) - state.shared_blocks
    _require(held <= engine.num_gpu_blocks,
             "running requests' blocks (shared ones once) + free_blocks exceed num_gpu_blocks")
    ids = [r.id for r in state.running] + [r.id for r in state.waiting]
    twice = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    _require(not twice, f"request ids must be unique: {', '.join(map(repr, twice))} more than once")


def check_query(query: Query, state: InstanceState, arrivals: Sequence[Arrival] = (), cached_tokens: int = 0) -> None:
    """Checks the query, the prompt tokens the instance's prefix cache holds for it and the arrivals."""
    _require(query.num_prompt_tokens >= 1, "query.num_prompt_tokens must be >= 1")
    _require(query.output_tokens >= 1, "query.output_tokens must be >= 1")
    check_query_cached_tokens(cached_tokens, query)
    taken = {r.id for r in state.running} | {r.id for r in state.waiting}
    _require(query.id not in taken, f"query.id {query.id!r} is also a resident request's id")
    check_arrivals(arrivals, state.engine, taken | {query.id})


def check_query_cached_tokens(cached_tokens: int, query: Query) -> None:
    _require(0 <= cached_tokens <= query.num_prompt_tokens,
             f"query_cached_tokens must be in [0, query.num_prompt_tokens] ({query.num_prompt_tokens}), "
             f"got {cached_tokens}")


def check_arrivals(arrivals: Sequence[Arrival], engine: EngineConfig, taken_ids: AbstractSet[str]) -> None:
    seen = set(taken_ids)
    for index, arrival in enumerate(arrivals):
        request = arrival.request
        _require(math.isfinite(arrival.time_s), f"arrivals[{index}].time_s must be finite")
        problem = _resident_problem(request, engine, waiting=True)
        _require(problem is None, f"arrivals[{index}] (id {request.id!r}): {problem}")
        _require(not request.num_evictable_blocks and not request.num_free_blocks_ahead,
                 f"arrivals[{index}] (id {request.id!r}): an arrival has no blocks in the free queue "
                 "(num_evictable_blocks, num_free_blocks_ahead)")
        _require(request.id not in seen, f"arrivals[{index}]: id {request.id!r} is already taken")
        seen.add(request.id)


def _resident_problem(request: ResidentRequest, engine: EngineConfig, *, waiting: bool) -> str | None:
    counts = (request.num_computed_tokens, request.num_output_tokens, request.num_allocated_blocks)
    if request.num_prompt_tokens < 1:
        return "num_prompt_tokens must be >= 1"
    if min(counts) < 0 or request.num_output_placeholders < 0:
        return "token and block counts must be non-negative"
    if not 0 <= request.cached_tokens <= request.num_tokens:
        return "cached_tokens must be in [0, num_prompt_tokens + num_output_tokens]"
    if request.num_evictable_blocks or request.num_free_blocks_ahead:
        problem = _evictable_problem(request, engine, waiting=waiting)
        if problem is not None:
            return problem
    if request.remaining_output_tokens < 1:
        return "remaining_output_tokens must be >= 1 (a request with nothing left to generate has finished)"
    if request.num_computed_tokens > request.num_tokens + request.num_output_placeholders - (0 if waiting else 1):
        return "more computed tokens than the request has (a running request always has a token left to compute)"
    if request.num_tokens >= engine.max_model_len:
        return "prompt + output tokens must be shorter than max_model_len"
    if request.max_tokens is not None and not request.num_output_tokens < request.max_tokens:
        return "num_output_tokens must be below max_tokens (the request would have finished)"
    if request.num_allocated_blocks < -(-request.num_computed_tokens // engine.block_size):
        return "fewer blocks than its computed tokens need"
    if waiting and (request.num_computed_tokens or request.num_allocated_blocks or request.num_output_placeholders):
        return "a waiting request holds no computed tokens, blocks or placeholders"
    return None


def _evictable_problem(request: ResidentRequest, engine: EngineConfig, *, waiting: bool) -> str | None:
    if not engine.enable_prefix_caching:
        return "num_evictable_blocks and num_free_blocks_ahead need engine.enable_prefix_caching"
    if not waiting:
        return "num_evictable_blocks and num_free_blocks_ahead are a waiting request's"
    if min(request.num_evictable_blocks, request.num_free_blocks_ahead) < 0:
        return "num_evictable_blocks and num_free_blocks_ahead must be non-negative"
    if request.num_evictable_blocks * engine.block_size > request.cached_tokens:
        return "num_evictable_blocks exceeds the blocks behind cached_tokens"
    if request.num_free_blocks_ahead + request.num_evictable_blocks > engine.num_gpu_blocks:
        return "num_free_blocks_ahead + num_evictable_blocks exceed engine.num_gpu_blocks"
    return None


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidState(message)
