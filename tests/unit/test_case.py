"""The case format: its mapping onto vLLM's state, and a clear error naming the field for every bad input."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from bear.core.case import CaseError, case_to_json, parse_case, result_to_json
from bear.core.replay import replay

EXAMPLE: dict[str, Any] = {
    "engine": {"max_num_batched_tokens": 2048, "max_num_seqs": 256, "block_size": 16, "num_gpu_blocks": 2000,
               "enable_chunked_prefill": True, "long_prefill_token_threshold": 0, "max_model_len": 32768,
               "scheduler_reserve_full_isl": True, "watermark": 0.0, "async_scheduling": False},
    "free_blocks": 1234,
    "running": [{"id": "a", "num_prompt_tokens": 900, "num_computed_tokens": 900, "num_output_tokens": 3,
                 "remaining_output_tokens": 40, "num_allocated_blocks": 57}],
    "waiting": [{"id": "b", "num_prompt_tokens": 300, "num_computed_tokens": 0, "num_output_tokens": 0,
                 "remaining_output_tokens": 12}],
    "query": {"id": "q", "num_prompt_tokens": 700, "output_tokens": 50},
    "batch_time": {"b0": 0.004, "b1": 2e-5, "b2": 1e-8, "b3": 1e-9},
}


def _with(path: str, value: Any) -> dict[str, Any]:
    case = copy.deepcopy(EXAMPLE)
    *parents, last = path.split(".")
    node: Any = case
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return case


_DELETE = object()
HUGE = int("9" * 400)  # beyond a double's range


def test_the_example_case_replays() -> None:
    case = parse_case(EXAMPLE)
    running = case.state.running[0]
    assert running.num_computed_tokens == 902  # decoding: vLLM has computed all but its last output token
    result = result_to_json(replay(case.state, case.query, case.coefficients, record_batches=True))
    assert result["status"] == "first_token" and result["feasible"]
    assert result["first_token_batch"] == 1
    assert result["batches"][0]["scheduled"] == {"a": 1, "b": 300, "q": 700}
    assert result["ttft_s"] == pytest.approx(result["batches"][0]["time_s"])
    json.dumps(result)


def test_a_preempted_requests_own_blocks_still_cached_are_read_and_written_back() -> None:
    document = _with("engine.enable_prefix_caching", True)
    document["waiting"][0].update(num_output_tokens=20, cached_tokens=320, num_evictable_blocks=15,
                                  num_free_blocks_ahead=7)
    waiting = parse_case(document).state.waiting[0]
    assert (waiting.cached_tokens, waiting.num_evictable_blocks, waiting.num_free_blocks_ahead) == (320, 15, 7)
    written = case_to_json(parse_case(document))["waiting"][0]
    assert {key: written[key] for key in ("cached_tokens", "num_evictable_blocks", "num_free_blocks_ahead")} == {
        "cached_tokens": 320, "num_evictable_blocks": 15, "num_free_blocks_ahead": 7}


def test_cached_tokens_of_requests_and_the_query_are_read_and_replayed() -> None:
    document = _with("waiting.0.cached_tokens", 288)
    document["query"]["cached_tokens"] = 640
    case = parse_case(document)
    assert (case.state.waiting[0].cached_tokens, case.query_cached_tokens) == (288, 640)
    result = replay(case.state, case.query, case.coefficients, query_cached_tokens=case.query_cached_tokens,
                    record_batches=True)
    assert result_to_json(result)["batches"][0]["scheduled"] == {"a": 1, "b": 12, "q": 60}
    assert parse_case(EXAMPLE).query_cached_tokens == 0 and parse_case(EXAMPLE).state.waiting[0].cached_tokens == 0


def test_a_prefilling_request_keeps_its_computed_tokens() -> None:
    case = parse_case(_with("running.0.num_computed_tokens", 512))
    assert case.state.running[0].num_computed_tokens == 512


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("engine.max_num_batched_tokens", 0, "engine.max_num_batched_tokens: must be >= 1"),
        ("engine.block_size", _DELETE, "engine.block_size: missing"),
        ("engine.watermark", 1.0, "engine.watermark"),
        ("engine.async_scheduling", "yes", "engine.async_scheduling: must be true or false"),
        ("engine.speculative", 3, "engine.speculative: unknown key"),
        ("free_blocks", -1, "free_blocks: must be >= 0"),
        ("running.0.num_computed_tokens", 901, "running[0].num_computed_tokens: 901 exceeds num_prompt_tokens"),
        ("running.0.num_output_tokens", -2, "running[0].num_output_tokens: must be >= 0"),
        ("running.0.num_allocated_blocks", _DELETE, "running[0].num_allocated_blocks: missing"),
        ("running.0.num_allocated_blocks", 3, "running[0] (id 'a'): fewer blocks than its computed tokens need"),
        ("running.0.remaining_output_tokens", 0, "running[0].remaining_output_tokens: must be >= 1"),
        ("running.0.num_output_placeholders", 1, "running[0].num_output_placeholders"),
        ("running.0.num_prompt_tokens", 900.0, "running[0].num_prompt_tokens: must be an integer"),
        ("waiting.0.num_computed_tokens", 10, "waiting[0].num_computed_tokens: must be 0"),
        ("waiting.0.id", "a", "request ids must be unique: 'a' more than once"),
        ("waiting.0.colour", "red", "waiting[0].colour: unknown key"),
        ("query.id", "b", "query.id 'b' is also a resident request's id"),
        ("query.output_tokens", 0, "query.output_tokens: must be >= 1"),
        ("query.cached_tokens", 701, "query.cached_tokens: 701 exceeds num_prompt_tokens (700)"),
        ("waiting.0.cached_tokens", 301,
         "waiting[0].cached_tokens: 301 exceeds num_prompt_tokens + num_output_tokens (300)"),
        ("waiting.0.num_evictable_blocks", 2,
         "waiting[0].num_evictable_blocks: only a waiting request's, with engine.enable_prefix_caching"),
        ("running.0.num_free_blocks_ahead", 2,
         "running[0].num_free_blocks_ahead: only a waiting request's, with engine.enable_prefix_caching"),
        ("waiting.0.num_free_blocks_ahead", -1, "waiting[0].num_free_blocks_ahead: must be >= 0"),
        ("running.0.cached_tokens", -1, "running[0].cached_tokens: must be >= 0"),
        ("batch_time.b2", -1e-9, "batch_time.b2: must be >= 0"),
        ("horizon_s", 0, "horizon_s: must be > 0"),

        ("free_blocks", 1950, "exceed num_gpu_blocks"),
        ("extra", 1, "case.extra: unknown key"),
    ],
)
def test_bad_input_names_the_field(path: str, value: Any, message: str) -> None:
    from bear.core.state import InvalidState

    with pytest.raises((CaseError, InvalidState), match=re.escape(message)):
        case = parse_case(_with(path, value))
        replay(case.state, case.query, case.coefficients)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("horizon_s", HUGE, "horizon_s: must be a finite number, got an integer of 400 digits"),
        ("batch_time.b0", HUGE, "batch_time.b0: must be a finite number, got an integer of 400 digits"),
        ("engine.watermark", -HUGE, "engine.watermark: must be a finite number"),
        ("free_blocks", HUGE, "free_blocks: must be below 2**31, got an integer of 400 digits"),
        ("free_blocks", [[[[1]]]], "free_blocks: must be an integer, got a JSON array"),
    ],
    ids=["huge-horizon", "huge-b0", "huge-negative-watermark", "huge-free-blocks", "nested-array"],
)
def test_a_value_beyond_a_double_or_nested_is_refused_in_a_short_message(path: str, value: Any, message: str) -> None:
    with pytest.raises(CaseError, match=re.escape(message)) as raised:
        parse_case(_with(path, value))
    assert len(str(raised.value)) < 120


@pytest.mark.parametrize("engine", ["native", "reference"])
def test_states_vllm_never_has_are_refused_by_both_engines(engine: str) -> None:
    """(QA: a block_size of 2**28 took the compiled core 6 GB, 2**30 a bad_alloc traceback; 5 running requests under
    max_num_seqs 2 were replayed as if allowed.)"""
    from bear.core.replay import ReplayEngine
    from bear.core.state import InvalidState

    huge_blocks = parse_case(_with("engine.block_size", 2**20))
    with pytest.raises(InvalidState, match="engine.block_size must be at most 65536"):
        replay(huge_blocks.state, huge_blocks.query, huge_blocks.coefficients, engine=ReplayEngine(engine))
    crowded = _with("engine.max_num_seqs", 1)
    crowded["running"].append(dict(crowded["running"][0], id="a2"))
    case = parse_case(crowded)
    with pytest.raises(InvalidState, match=r"2 running requests, more than engine.max_num_seqs \(1\)"):
        replay(case.state, case.query, case.coefficients, engine=ReplayEngine(engine))
    # (QA: a budget and max_model_len of 2**32 - 1 overflowed a step's features in the core: a negative TTFT)
    for name in ("engine.max_model_len", "engine.max_num_batched_tokens"):
        vast = parse_case(_with(name, 2**28 + 1))
        with pytest.raises(InvalidState, match="max_model_len and max_num_batched_tokens must be at most 268435456"):
            replay(vast.state, vast.query, vast.coefficients, engine=ReplayEngine(engine))


def test_the_native_core_refuses_them_too() -> None:
    """bear.core.state.check_state is checked first on every path; the compiled core checks the same itself."""
    import dataclasses

    from bear.core import _native
    from bear.core.replay import _table

    crowded = _with("engine.max_num_seqs", 1)
    crowded["running"].append(dict(crowded["running"][0], id="a2"))
    for case, message in ((parse_case(_with("engine.block_size", 2**20)), "block_size must be at most 65536"),
                          (parse_case(crowded), "more running requests than engine.max_num_seqs"),
                          (parse_case(_with("engine.max_model_len", 2**28 + 1)), "must be at most 268435456")):
        engine = _native.EngineConfig()
        for field in dataclasses.fields(case.state.engine):
            setattr(engine, field.name, getattr(case.state.engine, field.name))
        with pytest.raises(ValueError, match=message):
            _native.PreparedState(engine, case.state.free_blocks, _table(case.state.running),
                                  _table(case.state.waiting))


def test_not_an_object() -> None:
    with pytest.raises(CaseError, match="case: must be a JSON object"):
        parse_case([1, 2])


def test_coefficients_whose_batch_times_overflow_are_refused_not_printed_as_infinity() -> None:
    case = parse_case(_with("batch_time", {"b0": 1e308, "b1": 1e308, "b2": 1e308, "b3": 1e308}))
    result = replay(case.state, case.query, case.coefficients, record_batches=True)
    with pytest.raises(CaseError, match="batch_time: the coefficients are too large"):
        result_to_json(result)


def test_lengths_past_64_bits_replay_alike_on_both_engines() -> None:
    """(QA: the compiled core raised a raw OverflowError on a query or a resident's remaining output of 2**64 tokens,
    which the reference replays: any length past max_model_len acts alike.)"""
    import dataclasses

    from bear.core.replay import ReplayEngine

    case = parse_case(EXAMPLE)
    resident = dataclasses.replace(case.state.running[0], remaining_output_tokens=2**64, max_tokens=2**70)
    state = dataclasses.replace(case.state, running=(resident, *case.state.running[1:]))
    for query in (dataclasses.replace(case.query, output_tokens=2**64),
                  dataclasses.replace(case.query, num_prompt_tokens=2**64)):
        results = [replay(state, query, case.coefficients, engine=engine) for engine in ReplayEngine]
        assert results[0] == results[1]
