"""Hypothesis strategies for consistent random replay inputs (states vLLM could be in, queries, coefficients)."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from bear.core.batch_time import BatchTimeCoefficients
from bear.core.state import Arrival, EngineConfig, InstanceState, Query, ResidentRequest
from tests.builders import cdiv

# Token counts spread over orders of magnitude, so that long prompts, chunking and KV pressure all happen.
tokens = st.one_of(st.integers(1, 40), st.integers(1, 400), st.integers(1, 4000))


def cached_tokens(prompt: int, block_size: int) -> st.SearchStrategy[int]:
    """Prompt tokens a prefix cache holds for a request: often none; else any part, whole blocks, or all of it."""
    return st.one_of(
        st.just(0), st.just(0), st.just(0),
        st.integers(0, prompt),
        st.integers(0, prompt // block_size).map(lambda blocks: blocks * block_size),
        st.sampled_from(sorted({prompt, max(prompt - 1, 0), prompt // 2})),
    )


@st.composite
def engines(draw: st.DrawFn) -> EngineConfig:
    budget = draw(st.one_of(st.sampled_from([16, 64, 512, 2048, 8192]), st.integers(1, 3000)))
    chunked = draw(st.booleans() | st.just(True))
    return EngineConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=draw(st.integers(1, 64)),
        block_size=draw(st.sampled_from([1, 4, 16, 128])),
        num_gpu_blocks=1,  # replaced once the residents' blocks are known
        max_model_len=draw(st.one_of(st.integers(64, 12000), st.just(32768))),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 0, 1, 7, 256, 1024])),
        scheduler_reserve_full_isl=draw(st.booleans()),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.01, 0.1])),
        async_scheduling=draw(st.booleans()),
        enable_prefix_caching=draw(st.booleans()),  # a preempted request resumes from its blocks still cached
    )


@st.composite
def running_requests(draw: st.DrawFn, name: str, engine: EngineConfig) -> ResidentRequest:
    prompt = min(draw(tokens), engine.max_model_len - 2)
    output = min(draw(st.sampled_from([0, 0, 1, 2, 5, 50])), engine.max_model_len - prompt - 1)
    placeholders = draw(st.sampled_from([0, 1])) if engine.async_scheduling else 0
    kind = draw(st.sampled_from(["decode", "decode", "prefill"])) if prompt + output > 1 else "decode"
    if kind == "decode":
        computed = prompt + output + placeholders - 1
    else:  # part way through its prompt (and, after a preemption, its outputs)
        placeholders = 0
        computed = draw(st.integers(1, max(1, prompt + output - 1)))
    remaining = draw(st.integers(1, 300))
    max_tokens = draw(st.none() | st.integers(output + 1, output + 400))
    blocks = cdiv(computed, engine.block_size) + draw(st.sampled_from([0, 0, 0, 1]))
    cached = draw(cached_tokens(prompt, engine.block_size))  # applies if it is preempted and admitted again
    return ResidentRequest(name, prompt, computed, output, remaining, blocks, max_tokens, placeholders, cached)


@st.composite
def waiting_requests(draw: st.DrawFn, name: str, engine: EngineConfig) -> ResidentRequest:
    prompt = min(draw(tokens), engine.max_model_len - 2)
    output = min(draw(st.sampled_from([0, 0, 0, 1, 30])), engine.max_model_len - prompt - 1)
    max_tokens = draw(st.none() | st.integers(output + 1, output + 400))
    return ResidentRequest(name, prompt, 0, output, draw(st.integers(1, 300)), 0, max_tokens,
                           cached_tokens=draw(cached_tokens(prompt, engine.block_size)))


@st.composite
def states(draw: st.DrawFn) -> InstanceState:
    engine = draw(engines())
    num_running = draw(st.integers(0, min(engine.max_num_seqs, 24)))
    running = tuple(draw(running_requests(f"r{i}", engine)) for i in range(num_running))
    waiting = tuple(draw(waiting_requests(f"w{i}", engine)) for i in range(draw(st.integers(0, 12))))
    held = sum(r.num_allocated_blocks for r in running)
    spare = draw(st.one_of(st.integers(0, 8), st.integers(0, 200), st.integers(0, 3000), st.integers(300, 6000)))
    leaked = draw(st.sampled_from([0, 0, 0, 2]))
    num_gpu_blocks = max(1, held + spare + leaked)
    engine = EngineConfig(**{**{f: getattr(engine, f) for f in engine.__slots__}, "num_gpu_blocks": num_gpu_blocks})
    # prefix caching: some of the running requests' full blocks are held by another running request too
    shareable = sum(r.num_computed_tokens // engine.block_size for r in running)
    shared = draw(st.sampled_from([0, 0, 0, 1]) | st.integers(0, shareable)) if shareable else 0
    shared = min(shared, shareable)
    free = num_gpu_blocks - held - leaked if held + leaked <= num_gpu_blocks else 0
    free += draw(st.sampled_from([0, shared]))
    if engine.enable_prefix_caching:
        waiting = tuple(draw(evictable(r, engine, free)) for r in waiting)
    return InstanceState(engine, free, running, waiting, shared)


@st.composite
def evictable(draw: st.DrawFn, request: ResidentRequest, engine: EngineConfig, free: int) -> ResidentRequest:
    """Often as it is; else a waiting request vLLM preempted, its own blocks still cached: some held by running
    requests, the last ones somewhere in the free queue."""
    if not draw(st.booleans()):
        return request
    cached_blocks = draw(st.integers(0, request.num_tokens // engine.block_size))
    num_evictable = draw(st.integers(0, min(cached_blocks, free)))
    ahead = draw(st.one_of(st.just(0), st.integers(0, free - num_evictable), st.just(free - num_evictable)))
    return dataclasses.replace(request, cached_tokens=cached_blocks * engine.block_size,
                               num_evictable_blocks=num_evictable, num_free_blocks_ahead=ahead if num_evictable else 0)


queries = st.builds(Query, st.just("q"), st.one_of(tokens, tokens, tokens, st.integers(1, 13000)), st.integers(1, 500))

coefficients = st.builds(
    BatchTimeCoefficients,
    st.sampled_from([0.0, 0.004, 1e-3]),
    st.sampled_from([0.0, 2e-5, 3.3e-7]),
    st.sampled_from([0.0, 1e-8, 7.1e-9]),
    st.sampled_from([0.0, 1e-9, 2.9e-10]),
)


@st.composite
def timings(draw: st.DrawFn, state: InstanceState) -> dict[str, object]:
    """When the query arrives after the state, the step in flight (async) and requests dispatched since."""
    times = st.one_of(st.just(0.0), st.floats(0.0, 0.05), st.floats(0.0, 2.0))
    arrivals = tuple(
        Arrival(draw(times), draw(waiting_requests(f"a{i}", state.engine))) for i in range(draw(st.integers(0, 3)))
    )
    in_flight = draw(st.one_of(st.just(0.0), st.floats(0.0, 0.05))) if state.engine.async_scheduling else 0.0
    return {"query_time_s": draw(times), "in_flight_s": in_flight, "arrivals": arrivals}


def query_cached_tokens(state: InstanceState, query: Query) -> st.SearchStrategy[int]:
    """The query's prompt tokens the instance's prefix cache holds (replay's `query_cached_tokens`)."""
    return cached_tokens(query.num_prompt_tokens, state.engine.block_size)
