"""Prefix-cache hits at admission (`cached_tokens`, `query_cached_tokens`), for both engines."""

from __future__ import annotations

import dataclasses
import re

import pytest

from bear.core.reference import ReferenceScheduler
from bear.core.replay import ReplayEngine, Target, estimate, estimate_many, prepare
from bear.core.state import Arrival, InstanceState, InvalidState, ResidentRequest
from tests.builders import COEFFICIENTS, decoding, make_engine, make_query, make_state, queued, run, scheduled

ENGINES = [ReplayEngine.NATIVE, ReplayEngine.REFERENCE]


@pytest.fixture(params=ENGINES, ids=lambda e: e.value)
def engine(request: pytest.FixtureRequest) -> ReplayEngine:
    return request.param


def cached(request: ResidentRequest, tokens: int) -> ResidentRequest:
    return dataclasses.replace(request, cached_tokens=tokens)


def test_a_cached_prefix_leaves_only_the_rest_to_prefill(engine: ReplayEngine) -> None:
    idle = make_state(engine=make_engine(block_size=8))
    query = make_query(prompt=4000)
    assert scheduled(run(idle, query, engine)) == [{"q": 2048}, {"q": 1952}]
    hit = run(idle, query, engine, query_cached_tokens=3000)
    assert scheduled(hit) == [{"q": 1000}] and hit.first_token_batch == 1
    # the chunk attends to the 3000 cached tokens as context (eq. 12): 1000·3000 + 1000·1001/2
    features = hit.batches[0].features
    assert (features.num_prefill_tokens, features.prefill_attention) == (1000, 3_000_000 + 500_500)


def test_the_hit_is_whole_blocks(engine: ReplayEngine) -> None:
    idle = make_state()  # 16-token blocks
    assert scheduled(run(idle, make_query(prompt=4000), engine, query_cached_tokens=1000)) == [{"q": 2048}, {"q": 960}]
    assert scheduled(run(idle, make_query(prompt=4000), engine, query_cached_tokens=15)) == [{"q": 2048}, {"q": 1952}]


def test_an_identical_prompt_still_computes_its_last_token(engine: ReplayEngine) -> None:
    idle = make_state()
    # at most num_tokens - 1 cached, rounded down to blocks: 3999 -> 3984
    assert scheduled(run(idle, make_query(prompt=4000), engine, query_cached_tokens=4000)) == [{"q": 16}]
    # 4000 of 4001 are whole blocks: one token is left, and a step of one token counts as a decode
    one = run(idle, make_query(prompt=4001), engine, query_cached_tokens=4001)
    assert scheduled(one) == [{"q": 1}] and one.first_token_batch == 1
    features = one.batches[0].features
    assert (features.num_decode_tokens, features.decode_context, features.prefill_attention) == (1, 4000, 0)


def test_chunks_after_the_hit_attend_to_it_and_to_each_other(engine: ReplayEngine) -> None:
    result = run(make_state(engine=make_engine(block_size=8)), make_query(prompt=5000), engine,
                 query_cached_tokens=1000)
    assert scheduled(result) == [{"q": 2048}, {"q": 1952}]
    first, second = (b.features.prefill_attention for b in result.batches)
    assert first == 2048 * 1000 + 2048 * 2049 // 2
    assert second == 1952 * 3048 + 1952 * 1953 // 2


def test_waiting_requests_and_arrivals_take_their_hits_when_admitted(engine: ReplayEngine) -> None:
    state = make_state(waiting=[cached(queued("w", prompt=3000), 2048)])
    arrival = Arrival(0.0, cached(queued("x", prompt=500), 480))
    result = run(state, make_query(prompt=1500), engine, arrivals=[arrival])
    assert scheduled(result) == [{"w": 952, "x": 20, "q": 1076}, {"w": 1, "x": 1, "q": 424}]
    plain = run(make_state(waiting=[queued("w", prompt=3000)]), make_query(prompt=1500), engine,
                arrivals=[Arrival(0.0, queued("x", prompt=500))])
    assert scheduled(plain)[:2] == [{"w": 2048}, {"w": 952, "x": 500, "q": 596}]


def test_a_preempted_running_request_takes_its_hit_when_admitted_again(engine: ReplayEngine) -> None:
    # 20 blocks, 1 free: a's next block takes it, so b (needing one too) preempts itself and waits for a's end.
    state = make_state(running=[decoding("a", prompt=160, remaining=4), cached(decoding("b", prompt=144), 100)],
                       engine=make_engine(num_gpu_blocks=20))
    result = run(state, make_query(prompt=50), engine)
    steps = scheduled(result)
    assert steps[0] == {"a": 1} and result.num_preemptions == 1
    # back from scratch: 145 tokens (prompt and its one output), 96 of them cached (whole blocks of 100)
    assert steps[-1] == {"b": 49, "q": 50}
    uncached = make_state(running=[decoding("a", prompt=160, remaining=4), decoding("b", prompt=144)],
                          engine=make_engine(num_gpu_blocks=20))
    assert scheduled(run(uncached, make_query(prompt=50), engine))[-1] == {"b": 145, "q": 50}


@pytest.mark.parametrize(("remaining", "resumed"), [(4, {"b": 1, "q": 50}), (40, {"b": 33, "q": 50})])
def test_with_prefix_caching_a_preempted_request_resumes_from_its_blocks_still_cached(
        engine: ReplayEngine, remaining: int, resumed: dict[str, int]) -> None:
    """b (144 + 1 tokens, 9 full blocks) preempts itself at once; its blocks go to the back of vLLM's free queue, the
    only free blocks. If a finishes within its block, b finds all 9 again (144 tokens: one left to compute); if a
    grows by two more blocks first, those come from the front of the queue: b's last two, so 7 are left (112)."""
    for prefix_caching, last in ((False, {"b": 145, "q": 50}), (True, resumed)):
        state = make_state(running=[decoding("a", prompt=160, remaining=remaining), decoding("b", prompt=144)],
                           engine=make_engine(num_gpu_blocks=20, enable_prefix_caching=prefix_caching))
        result = run(state, make_query(prompt=50), engine)
        assert result.num_preemptions == 1 and scheduled(result)[-1] == last


def test_blocks_freed_after_a_preemption_go_ahead_of_the_cached_ones_only_if_they_cached_nothing(
        engine: ReplayEngine) -> None:
    """b (400 + 1 tokens, 25 full blocks) preempts itself and, with the watermark, waits for c's end. Meanwhile a
    finishes: its full block goes behind b's, its partial one ahead of them. c then grows by three blocks: the first
    is a's partial one, the other two b's last two: b resumes from 23 blocks (368 tokens), 33 tokens to compute."""
    state = make_state(running=[decoding("a", prompt=20, remaining=2), decoding("c", prompt=160, remaining=60),
                                decoding("b", prompt=400)],
                       engine=make_engine(num_gpu_blocks=38, watermark=0.1, enable_prefix_caching=True))
    result = run(state, make_query(prompt=50), engine)
    assert result.num_preemptions == 1
    assert next(step for step in scheduled(result) if "b" in step)["b"] == 401 - 23 * 16


def test_the_cached_blocks_still_come_from_the_free_pool(engine: ReplayEngine) -> None:
    # Conservative (exact when the cached blocks are free, not held by a running request): the head of the queue
    # needs its whole sequence's blocks free, however much of it is cached.
    state = make_state(running=[decoding("a", prompt=16 * 9, remaining=3)], engine=make_engine(num_gpu_blocks=20))
    result = run(state, make_query(prompt=16 * 12), engine, query_cached_tokens=16 * 11)
    assert scheduled(result)[:3] == [{"a": 1}] * 3  # 10 free blocks, 12 needed: it waits for a's end
    assert scheduled(result)[3] == {"q": 16} and result.first_token_batch == 4


def test_one_query_has_a_hit_of_its_own_on_each_instance() -> None:
    idle = prepare(make_state(engine=make_engine(block_size=8)))
    query = make_query(prompt=4000)
    targets = [Target(idle, COEFFICIENTS, query_cached_tokens=3000), Target(idle, COEFFICIENTS)]
    many = estimate_many(query, targets)
    assert [r.first_token_batch for r in many] == [1, 2]
    assert many == [estimate(t.prepared, query, t.coefficients, query_cached_tokens=t.query_cached_tokens)
                    for t in targets]
    reference = run(idle.state, query, ReplayEngine.REFERENCE, query_cached_tokens=3000)
    assert many[0].ttft_s == reference.ttft_s


@pytest.mark.parametrize(
    ("state", "options", "message"),
    [
        (make_state(waiting=[cached(queued("w", prompt=100), 101)]), {},
         "waiting[0] (id 'w'): cached_tokens must be in [0, num_prompt_tokens + num_output_tokens]"),
        (make_state(running=[cached(decoding("a"), -1)]), {},
         "running[0] (id 'a'): cached_tokens must be in [0, num_prompt_tokens + num_output_tokens]"),
        (make_state(), {"arrivals": [Arrival(0.0, cached(queued("x", prompt=10), 11))]},
         "arrivals[0] (id 'x'): cached_tokens must be in [0, num_prompt_tokens + num_output_tokens]"),
        (make_state(), {"query_cached_tokens": 101},
         "query_cached_tokens must be in [0, query.num_prompt_tokens] (100), got 101"),
        (make_state(), {"query_cached_tokens": -1},
         "query_cached_tokens must be in [0, query.num_prompt_tokens] (100), got -1"),
    ],
    ids=["waiting-above-its-tokens", "running-negative", "arrival-above-its-tokens", "query-above-prompt", "query-negative"],
)
def test_cached_tokens_beyond_the_request_are_refused(engine: ReplayEngine, state: InstanceState,
                                                     options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidState, match=re.escape(message)):
        run(state, make_query(prompt=100), engine, **options)


def test_a_target_with_too_many_cached_query_tokens_is_refused() -> None:
    target = Target(prepare(make_state()), COEFFICIENTS, query_cached_tokens=101)
    with pytest.raises(InvalidState, match=re.escape("query_cached_tokens must be in [0, query.num_prompt_tokens]")):
        estimate_many(make_query(prompt=100), [target])


def test_the_native_core_refuses_them_too() -> None:
    """bear.core.state checks first on every path; the compiled core checks the same itself."""
    import numpy as np

    from bear.core import _native
    from bear.core.replay import _native_coefficients, _table

    state = make_state(waiting=[cached(queued("w", prompt=100), 101)])
    engine = _native.EngineConfig()
    for field in dataclasses.fields(state.engine):
        setattr(engine, field.name, getattr(state.engine, field.name))
    with pytest.raises(ValueError, match=re.escape("waiting[0]: cached_tokens must be in [0, num_prompt_tokens + num_output_tokens]")):
        _native.PreparedState(engine, state.free_blocks, _table(()), _table(state.waiting))
    prepared = _native.PreparedState(engine, state.free_blocks, _table(()), _table(()))
    replay_args = (_native_coefficients(COEFFICIENTS), float("inf"), False, True, 1000, 0.0, 0.0)
    with pytest.raises(ValueError, match=re.escape("query: cached_tokens must be in [0, num_prompt_tokens]")):
        _native.replay(prepared, _native.Query(100, 1, cached_tokens=101), *replay_args, [])
    arrivals = _native.arrivals(np.zeros(1), _table(state.waiting))
    with pytest.raises(ValueError, match=re.escape("arrival: cached_tokens must be in [0, num_prompt_tokens + num_output_tokens]")):
        _native.replay(prepared, _native.Query(100, 1), *replay_args, arrivals)


def preempted_before(request: ResidentRequest, cached_blocks: int, evictable: int, ahead: int) -> ResidentRequest:
    """A waiting request vLLM preempted before the state: `cached_blocks` of its blocks still cached, the last
    `evictable` of them in the free queue behind `ahead` free blocks."""
    return dataclasses.replace(request, cached_tokens=cached_blocks * 16, num_evictable_blocks=evictable,
                               num_free_blocks_ahead=ahead)


@pytest.mark.parametrize(
    ("cached_blocks", "evictable", "ahead", "remaining", "resumed"),
    [
        (9, 9, 1, 4, 1),  # a's next block is the one ahead of b's: b finds all 9 (144 tokens)
        (9, 9, 0, 4, 17),  # it is b's last: 8 left (128)
        (9, 9, 1, 40, 33),  # a grows by two blocks more: b's last two go, 7 left (112)
        (9, 5, 0, 40, 49),  # b's first 4 are held by a running request: of its 5 free ones 3 go, 6 left (96)
        (0, 0, 0, 4, 145),  # nothing of b cached: from scratch
    ],
)
def test_a_request_preempted_before_the_state_resumes_from_its_blocks_left(
        engine: ReplayEngine, cached_blocks: int, evictable: int, ahead: int, remaining: int, resumed: int) -> None:
    """b (144 + 1 tokens) waits, preempted by vLLM, until a finishes (the whole sequence must fit the free blocks);
    every block a grows by comes from the front of the free queue, where b's cached blocks wait behind `ahead`."""
    b = preempted_before(queued("b", prompt=144, output=1), cached_blocks, evictable, ahead)
    state = make_state(running=[decoding("a", prompt=160, remaining=remaining)], waiting=[b],
                       engine=make_engine(num_gpu_blocks=20, enable_prefix_caching=True))
    assert state.free_blocks == 10
    steps = scheduled(run(state, make_query(prompt=50), engine))
    assert next(step for step in steps if "b" in step) == {"b": resumed, "q": 50}


def test_requests_preempted_before_the_state_lose_blocks_in_their_order_in_the_queue(engine: ReplayEngine) -> None:
    """c's blocks are ahead of b's (b is first in the waiting queue): a's next block is the one ahead of c's, and the
    block b takes besides its 4 found again is c's last: c resumes from 3 (48 tokens), b from all of its own."""
    b = preempted_before(queued("b", prompt=64, output=1), 4, 4, 6)
    c = preempted_before(queued("c", prompt=64, output=1), 4, 4, 1)
    state = make_state(running=[decoding("a", prompt=224, remaining=20)], waiting=[b, c],
                       engine=make_engine(num_gpu_blocks=26, enable_prefix_caching=True))
    assert state.free_blocks == 12
    steps = scheduled(run(state, make_query(prompt=50), engine))
    assert steps[0] == {"a": 1, "b": 1, "c": 65 - 3 * 16}


def test_a_request_resuming_takes_out_blocks_only_of_those_behind_its_own(engine: ReplayEngine) -> None:
    """c, first in the queue, has its blocks behind b's: taking them out of the free queue leaves b's where they
    were, so the block c takes besides its own is still one ahead of b's, and b resumes from all of its own."""
    b = preempted_before(queued("b", prompt=64, output=1), 4, 4, 3)
    c = preempted_before(queued("c", prompt=64, output=1), 4, 4, 7)
    state = make_state(running=[decoding("a", prompt=224, remaining=20)], waiting=[c, b],
                       engine=make_engine(num_gpu_blocks=26, enable_prefix_caching=True))
    assert scheduled(run(state, make_query(prompt=50), engine))[0] == {"a": 1, "c": 1, "b": 1}


@pytest.mark.parametrize(
    ("state", "arrivals", "message"),
    [
        (make_state(waiting=[preempted_before(queued("w", prompt=100), 4, 2, 0)]), [],
         "waiting[0] (id 'w'): num_evictable_blocks and num_free_blocks_ahead need engine.enable_prefix_caching"),
        (make_state(waiting=[preempted_before(queued("w", prompt=100), 2, 3, 0)],
                    engine=make_engine(enable_prefix_caching=True)), [],
         "waiting[0] (id 'w'): num_evictable_blocks exceeds the blocks behind cached_tokens"),
        (make_state(waiting=[preempted_before(queued("w", prompt=100), 4, 4, 997)],
                    engine=make_engine(enable_prefix_caching=True)), [],
         "waiting[0] (id 'w'): num_free_blocks_ahead + num_evictable_blocks exceed engine.num_gpu_blocks"),
        (make_state(waiting=[preempted_before(queued("w", prompt=100), 4, 4, 96)], free_blocks=99,
                    engine=make_engine(enable_prefix_caching=True)), [],
         "waiting[0] (id 'w'): num_free_blocks_ahead + num_evictable_blocks exceed free_blocks (99)"),
        (make_state(engine=make_engine(enable_prefix_caching=True)),
         [Arrival(0.0, preempted_before(queued("x", prompt=100), 4, 4, 0))],
         "arrivals[0] (id 'x'): an arrival has no blocks in the free queue"),
    ],
    ids=["no-prefix-caching", "more-than-cached", "beyond-the-cache", "beyond-the-free-blocks", "arrival"],
)
def test_inconsistent_cached_blocks_are_refused(engine: ReplayEngine, state: InstanceState,
                                                arrivals: list[Arrival], message: str) -> None:
    with pytest.raises(InvalidState, match=re.escape(message)):
        run(state, make_query(prompt=100), engine, arrivals=arrivals)


def test_the_reference_states_what_is_left_of_a_preempted_requests_blocks() -> None:
    """ReferenceScheduler.state() after a step: b's blocks as the step left them, a state the replay takes again."""
    b = preempted_before(queued("b", prompt=144, output=1), 9, 9, 0)
    state = make_state(running=[decoding("a", prompt=160, remaining=40)], waiting=[b],
                       engine=make_engine(num_gpu_blocks=20, enable_prefix_caching=True))
    scheduler = ReferenceScheduler(state)
    scheduler.step()  # a takes a block from the front: b's last
    after = scheduler.state().waiting[0]
    assert (after.cached_tokens, after.num_evictable_blocks, after.num_free_blocks_ahead) == (128, 8, 0)
    assert scheduler.state().free_blocks == 9
    prepare(scheduler.state())
