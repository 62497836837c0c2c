"""Each scheduling rule of the replay, on tiny hand-built states, for both engines."""

from __future__ import annotations

import pytest

from bear.core.replay import ReplayEngine
from bear.core.result import ReplayStatus
from bear.core.state import InstanceState, InvalidState
from tests.builders import decoding, make_engine, make_query, make_state, prefilling, queued, run, scheduled

ENGINES = [ReplayEngine.NATIVE, ReplayEngine.REFERENCE]


@pytest.fixture(params=ENGINES, ids=lambda e: e.value)
def engine(request: pytest.FixtureRequest) -> ReplayEngine:
    return request.param


def test_budget_splits_the_query_prompt_and_running_requests_go_first(engine: ReplayEngine) -> None:
    state = make_state(running=[decoding("a"), decoding("b")])
    result = run(state, make_query(prompt=3000), engine)
    assert scheduled(result) == [{"a": 1, "b": 1, "q": 2046}, {"a": 1, "b": 1, "q": 954}]
    assert list(scheduled(result)[0]) == ["a", "b", "q"]
    assert result.first_token_batch == 2
    assert result.ttft_s == pytest.approx(sum(b.time_s for b in result.batches), rel=1e-12)


def test_partial_prefills_of_running_requests_continue_before_admissions(engine: ReplayEngine) -> None:
    state = make_state(running=[prefilling("a", prompt=3000, computed=2048)], waiting=[queued("b", prompt=500)])
    result = run(state, make_query(prompt=200), engine)
    assert scheduled(result)[0] == {"a": 952, "b": 500, "q": 200}
    assert result.first_token_batch == 1


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget(engine: ReplayEngine) -> None:
    state = make_state(running=[decoding("a", remaining=10), decoding("b", remaining=10)],
                       engine=make_engine(enable_chunked_prefill=False))
    result = run(state, make_query(prompt=2047), engine)
    assert result.first_token_batch == 11  # a and b finish after 10 steps; then the whole budget is free
    assert scheduled(result)[10] == {"q": 2047}


def test_long_prefill_threshold_caps_chunks_only_when_others_are_resident(engine: ReplayEngine) -> None:
    capped = make_engine(long_prefill_token_threshold=512)
    crowded = run(make_state(running=[decoding("a", remaining=50)], engine=capped), make_query(prompt=2000), engine)
    assert [b["q"] for b in scheduled(crowded)] == [512, 512, 512, 464]
    alone = run(make_state(engine=capped), make_query(prompt=2000), engine)
    assert scheduled(alone) == [{"q": 2000}]


def test_max_num_seqs_holds_the_query_until_a_running_request_finishes(engine: ReplayEngine) -> None:
    state = make_state(running=[decoding("a", remaining=5), decoding("b", remaining=10)],
                       engine=make_engine(max_num_seqs=2))
    result = run(state, make_query(prompt=100), engine)
    assert result.first_token_batch == 6
    assert scheduled(result)[5] == {"b": 1, "q": 100}


def test_admission_reserves_the_whole_prompt_and_the_queue_head_blocks_the_rest(engine: ReplayEngine) -> None:
    # a holds 7 of 100 blocks; "big" needs 94 > 93 free, so the small query behind it waits too.
    state = make_state(running=[decoding("a", remaining=20)], waiting=[queued("big", prompt=1500)],
                       engine=make_engine(num_gpu_blocks=100))
    result = run(state, make_query(prompt=16), engine)
    assert result.first_token_batch == 21
    assert scheduled(result)[20] == {"big": 1500, "q": 16}


def test_without_full_reservation_only_the_first_chunk_must_fit(engine: ReplayEngine) -> None:
    settings = dict(num_gpu_blocks=100, max_num_batched_tokens=512)
    state = make_state(running=[decoding("a", remaining=20)], waiting=[queued("big", prompt=1500)],
                       engine=make_engine(scheduler_reserve_full_isl=False, **settings))
    assert scheduled(run(state, make_query(prompt=16), engine))[0] == {"a": 1, "big": 511}
    reserved = make_state(running=state.running, waiting=state.waiting, engine=make_engine(**settings))
    assert scheduled(run(reserved, make_query(prompt=16), engine))[0] == {"a": 1}


def test_preemption_evicts_the_latest_admitted_and_blocks_admissions(engine: ReplayEngine) -> None:
    # 7 blocks, none free: a needs an 8th block for its next token, so b (admitted last) is preempted.
    state = make_state(running=[decoding("a", prompt=48, remaining=3), decoding("b", prompt=63, remaining=5)],
                       engine=make_engine(num_gpu_blocks=7), free_blocks=0)
    result = run(state, make_query(prompt=32), engine)
    assert scheduled(result)[0] == {"a": 1}  # b preempted, nothing admitted in that step
    assert result.num_preemptions == 1
    # b recomputes prompt and output (64 tokens, 4 blocks) once a has finished, ahead of the query.
    assert result.first_token_batch == 4
    assert scheduled(result)[3] == {"b": 64, "q": 32}


def test_the_last_admitted_request_preempts_itself_when_it_cannot_grow(engine: ReplayEngine) -> None:
    # a fits its next token; b, admitted last, needs a 5th block with none free: it is its own victim.
    state = make_state(running=[decoding("a", prompt=100, remaining=3), decoding("b", prompt=64, remaining=5)],
                       engine=make_engine(num_gpu_blocks=11), free_blocks=0)
    result = run(state, make_query(prompt=16), engine)
    assert scheduled(result)[:3] == [{"a": 1}, {"a": 1}, {"a": 1}]
    assert result.num_preemptions == 1
    assert scheduled(result)[3] == {"b": 65, "q": 16}
    assert result.first_token_batch == 4


def test_finishing_requests_free_their_blocks_for_the_queue(engine: ReplayEngine) -> None:
    state = make_state(running=[decoding("a", prompt=1000, remaining=3)], engine=make_engine(num_gpu_blocks=70))
    result = run(state, make_query(prompt=1000), engine)
    assert result.first_token_batch == 4  # 63 blocks needed, 7 free until a finishes after 3 steps
    assert result.batches[3].scheduled == (("q", 1000),)


def test_async_scheduling_frees_blocks_one_step_later(engine: ReplayEngine) -> None:
    engine_config = make_engine(num_gpu_blocks=7, async_scheduling=True)
    # a's prefill finished in the step in flight (its first token is a placeholder); one more token after it.
    state = make_state(running=[decoding("a", prompt=100, output=0, remaining=2, placeholders=1)],
                       engine=engine_config)
    result = run(state, make_query(prompt=16), engine)
    assert scheduled(result) == [{"a": 1}, {"a": 1}, {"q": 16}]
    sync = make_state(running=[decoding("a", prompt=100, output=1, remaining=1)], engine=make_engine(num_gpu_blocks=7))
    assert run(sync, make_query(prompt=16), engine).first_token_batch == 2


def test_async_scheduling_skips_a_request_whose_last_allowed_token_is_in_flight(engine: ReplayEngine) -> None:
    engine_config = make_engine(num_gpu_blocks=7, async_scheduling=True)
    capped = decoding("a", prompt=100, output=0, remaining=1, placeholders=1, max_tokens=1)
    result = run(make_state(running=[capped], engine=engine_config), make_query(prompt=16), engine)
    assert scheduled(result) == [{}, {"q": 16}]
    assert result.batches[0].time_s == 0.0  # an empty step runs no forward pass
    stopping = decoding("a", prompt=100, output=0, remaining=1, placeholders=1)  # stops on its own (EOS)
    result = run(make_state(running=[stopping], engine=engine_config), make_query(prompt=16), engine)
    assert scheduled(result) == [{"a": 1}, {"q": 16}]


def test_watermark_applies_only_while_something_runs(engine: ReplayEngine) -> None:
    query = make_query(prompt=85 * 16)  # 85 blocks
    state = make_state(running=[decoding("a", remaining=5)], engine=make_engine(num_gpu_blocks=99, watermark=0.1))
    assert run(state, query, engine).first_token_batch == 6  # 85 + 10 > 92 free; after a finishes no watermark
    plain = make_state(running=[decoding("a", remaining=5)], engine=make_engine(num_gpu_blocks=99))
    assert run(plain, query, engine).first_token_batch == 1


def test_requests_stop_at_max_model_len_and_max_tokens(engine: ReplayEngine) -> None:
    one_slot = dict(max_num_seqs=1)
    near_limit = make_state(running=[decoding("a", prompt=100, remaining=1000)],
                            engine=make_engine(max_model_len=120, **one_slot))
    assert run(near_limit, make_query(prompt=10), engine).first_token_batch == 20
    capped = make_state(running=[decoding("a", prompt=100, remaining=1000, max_tokens=5)],
                        engine=make_engine(**one_slot))
    assert run(capped, make_query(prompt=10), engine).first_token_batch == 5


@pytest.mark.parametrize(
    ("engine_settings", "prompt", "words"),
    [
        (dict(max_model_len=1000), 1000, "max_model_len"),
        (dict(num_gpu_blocks=10), 161, "more than the cache"),
    ],
)
def test_queries_that_can_never_be_admitted_are_infeasible(
    engine: ReplayEngine, engine_settings: dict[str, int], prompt: int, words: str
) -> None:
    result = run(make_state(engine=make_engine(**engine_settings)), make_query(prompt=prompt), engine)
    assert result.status is ReplayStatus.INFEASIBLE and not result.feasible
    assert result.first_token_batch is None and result.ttft_s is None
    assert words in result.reason


def test_a_query_stuck_behind_a_request_that_never_fits_is_infeasible(engine: ReplayEngine) -> None:
    state = make_state(running=[decoding("a", remaining=3)], waiting=[queued("huge", prompt=2000)],
                       engine=make_engine(num_gpu_blocks=100))
    result = run(state, make_query(prompt=16), engine)
    assert result.status is ReplayStatus.INFEASIBLE
    assert result.reason == ("request 'huge' can never be scheduled to completion (it needs more KV blocks than the "
                             "engine can give it), ahead of the query")


def test_a_prompt_longer_than_the_budget_without_chunking_is_infeasible(engine: ReplayEngine) -> None:
    state = make_state(engine=make_engine(enable_chunked_prefill=False))
    result = run(state, make_query(prompt=3000), engine)
    assert result.status is ReplayStatus.INFEASIBLE
    assert result.reason == ("the query can never be scheduled to completion (its 3000 tokens exceed the token budget "
                             "(2048) and chunked prefill is off)")


def test_the_horizon_stops_the_replay_early(engine: ReplayEngine) -> None:
    state = make_state(running=[decoding("a", remaining=500)], engine=make_engine(max_num_seqs=1))
    full = run(state, make_query(prompt=100), engine)
    assert full.first_token_batch == 501
    stopped = run(state, make_query(prompt=100), engine, horizon_s=full.ttft_s / 2)
    assert stopped.status is ReplayStatus.EXCEEDS_HORIZON and stopped.feasible
    assert stopped.first_token_batch is None
    assert full.ttft_s / 2 < stopped.elapsed_s < full.ttft_s
    # It stops at the first batch past the horizon: one batch less would not reach it.
    assert sum(b.time_s for b in stopped.batches[:-1]) <= full.ttft_s / 2


def test_the_first_token_is_sampled_in_the_step_completing_the_prompt(engine: ReplayEngine) -> None:
    state = make_state(engine=make_engine(max_num_batched_tokens=100))
    result = run(state, make_query(prompt=250), engine)
    assert [b["q"] for b in scheduled(result)] == [100, 100, 50]
    assert result.first_token_batch == 3


def _crowded_state(num_residents: int = 160) -> tuple:
    """Residents decoding with staggered lengths, every slot taken: the query waits hundreds of batches."""
    running = [decoding(f"r{i}", prompt=200 + 37 * i % 900, output=1 + i % 13, remaining=500 + (i * 53) % 600)
               for i in range(num_residents)]
    held = sum(r.num_allocated_blocks for r in running)
    engine = make_engine(num_gpu_blocks=held + 50 * num_residents, max_num_seqs=num_residents)
    return make_state(running=running, engine=engine), make_query(prompt=4000, output=100)


def test_long_waits_cost_events_not_batches() -> None:
    state, query = _crowded_state()
    fast = run(state, query, ReplayEngine.NATIVE)
    stepped = run(state, query, ReplayEngine.NATIVE, shortcuts=False)
    reference = run(state, query, ReplayEngine.REFERENCE)
    assert fast.first_token_batch == stepped.first_token_batch == reference.first_token_batch
    assert fast.first_token_batch > 300
    assert fast.ttft_s == stepped.ttft_s == reference.ttft_s
    assert fast.batches == reference.batches
    assert stepped.num_steps == stepped.num_batches
    assert fast.num_steps < fast.num_batches / 5  # most batches were applied in closed form


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_more_decoders_than_the_budget_replay_alike_without_churning_the_shortcuts(async_scheduling: bool) -> None:
    """Residents outnumbering max_num_batched_tokens cannot all decode each step, so they cannot be tracked in
    aggregate (QA: they were made lazy each step and explicit again the next, each time adding an exit entry: 1.66 GB
    and 18 s for 1024 residents at a 512 budget, now 84 MB and 1.5 s). The results equal a step-by-step replay's."""
    running = [decoding(f"r{i}", prompt=100 + i, output=5, remaining=300 + 7 * i) for i in range(96)]
    engine = make_engine(max_num_batched_tokens=64, num_gpu_blocks=5000, async_scheduling=async_scheduling)
    state, query = make_state(running=running, engine=engine), make_query(prompt=700, output=50)
    fast = run(state, query, ReplayEngine.NATIVE)
    stepped = run(state, query, ReplayEngine.NATIVE, shortcuts=False)
    assert fast.first_token_batch == stepped.first_token_batch and fast.first_token_batch > 300
    assert fast.ttft_s == stepped.ttft_s and fast.batches == stepped.batches
    reference = run(state, query, ReplayEngine.REFERENCE)
    assert fast.batches == reference.batches and fast.ttft_s == reference.ttft_s


def test_one_query_against_many_instances_in_one_call() -> None:
    from bear.core.replay import Target, estimate, estimate_many, prepare
    from tests.builders import COEFFICIENTS

    crowded, query = _crowded_state()
    idle = make_state()
    targets = [Target(prepare(crowded), COEFFICIENTS), Target(prepare(idle), COEFFICIENTS, query_time_s=0.5)]
    many = estimate_many(query, targets, horizon_s=10.0)
    one_by_one = [estimate(t.prepared, query, t.coefficients, horizon_s=10.0, query_time_s=t.query_time_s)
                  for t in targets]
    assert many == one_by_one
    assert many[1].first_token_batch == 2 and many[0].first_token_batch > 300


def test_a_query_arriving_mid_step_joins_the_next_scheduled_step(engine: ReplayEngine) -> None:
    from tests.builders import COEFFICIENTS

    state = make_state(running=[decoding("a", remaining=100)])
    result = run(state, make_query(prompt=100), engine, query_time_s=0.01)
    decode_s = COEFFICIENTS.time_s(result.batches[0].features)
    # Sync: step m is scheduled when step m-1 ends; the first scheduled at or after 10 ms is the fourth.
    assert [dict(b.scheduled) for b in result.batches[:3]] == [{"a": 1}] * 3
    assert result.first_token_batch == 4 and "q" in dict(result.batches[3].scheduled)
    ends = sum(b.time_s for b in result.batches)
    assert result.ttft_s == pytest.approx(ends - 0.01, rel=1e-12)
    assert 3 * decode_s >= 0.01 > 2 * decode_s


def test_async_scheduling_misses_the_step_already_scheduled(engine: ReplayEngine) -> None:
    engine_config = make_engine(async_scheduling=True)
    state = make_state(running=[decoding("a", output=0, remaining=100, placeholders=1)], engine=engine_config)
    # The step in flight ends at 2 ms; step 1 was scheduled at 0, so a query at 1 ms joins step 2, which runs
    # after step 1.
    result = run(state, make_query(prompt=100), engine, query_time_s=0.001, in_flight_s=0.002)
    assert [dict(b.scheduled) for b in result.batches] == [{"a": 1}, {"a": 1, "q": 100}]
    assert result.ttft_s == pytest.approx(0.002 + sum(b.time_s for b in result.batches) - 0.001, rel=1e-12)


def test_an_idle_engine_starts_when_the_query_arrives(engine: ReplayEngine) -> None:
    result = run(make_state(), make_query(prompt=500), engine, query_time_s=1.5)
    assert result.first_token_batch == 1
    assert result.ttft_s == pytest.approx(result.batches[0].time_s, rel=1e-12)


def test_requests_dispatched_since_the_state_queue_ahead_of_the_query(engine: ReplayEngine) -> None:
    from bear.core.state import Arrival

    state = make_state(running=[decoding("a", remaining=100)], engine=make_engine(max_num_batched_tokens=600))
    arrivals = [Arrival(0.005, queued("d1", prompt=500)), Arrival(0.0, queued("d0", prompt=50))]
    result = run(state, make_query(prompt=300), engine, query_time_s=0.006, arrivals=arrivals)
    batches = [dict(b.scheduled) for b in result.batches]
    assert batches[0] == {"a": 1, "d0": 50}
    assert batches[1] == {"a": 1, "d0": 1, "d1": 500}  # step 2 is scheduled at ~5.03 ms: d1 (5 ms) is in
    assert batches[2] == {"a": 1, "d0": 1, "d1": 1, "q": 300}  # and the query (6 ms) joins the next one


def test_arrivals_prepared_once_and_extended_replay_as_given_and_are_checked_as_given() -> None:
    """`prepare_arrivals` checks and converts arrivals once (an estimator's dispatches since a snapshot, for many
    queries): the replay of the prepared ones, built in two parts, is that of the same arrivals given as a tuple,
    and what the replay would refuse in a tuple is refused in the preparation."""
    from bear.core.replay import Target, estimate, estimate_many, prepare, prepare_arrivals
    from bear.core.state import Arrival
    from tests.builders import COEFFICIENTS

    state = make_state(running=[decoding("a", remaining=100)], engine=make_engine(max_num_batched_tokens=600))
    prepared, query = prepare(state), make_query(prompt=300)
    arrivals = [Arrival(0.0, queued("d0", prompt=50)), Arrival(0.005, queued("d1", prompt=500)),
                Arrival(0.007, queued("d2", prompt=200))]
    given = estimate(prepared, query, COEFFICIENTS, query_time_s=0.006, arrivals=arrivals)
    first = prepare_arrivals(prepared, arrivals[:1])
    both = prepare_arrivals(prepared, arrivals[1:], after=first)
    assert [a.request.id for a in both] == ["d0", "d1", "d2"] and len(first) == 1  # `first` itself unchanged
    assert estimate(prepared, query, COEFFICIENTS, query_time_s=0.006, arrivals=both) == given
    assert estimate_many(query, [Target(prepared, COEFFICIENTS, 0.006, arrivals=both)]) == [given]
    with pytest.raises(InvalidState, match="'d1' is already taken"):
        prepare_arrivals(prepared, [Arrival(0.008, queued("d1"))], after=both)
    with pytest.raises(InvalidState, match="'a' is already taken"):  # a resident's id
        prepare_arrivals(prepared, [Arrival(0.008, queued("a"))])
    with pytest.raises(InvalidState, match="arrivals\\[0\\].time_s must be finite"):
        prepare_arrivals(prepared, [Arrival(float("nan"), queued("d3"))])
    with pytest.raises(InvalidState, match="also an arrival's id"):
        estimate(prepared, make_query(prompt=300, request_id="d2"), COEFFICIENTS, arrivals=both)
    other = prepare(state)  # the same state, prepared again: another object, whose arrivals these are not
    with pytest.raises(InvalidState, match="prepared for another state"):
        estimate(other, query, COEFFICIENTS, arrivals=both)
    with pytest.raises(InvalidState, match="prepared for another state"):
        prepare_arrivals(other, [], after=both)


def test_a_frozen_state_waits_for_arrivals_then_is_stuck(engine: ReplayEngine) -> None:
    from bear.core.state import Arrival

    # Nothing runs and the head of the queue needs more blocks than are free (two are held elsewhere).
    state = make_state(waiting=[queued("big", prompt=16 * 10)], engine=make_engine(num_gpu_blocks=10), free_blocks=8)
    result = run(state, make_query(prompt=16), engine, query_time_s=0.3, arrivals=[Arrival(0.1, queued("x"))])
    assert result.status is ReplayStatus.INFEASIBLE and "'big'" in result.reason


def test_blocks_shared_through_the_prefix_cache_are_freed_with_their_last_holder(engine: ReplayEngine) -> None:
    # a and b each count 25 blocks, 20 of them the same (b's prompt began like a's): 30 held, 10 of 40 free.
    state = make_state(running=[decoding("a", prompt=390, remaining=3), decoding("b", prompt=390, remaining=6)],
                       engine=make_engine(num_gpu_blocks=40), free_blocks=10)
    state = InstanceState(state.engine, state.free_blocks, state.running, state.waiting, shared_blocks=20)
    result = run(state, make_query(prompt=300), engine)  # needs 19 blocks
    steps = scheduled(result)
    # a's end frees only its own 5 blocks (15 free): the query waits for b's end, which frees the shared ones too
    assert [set(s) for s in steps[:6]] == [{"a", "b"}] * 3 + [{"b"}] * 3
    assert steps[6] == {"q": 300} and result.first_token_batch == 7
    # had nothing been shared (50 blocks held, 10 of 60 free), a's end would have freed 25 for the query
    unshared = InstanceState(make_engine(num_gpu_blocks=60), 10, state.running, state.waiting)
    assert scheduled(run(unshared, make_query(prompt=300), engine))[3] == {"b": 1, "q": 300}


def test_shared_blocks_must_be_whole_computed_blocks_of_the_running_requests() -> None:
    state = make_state(running=[decoding("a", prompt=40, remaining=3)], engine=make_engine(num_gpu_blocks=40))
    for engine in ReplayEngine:
        with pytest.raises(InvalidState, match="shared_blocks"):
            run(InstanceState(state.engine, state.free_blocks, state.running, (), shared_blocks=3), make_query(),
                engine)
