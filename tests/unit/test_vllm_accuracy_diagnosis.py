"""The accuracy harness's offline diagnosis (tests/vllm_accuracy_diagnosis.py) under prefix caching: each waiting
request's cache hit is the engine's own when it first scheduled it, except for one the snapshot reports what the cache
still holds of (a preempted request: its first scheduling's hit says nothing of what is left after its blocks were
freed)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bear.core.replay import estimate, prepare
from bear.core.state import Query
from bear.core.wire import coefficients_from_proto, state_from_snapshot
from bear.snapshotter.reader import StepEntryRecord, StepRecord
from bear.v1 import snapshot_pb2
from tests import estimator_builders as build
from tests.vllm_accuracy_diagnosis import QueryFacts, diagnose

TAKEN_AT_S = 100.0


def _step(index: int, *entries: StepEntryRecord) -> StepRecord:
    at = TAKEN_AT_S - 1.0 + 0.01 * index
    return StepRecord(step_index=index, scheduled_at_s=at, execution_started_at_s=at, duration_s=0.005,
                      entries=entries, complete=True)


def _case(preempted: snapshot_pb2.RequestState) -> tuple[list[QueryFacts], snapshot_pb2.InstanceSnapshot, dict, dict]:
    engine = build.engine(num_gpu_blocks=40, max_num_batched_tokens=256)
    snapshot = build.snapshot("i", TAKEN_AT_S, running=[build.decoding("cmpl-r0-0-0000abcd", prompt=100,
                                                                        max_tokens=40)],
                              waiting=[preempted], engine_config=engine)
    snapshot.next_step_index = 10
    steps = {
        # Long before the snapshot the engine first scheduled the preempted request with nothing cached.
        2: _step(2, StepEntryRecord("cmpl-p1-0-0000abcd", 300, 256, 0)),
        10: _step(10, StepEntryRecord("cmpl-r0-0-0000abcd", 100, 1, 100),
                  StepEntryRecord("cmpl-p1-0-0000abcd", 300, 256, 0)),
        11: _step(11, StepEntryRecord("cmpl-r0-0-0000abcd", 100, 1, 101),
                  StepEntryRecord("cmpl-p1-0-0000abcd", 300, 49, 256),
                  StepEntryRecord("cmpl-q-0-0000abcd", 30, 30, 0)),
    }
    dispatches = {"q": build.dispatch_record("q", "i", TAKEN_AT_S + 0.002, prompt_tokens=30)}
    return [QueryFacts("q", 30, 4)], snapshot, dispatches, steps


def test_a_preempted_request_keeps_what_the_snapshot_says_the_cache_holds_of_it() -> None:
    preempted = snapshot_pb2.RequestState(request_id="cmpl-p1-0-0000abcd", num_prompt_tokens=300,
                                          num_output_tokens=5, max_tokens=20, num_cached_tokens=128,
                                          num_evictable_blocks=8, num_free_blocks_ahead=3)
    queries, snapshot, dispatches, steps = _case(preempted)

    (diagnosis,) = diagnose(queries, [(TAKEN_AT_S, snapshot)], dispatches, steps)

    state = state_from_snapshot(snapshot, lambda r: max(1, r.max_tokens - r.num_output_tokens))
    assert state.waiting[0].cached_tokens == 128 and state.waiting[0].num_evictable_blocks == 8
    coefficients = coefficients_from_proto(snapshot.batch_time).at_speed(snapshot.step_time_ratio)
    expected = estimate(prepare(state), Query("q", 30, 4), coefficients, query_time_s=0.002)
    assert diagnosis.offline_ttft_ms == pytest.approx(1e3 * expected.ttft_s, rel=1e-6)
    assert diagnosis.real_batches == 2


def test_a_waiting_request_without_the_figures_takes_the_engines_first_hit() -> None:
    queries, snapshot, dispatches, steps = _case(snapshot_pb2.RequestState(
        request_id="cmpl-p1-0-0000abcd", num_prompt_tokens=300, max_tokens=20))
    steps[2] = _step(2, StepEntryRecord("cmpl-p1-0-0000abcd", 300, 256, 32))

    (diagnosis,) = diagnose(queries, [(TAKEN_AT_S, snapshot)], dispatches, steps)

    state = state_from_snapshot(snapshot, lambda r: max(1, r.max_tokens - r.num_output_tokens))
    coefficients = coefficients_from_proto(snapshot.batch_time).at_speed(snapshot.step_time_ratio)
    hit = replace(state, waiting=(replace(state.waiting[0], cached_tokens=32),))
    with_hit = estimate(prepare(hit), Query("q", 30, 4), coefficients, query_time_s=0.002)
    without = estimate(prepare(state), Query("q", 30, 4), coefficients, query_time_s=0.002)
    assert with_hit.ttft_s != without.ttft_s
    assert diagnosis.offline_ttft_ms == pytest.approx(1e3 * with_hit.ttft_s, rel=1e-6)
