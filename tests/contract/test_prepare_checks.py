"""`prepare` leaves most of `check_state` to the compiled core's own checks: the same states still pass and fail, with
the same errors, as with `check_state` run first (as `prepare` did before)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bear.core.replay import prepare
from bear.core.state import EngineConfig, InstanceState, InvalidState, ResidentRequest, check_state
from tests.strategies import states

RESIDENT_FIELDS = ("id", "num_prompt_tokens", "num_computed_tokens", "num_output_tokens", "remaining_output_tokens",
                   "num_allocated_blocks", "max_tokens", "num_output_placeholders", "cached_tokens",
                   "num_evictable_blocks", "num_free_blocks_ahead")
ENGINE_FIELDS = ("max_num_batched_tokens", "max_num_seqs", "block_size", "num_gpu_blocks", "max_model_len",
                 "long_prefill_token_threshold", "watermark")


def _outcome(call) -> tuple[type, str] | None:  # noqa: ANN001 - a callable of no arguments
    try:
        call()
    except Exception as error:  # noqa: BLE001 - what is compared is the error itself
        return type(error), re.sub(r" at 0x[0-9a-f]+", "", str(error))  # pybind11 names the object it was given
    return None


def _checked_first(state: InstanceState) -> None:
    check_state(state)
    prepare(state)


def _near(value: int | None) -> st.SearchStrategy[int | None]:
    """Values around a field's own and at the edges of what fits the compiled core's integers."""
    base = value or 0
    return st.one_of(st.integers(base - 3, base + 3), st.integers(-3, 3), st.none(),
                     st.sampled_from([2**31, 2**40, 2**63 - 1, 2**63, -(2**63) - 1]))


@st.composite
def altered_states(draw: st.DrawFn) -> InstanceState:
    """A valid state with one thing changed: a resident's field, an id taken twice, an engine setting, the free or
    shared blocks (most of them no longer valid)."""
    state = draw(states())
    residents = [(queue, i) for queue in ("running", "waiting") for i in range(len(getattr(state, queue)))]
    kinds = ["free_blocks", "shared_blocks", "engine"] + (["resident", "resident", "resident"] if residents else [])
    if len(residents) >= 2:
        kinds.append("same id")
    kind = draw(st.sampled_from(kinds))
    if kind in ("free_blocks", "shared_blocks"):
        return dataclasses.replace(state, **{kind: draw(_near(getattr(state, kind)).filter(lambda v: v is not None))})
    if kind == "engine":
        name = draw(st.sampled_from(ENGINE_FIELDS))
        value = (draw(st.sampled_from([-0.1, 0.0, 0.5, 0.999, 1.0, float("nan")])) if name == "watermark"
                 else draw(_near(getattr(state.engine, name)).filter(lambda v: v is not None)))
        return dataclasses.replace(state, engine=dataclasses.replace(state.engine, **{name: value}))
    queue, index = draw(st.sampled_from(residents))
    requests = list(getattr(state, queue))
    if kind == "same id":
        other_queue, other = draw(st.sampled_from([r for r in residents if r != (queue, index)]))
        requests[index] = dataclasses.replace(requests[index], id=getattr(state, other_queue)[other].id)
    else:
        name = draw(st.sampled_from(RESIDENT_FIELDS[1:]))
        value = draw(_near(getattr(requests[index], name)))
        if value is None and name != "max_tokens":
            value = 0
        requests[index] = dataclasses.replace(requests[index], **{name: value})
    return dataclasses.replace(state, **{queue: tuple(requests)})


@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(altered_states())
def test_prepare_passes_and_fails_as_with_check_state_first(state: InstanceState) -> None:
    assert _outcome(lambda: prepare(state)) == _outcome(lambda: _checked_first(state))


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(states())
def test_valid_states_are_prepared(state: InstanceState) -> None:
    prepared = prepare(state)
    assert prepared.ids == tuple(r.id for r in (*state.running, *state.waiting))


@pytest.mark.parametrize("max_tokens", [0, 3, -1])
def test_a_request_at_its_max_tokens_is_refused_though_the_core_does_not_check_it(max_tokens: int) -> None:
    """The compiled core takes max_tokens 0 (and below) for none; check_state refuses it, and so does prepare."""
    engine = EngineConfig(max_num_batched_tokens=64, max_num_seqs=4, block_size=16, num_gpu_blocks=11,
                          max_model_len=100)
    request = ResidentRequest("a", 10, 12, 3, 5, num_allocated_blocks=1, max_tokens=max_tokens)
    with pytest.raises(InvalidState, match="num_output_tokens must be below max_tokens"):
        prepare(InstanceState(engine, 10, running=(request,)))


@pytest.mark.parametrize("blocks", [2**63 - 1, 2**40])
def test_counts_that_would_wrap_the_cores_sums_are_refused_as_check_state_refuses_them(blocks: int) -> None:
    """Found by the altered states (in a longer run than CI's): a running request holding 2^63 - 1 blocks wrapped the
    compiled core's sum of blocks held and passed its check; `check_state` refuses it, and so does prepare."""
    engine = EngineConfig(max_num_batched_tokens=16, max_num_seqs=2, block_size=1, num_gpu_blocks=2, max_model_len=64)
    state = InstanceState(engine, 0, running=(ResidentRequest("r0", 2, 1, 0, 1, num_allocated_blocks=blocks),
                                              ResidentRequest("r1", 2, 1, 0, 1, num_allocated_blocks=1)))
    with pytest.raises(InvalidState, match=re.escape("running requests' blocks (shared ones once) + free_blocks "
                                                     "exceed num_gpu_blocks")):
        prepare(state)
