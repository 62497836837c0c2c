"""What the estimator service adds to the estimator's domain: unknown instances, one bad target among many, a bad
snapshot, residents' lengths resolved ahead, instances coming and going."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from bear.core.batch_time import BatchFeatures, BatchTimeCoefficients
from bear.core.prefill_throughput import prefill_throughput_ttft_s
from bear.core.replay import estimate, prepare
from bear.core.state import Arrival, InvalidState, Query, ResidentRequest
from bear.core.wire import state_from_snapshot
from bear.estimator.estimation import (
    DISPATCH_TRANSIT_S,
    FEED_OUTAGE_GRACE_S,
    MAX_CLOCK_AHEAD_S,
    Calibration,
    Dispatch,
    Estimator,
    Method,
    supersedes,
)
from bear.v1 import snapshot_pb2
from tests.estimator_builders import COEFFICIENTS, decoding, engine, queued, snapshot

NOW = 1000.0


def remaining(model: str, predicted: np.ndarray, generated: np.ndarray, max_tokens: np.ndarray) -> np.ndarray:
    return np.maximum(predicted - generated, 1.0)


def estimator_with(*snapshots, **options) -> Estimator:  # noqa: ANN002, ANN003 - InstanceSnapshot, Estimator options
    estimator = Estimator(remaining, {"m": 80.0}, **options)
    for message in snapshots:
        estimator.add_instance(message.instance_id, message.model)
        estimator.set_calibration(message.instance_id, Calibration(COEFFICIENTS))
        estimator.update_snapshot(message, NOW)
    return estimator


def test_an_unknown_instance_is_answered_none() -> None:
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")]))
    unknown, known = estimator.estimate(Query("q", 100, 10), ["b", "a"], NOW)
    assert (unknown.instance_id, unknown.method, unknown.ttft_s, unknown.reason) == ("b", Method.NONE, None,
                                                                                      "unknown instance")
    assert known.method is Method.REPLAY and known.ttft_s is not None


def test_a_target_that_cannot_be_replayed_does_not_cost_the_others_their_estimate() -> None:
    estimator = estimator_with(snapshot("a", NOW, [decoding("q")]), snapshot("b", NOW, [decoding("r1")]))
    bad, good = estimator.estimate(Query("q", 100, 10), ["a", "b"], NOW)  # "q" is also a resident of a
    assert bad.method is Method.NONE and bad.reason.startswith("cannot replay") and bad.snapshot_age_s == 0.0
    assert good.method is Method.REPLAY and good.ttft_s is not None and good.ttft_s > 0


def test_a_snapshot_the_replay_cannot_use_leaves_the_previous_one() -> None:
    first = snapshot("a", NOW, [decoding("r1")])
    estimator = estimator_with(first)
    broken = snapshot("a", NOW + 1, [decoding("r1")])
    broken.num_free_blocks = broken.engine.num_gpu_blocks + 1
    with pytest.raises(InvalidState):
        estimator.update_snapshot(broken, NOW + 1)
    assert estimator.snapshot("a") is first
    assert estimator.estimate(Query("q", 100, 10), ["a"], NOW)[0].method is Method.REPLAY


def test_residents_lengths_are_asked_by_model_and_answered_ahead() -> None:
    message = snapshot("a", NOW, [decoding("engine-r1", output=10, placeholders=1, max_tokens=500),
                                  decoding("r2", output=4)], [queued("r3")])
    estimator = Estimator(remaining, {"m": 80.0}, request_key=lambda engine_id: engine_id.removeprefix("engine-"))
    estimator.add_instance("a", "m")
    estimator.record_dispatch(Dispatch("r1", "a", "other", NOW - 5, 100, 300.0))
    lengths = estimator.resident_lengths(message)
    assert {model: [column.tolist() for column in rows] for model, rows in lengths.items()} == {
        "other": [[300.0], [11.0], [500.0]],  # the dispatch's model and length; the token in flight counts
        "m": [[80.0, 80.0], [4.0, 0.0], [0.0, 0.0]],  # no dispatch: the model's mean length
    }
    answered = {"other": np.array([7.0]), "m": np.array([20.0, 30.0])}
    assert estimator.update_snapshot(message, NOW, lambda model, *rows: answered[model])
    assert estimator.pending_decode_tokens("a") == (7 + 1) + 20 + 30  # the token in flight is added back


def test_a_dispatch_recorded_after_the_lengths_were_asked_counts_when_the_snapshot_is_adopted() -> None:
    """The residents as `resident_lengths` grouped them are kept for the adoption, but not past a dispatch that
    changes them (routers send theirs along with Estimate calls, which may come while the lengths are resolved)."""
    message = snapshot("a", NOW, [decoding("r1", output=4), decoding("r2", output=4)])
    estimator = Estimator(remaining, {"m": 80.0})
    estimator.add_instance("a", "m")
    assert [rows[0].tolist() for rows in estimator.resident_lengths(message).values()] == [[80.0, 80.0]]
    estimator.record_dispatch(Dispatch("r1", "a", "m", NOW - 1, 100, 300.0))
    assert estimator.update_snapshot(message, NOW)
    assert estimator.pending_decode_tokens("a") == (300 - 4) + (80 - 4)


@pytest.mark.parametrize("answer", [math.inf, math.nan])
def test_remaining_lengths_that_are_not_numbers_refuse_the_snapshot_and_keep_the_previous_one(answer: float) -> None:
    first = snapshot("a", NOW, [decoding("r1")])
    estimator = estimator_with(first)
    later = snapshot("a", NOW + 1, [decoding("r1", output=2)])
    with pytest.raises(ValueError, match="remaining output lengths of model 'm' are not all finite numbers"):
        estimator.update_snapshot(later, NOW + 1, lambda model, predicted, *_: np.full(len(predicted), answer))
    assert estimator.snapshot("a") is first


@pytest.mark.parametrize(("expected", "length"), [(2.5, 2), (3.5, 4), (0.2, 1), (6.49, 6)])
def test_remaining_lengths_round_half_to_even_and_are_at_least_one(expected: float, length: int) -> None:
    message = snapshot("a", NOW, [decoding("r1", output=4)])
    estimator = Estimator(remaining, {"m": 80.0})
    estimator.add_instance("a", "m")
    assert estimator.update_snapshot(message, NOW, lambda model, predicted, *_: np.full(len(predicted), expected))
    assert estimator.pending_decode_tokens("a") == length


def test_a_resident_without_a_dispatch_takes_the_mean_length_of_its_model_named_by_repository_id() -> None:
    message = snapshot("a", NOW, [decoding("r1", output=4)])
    message.model = "Qwen/Qwen3-8B"  # vLLM's served name by default; the artifact's means say Qwen3-8B
    estimator = Estimator(remaining, {"Qwen3-8B": 120.0})
    estimator.add_instance("a", message.model)
    lengths = estimator.resident_lengths(message)
    assert lengths["Qwen/Qwen3-8B"][0].tolist() == [120.0]


def test_a_dispatch_too_long_for_the_instance_is_not_an_arrival() -> None:
    message = snapshot("a", NOW, [decoding("r1")])
    estimator = estimator_with(message)
    before = estimator.estimate(Query("q", 100, 10), ["a"], NOW + 0.01)[0]
    estimator.record_dispatch(Dispatch("long", "a", "m", NOW + 0.001, message.engine.max_model_len, 10.0))
    after = estimator.estimate(Query("q", 100, 10), ["a"], NOW + 0.01)[0]
    assert after == before


@pytest.mark.parametrize("ahead_s", [0.5, 3.0, MAX_CLOCK_AHEAD_S])
def test_a_snapshot_ahead_of_the_clock_is_replayed_as_just_taken(ahead_s: float) -> None:
    """The engine's host's clock ahead of the estimator's, within the tolerance: the query arrives at the snapshot,
    not `ahead_s` before it (its TTFT counted the difference: 3.7 s for an idle engine 4 s ahead)."""
    ahead = estimator_with(snapshot("a", NOW + ahead_s, [decoding("r1")])).estimate(Query("q", 100, 10), ["a"], NOW)[0]
    now = estimator_with(snapshot("a", NOW, [decoding("r1")])).estimate(Query("q", 100, 10), ["a"], NOW)[0]
    assert ahead.method is Method.REPLAY and ahead.snapshot_age_s == 0.0
    assert ahead.ttft_s == pytest.approx(now.ttft_s) and ahead.num_batches == now.num_batches


def test_dispatches_since_the_snapshot_are_arrivals_ahead_of_the_query() -> None:
    message = snapshot("a", NOW, [decoding("r1")])
    estimator = estimator_with(message)
    estimator.record_dispatch(Dispatch("d1", "a", "m", NOW + 0.001, 1500, 10.0))
    got = estimator.estimate(Query("q", 100, 10), ["a"], NOW + 0.01)[0]
    state = state_from_snapshot(message, lambda r: 79)  # the mean length, 80, less the token generated
    expected = estimate(prepare(state), Query("q", 100, 10), COEFFICIENTS, query_time_s=0.01,
                        arrivals=[Arrival(0.001, ResidentRequest("d1", 1500, 0, 0, 10))])
    assert got.ttft_s == pytest.approx(expected.ttft_s) and got.num_batches == expected.num_batches


def test_an_arrival_writes_at_most_its_max_tokens() -> None:
    """A dispatch predicted at 400 tokens whose request may write 3 holds a slot of a one-seat engine for 3 steps."""
    message = snapshot("a", NOW, [], engine_config=engine(max_num_seqs=1))
    estimator = estimator_with(message)
    estimator.record_dispatch(Dispatch("d1", "a", "m", NOW + 0.001, 50, 400.0, max_tokens=3))
    capped = estimator.estimate(Query("q", 100, 10), ["a"], NOW + 0.01)[0]
    state = state_from_snapshot(message, lambda r: 1)
    expected = estimate(prepare(state), Query("q", 100, 10), COEFFICIENTS, query_time_s=0.01,
                        arrivals=[Arrival(0.001, ResidentRequest("d1", 50, 0, 0, 400, max_tokens=3))])
    assert capped.num_batches == expected.num_batches == 4  # d1's prefill and two more tokens, then the query
    assert capped.ttft_s == pytest.approx(expected.ttft_s)


def test_a_dispatch_an_idle_engine_never_received_stops_counting_once_it_should_have_arrived() -> None:
    """Routed but never sent (or refused by vLLM): an idle engine's snapshot keeps its taken_at, and the request, not
    in it when the engine was last read well after the dispatch, would make it look busy for as long as it is idle."""
    idle = snapshot("a", NOW, [])
    estimator = estimator_with(idle)
    alone = estimator.estimate(Query("q", 100, 10), ["a"], NOW + 0.01)[0]
    estimator.record_dispatch(Dispatch("phantom", "a", "m", NOW + 0.001, 1500, 200.0))
    in_transit = estimator.estimate(Query("q", 100, 10), ["a"], NOW + 0.01)[0]
    assert in_transit.ttft_s > 2 * alone.ttft_s  # just routed: it may be on its way, ahead of the query
    later = NOW + 0.001 + DISPATCH_TRANSIT_S + 0.5
    estimator.update_snapshot(snapshot("a", NOW, [], read_at_s=later), later)  # re-read, unchanged: still idle
    gone = estimator.estimate(Query("q", 100, 10), ["a"], later + 0.01)[0]
    assert gone.ttft_s == pytest.approx(alone.ttft_s)


def test_an_engine_without_work_is_said_idle_since_its_last_step() -> None:
    """Nothing running or waiting, no step in progress, no dispatch on its way: idle since the snapshot was taken
    (an engine writes its state after every step), however often the unchanged state was read again since."""
    estimator = estimator_with(snapshot("idle", NOW, []), snapshot("running", NOW, [decoding("r1")]),
                               snapshot("waiting", NOW, [], [queued("w1")]))
    query = Query("q", 100, 10)
    idle, running, waiting = estimator.estimate(query, ["idle", "running", "waiting"], NOW + 0.25)
    assert idle.idle_s == pytest.approx(0.25) and running.idle_s is None and waiting.idle_s is None
    estimator.update_snapshot(snapshot("idle", NOW, [], read_at_s=NOW + 0.5), NOW + 0.5)  # read again, unchanged
    assert estimator.estimate(query, ["idle"], NOW + 0.6)[0].idle_s == pytest.approx(0.6)
    estimator.record_dispatch(Dispatch("d1", "idle", "m", NOW + 0.59, 100, 10.0))  # on its way, ahead of the query
    assert estimator.estimate(query, ["idle"], NOW + 0.6)[0].idle_s is None
    estimator.remove_instance("idle")
    estimator.add_instance("idle", "m")  # known, no snapshot: no replay, nothing said
    assert estimator.estimate(query, ["idle"], NOW + 0.6)[0].idle_s is None


def test_arrivals_come_in_dispatch_order_and_old_dispatches_expire() -> None:
    message = snapshot("a", NOW, [decoding("r1")])
    estimator = estimator_with(message, dispatch_ttl_s=60.0)
    for request_id, at in (("late", NOW + 0.003), ("early", NOW + 0.001), ("before", NOW - 1), ("old", NOW - 100),
                           ("moved", NOW - 2)):
        estimator.record_dispatch(Dispatch(request_id, "a", "m", at, 300, 10.0))
    estimator.record_dispatch(Dispatch("moved", "a", "m", NOW + 0.002, 300, 10.0))  # recorded again, later
    got = estimator.estimate(Query("q", 100, 10), ["a"], NOW + 0.01)[0]
    state = state_from_snapshot(message, lambda r: 79)
    expected = estimate(prepare(state), Query("q", 100, 10), COEFFICIENTS, query_time_s=0.01,
                        arrivals=[Arrival(at, ResidentRequest(name, 300, 0, 0, 10))
                                  for name, at in (("early", 0.001), ("moved", 0.002), ("late", 0.003))])
    assert got.ttft_s == pytest.approx(expected.ttft_s) and got.num_batches == expected.num_batches
    estimator.update_snapshot(snapshot("a", NOW + 0.5, [decoding("r1")]), NOW + 0.5)  # expiry comes with snapshots
    assert not estimator.has_dispatch("a", "old")
    assert all(estimator.has_dispatch("a", r) for r in ("before", "early", "moved", "late"))


def test_dispatches_expire_while_the_engine_state_stands_still() -> None:
    """A stuck engine whose sidecar publishes the same state again and again, while routers go on sending it
    queries: the dispatches kept for it still expire."""
    message = snapshot("a", NOW, [decoding("r1")])
    estimator = estimator_with(message, dispatch_ttl_s=60.0)
    for second in range(0, 200, 10):
        estimator.record_dispatch(Dispatch(f"d{second}", "a", "m", NOW + second, 300, 10.0))
        assert not estimator.update_snapshot(message, NOW + second)  # the same state, found current later
    assert [second for second in range(0, 200, 10) if estimator.has_dispatch("a", f"d{second}")] == list(
        range(130, 200, 10))  # made at most 60 s before the last snapshot


def test_the_prefill_throughput_estimate_follows_each_snapshot() -> None:
    """Eq. 8 beside the replay (for the prefill-throughput policies): its residents' backlog is summed once per
    snapshot, and is each snapshot's own."""
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")], [queued("w1", 600)]))
    estimator.set_calibration("a", Calibration(COEFFICIENTS, prefill_tokens_per_s=1000.0))
    query = Query("q", 100, 10)
    for at, message in ((NOW, None), (NOW + 1, snapshot("a", NOW + 1, [decoding("r1", output=2)],
                                                        [queued("w1", 600), queued("w2", 300)])),
                        (NOW + 2, snapshot("a", NOW + 2, [decoding("r1", output=3)]))):
        if message is not None:
            assert estimator.update_snapshot(message, at)
        current = estimator.snapshot("a")
        assert current is not None
        expected = prefill_throughput_ttft_s(state_from_snapshot(current, lambda r: 79), query, 1000.0)
        got = estimator.estimate(query, ["a"], at + 0.001)[0]
        assert got.prefill_tps_ttft_s == pytest.approx(expected)
    assert expected == pytest.approx(0.1)  # the queue gone: the query's own prompt only


def test_the_step_in_progress_delays_the_replay_by_its_remaining_time_under_each_snapshot_and_calibration() -> None:
    def with_step(at: float, contexts: list[int], started_ago_s: float):  # noqa: ANN202 - InstanceSnapshot
        message = snapshot("a", at, [decoding(f"r{k}", 100, 5, placeholders=1) for k in range(len(contexts))],
                           engine_config=engine(async_scheduling=True))
        message.next_step_index, message.step_in_progress.step_index = 8, 7
        message.step_in_progress.execution_started_at_s = at - started_ago_s
        for k, context in enumerate(contexts):
            message.step_in_progress.entries.add(request_id=f"r{k}", num_decode_tokens=1, num_context_tokens=context)
        return message

    query = Query("q", 100, 10)
    estimator = estimator_with(with_step(NOW, [104] * 40, 0.001))
    for at, message, coefficients in (
            (NOW, None, COEFFICIENTS),
            (NOW + 1, with_step(NOW + 1, [3000] * 40, 0.002), COEFFICIENTS),  # a longer step: more left of it
            (NOW + 1, None, COEFFICIENTS.at_speed(2.0)),  # a slower engine: the same step takes longer
            (NOW + 2, snapshot("a", NOW + 2, [decoding("r0", 100, 6)], engine_config=engine(async_scheduling=True)),
             COEFFICIENTS)):  # none executing
        if message is not None:
            assert estimator.update_snapshot(message, at)
        estimator.set_calibration("a", Calibration(coefficients))
        current = estimator.snapshot("a")
        assert current is not None
        step = current.step_in_progress
        left = 0.0
        if step.entries:
            features = BatchFeatures.of_batch((e.num_prefill_tokens, e.num_decode_tokens, e.num_context_tokens)
                                              for e in step.entries)
            left = max(0.0, coefficients.time_s(features) - (current.taken_at_s - step.execution_started_at_s))
        expected = estimate(prepare(state_from_snapshot(current, lambda r: 79)), query, coefficients,
                            query_time_s=0.0005, in_flight_s=left)
        got = estimator.estimate(query, ["a"], at + 0.0005)[0]
        assert got.ttft_s == pytest.approx(expected.ttft_s) and got.num_batches == expected.num_batches
        assert (left > 0) == bool(step.entries)


@pytest.mark.parametrize("started_at_s", [math.inf, math.nan, -1.0])
def test_a_step_in_progress_whose_start_is_not_a_time_is_taken_as_none(started_at_s: float) -> None:
    """(QA: an execution start of +inf was adopted, then made every estimate of the instance fail.)"""
    message = snapshot("a", NOW, [decoding("r1", 100, 5, placeholders=1)], engine_config=engine(async_scheduling=True))
    message.next_step_index, message.step_in_progress.step_index = 8, 7
    message.step_in_progress.execution_started_at_s = started_at_s
    message.step_in_progress.entries.add(request_id="r1", num_decode_tokens=1, num_context_tokens=105)
    [got] = estimator_with(message).estimate(Query("q", 100, 10), ["a"], NOW)
    message.ClearField("step_in_progress")
    [without] = estimator_with(message).estimate(Query("q", 100, 10), ["a"], NOW)
    assert got.method is Method.REPLAY and got.ttft_s == without.ttft_s


def test_instances_come_and_go() -> None:
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")]))
    estimator.add_instance("b", "m")
    estimator.add_instance("a", "renamed")
    assert estimator.instance_ids() == ["a", "b"] and estimator.model("a") == "renamed"
    assert estimator.snapshot("a") is not None  # adding a known instance keeps its state
    estimator.remove_instance("a")
    assert estimator.instance_ids() == ["b"] and not estimator.knows("a")
    assert estimator.estimate(Query("q", 1, 1), ["b"], NOW)[0].reason == "no snapshot, no LPS parameters"


@pytest.mark.parametrize("taken_at_s, read_at_s", [
    (math.nan, None), (math.inf, None), (-math.inf, None), (NOW + 1, math.nan),  # not numbers
    (NOW + MAX_CLOCK_AHEAD_S + 1, None), (NOW + 365 * 86400, None), (NOW + 1, NOW + 1e9),  # ahead of the clock
])
def test_a_snapshot_whose_times_are_not_plausible_leaves_the_previous_one(taken_at_s: float,
                                                                          read_at_s: float | None) -> None:
    first = snapshot("a", NOW, [decoding("r1")])
    estimator = estimator_with(first)
    with pytest.raises(InvalidState, match="taken_at_s|read_at_s"):
        estimator.update_snapshot(snapshot("a", taken_at_s, read_at_s=read_at_s, sequence_number=2), NOW)
    assert estimator.snapshot("a") is first


@pytest.mark.parametrize("held, offered, newer", [
    ((NOW - 1, 10), (NOW - 0.5, 1), True),  # taken later: newer, whatever the sequence (an engine restarted)
    ((NOW - 1, 10), (NOW - 1.5, 11), False),  # taken earlier by a clock that agrees with ours: older
    ((NOW - 1, 10), (NOW - 1, 11), False),  # the same time: the same state
    ((NOW + 3, 10), (NOW + 1, 11), True),  # held ahead of the clock: the engine's count decides
    ((NOW + 3, 10), (NOW + 1, 9), False),
    ((NOW + MAX_CLOCK_AHEAD_S + 1, 10), (NOW, 1), True),  # held too far ahead (the clock went back): anything
    ((math.nan, 10), (NOW, 1), True),
])
def test_snapshots_are_ordered_by_taken_time_and_by_sequence_while_held_ahead_of_the_clock(
        held: tuple[float, int], offered: tuple[float, int], newer: bool) -> None:
    current = snapshot("a", held[0], sequence_number=held[1], read_at_s=NOW)
    assert supersedes(snapshot("a", offered[0], sequence_number=offered[1]), current, NOW) is newer


def test_an_instance_not_calibrated_yet_is_replayed_with_a_calibrated_peers_coefficients() -> None:
    """A new replica (or a replaced pod) has no eq. 12 fit until its engine has run enough steps: with NONE a
    latency-aware policy would never send it those steps."""
    estimator = estimator_with(snapshot("old", NOW, [decoding("r1")]))
    new = snapshot("new", NOW, [decoding("r2")])
    other_model = snapshot("other", NOW, [decoding("r3")], model="m2")
    smaller = engine()
    smaller.num_gpu_blocks //= 2  # another GPU, or another memory share
    other_engine = snapshot("small-cache", NOW, [decoding("r4")], engine_config=smaller)
    for message in (new, other_model, other_engine):
        estimator.add_instance(message.instance_id, message.model)
        estimator.update_snapshot(message, NOW)
    old, borrowed, alone, unlike = estimator.estimate(Query("q", 100, 10), ["old", "new", "other", "small-cache"],
                                                      NOW)
    assert borrowed.method is Method.REPLAY and borrowed.ttft_s == pytest.approx(old.ttft_s)
    assert "not calibrated yet: eq. 12 coefficients of old" in borrowed.reason
    assert alone.method is Method.NONE and unlike.method is Method.NONE
    estimator.set_calibration("new", Calibration(COEFFICIENTS))  # its own fit arrives
    assert estimator.estimate(Query("q", 100, 10), ["new"], NOW)[0].reason == ""


def test_while_redis_is_unreachable_a_snapshot_past_the_limit_is_replayed_forward_for_a_while() -> None:
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")]), max_snapshot_age_s=2.0)
    query = Query("q", 100, 10)
    assert estimator.estimate(query, ["a"], NOW + 5)[0].method is not Method.REPLAY  # the instance stopped publishing
    estimator.feed_cut_off = True  # ... or Redis did: no snapshot can arrive however healthy the engine is
    held = estimator.estimate(query, ["a"], NOW + 5)[0]
    assert held.method is Method.REPLAY and "Redis unreachable: replayed forward" in held.reason
    assert held.snapshot_age_s == pytest.approx(5.0)
    assert estimator.estimate(query, ["a"], NOW + 2.0 + FEED_OUTAGE_GRACE_S + 1)[0].method is not Method.REPLAY


def _blocks(*parts: range) -> bytes:
    from bear.common.prefix_blocks import prefix_block_hashes

    return prefix_block_hashes(np.concatenate([np.arange(p.start, p.stop) for p in parts]))


SYSTEM = range(10_000, 10_000 + 960)  # a 960-token system prompt: 60 prefix blocks


def test_the_query_is_replayed_with_the_prefix_routed_to_each_instance_before_it() -> None:
    """Prefix caching: the query prefills only what the instance's prefix cache likely lacks; an instance that was
    never sent the prefix prefills it all."""
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")]), snapshot("b", NOW, [decoding("r1")]))
    estimator.record_dispatch(Dispatch("earlier", "a", "m", NOW - 30, 1000, 20.0,
                                       prefix_hashes=_blocks(SYSTEM, range(40))))
    query, hashes = Query("q", 1010, 10), _blocks(SYSTEM, range(500, 550))
    at_a, at_b = estimator.estimate(query, ["a", "b"], NOW + 0.01, prefix_hashes=hashes)
    state = state_from_snapshot(snapshot("a", NOW, [decoding("r1")]), lambda r: 79)
    hit = estimate(prepare(state), query, COEFFICIENTS, query_time_s=0.01, query_cached_tokens=960)
    cold = estimate(prepare(state), query, COEFFICIENTS, query_time_s=0.01)
    assert at_a.ttft_s == pytest.approx(hit.ttft_s) and at_b.ttft_s == pytest.approx(cold.ttft_s)
    assert at_a.ttft_s < 0.5 * at_b.ttft_s
    assert (at_a.cached_tokens, at_b.cached_tokens) == (960, 0)  # said in the reply
    # without the prompt's blocks (a length-only query), no hit anywhere
    assert estimator.estimate(query, ["a"], NOW + 0.01)[0].ttft_s == pytest.approx(cold.ttft_s)
    # nor on an engine that runs without prefix caching (--no-enable-prefix-caching: its snapshots say so)
    estimator.update_snapshot(snapshot("a", NOW + 0.001, [decoding("r1")],
                                       engine_config=engine(enable_prefix_caching=False)), NOW + 0.001)
    uncached = estimator.estimate(query, ["a"], NOW + 0.01, prefix_hashes=hashes)[0]
    assert uncached.ttft_s > 2 * at_a.ttft_s


def test_arrivals_and_waiting_requests_find_the_prefixes_routed_before_them() -> None:
    message = snapshot("a", NOW, [decoding("r1")], [queued("w1", prompt=1000)])
    estimator = Estimator(remaining, {"m": 80.0})
    estimator.add_instance("a", "m")
    estimator.set_calibration("a", Calibration(COEFFICIENTS))
    estimator.record_dispatch(Dispatch("first", "a", "m", NOW - 60, 1000, 20.0, prefix_hashes=_blocks(SYSTEM)))
    estimator.record_dispatch(Dispatch("w1", "a", "m", NOW - 0.5, 1000, 20.0,
                                       prefix_hashes=_blocks(SYSTEM, range(40))))
    estimator.update_snapshot(message, NOW)
    estimator.record_dispatch(Dispatch("d1", "a", "m", NOW + 0.001, 1500, 10.0,
                                       prefix_hashes=_blocks(SYSTEM, range(7, 547))))
    got = estimator.estimate(Query("q", 100, 10), ["a"], NOW + 0.01)[0]
    state = state_from_snapshot(message, lambda r: 79 if r.request_id == "r1" else 20)
    state = replace(state, waiting=(replace(state.waiting[0], cached_tokens=960),))
    expected = estimate(prepare(state), Query("q", 100, 10), COEFFICIENTS, query_time_s=0.01,
                        arrivals=[Arrival(0.001, ResidentRequest("d1", 1500, 0, 0, 10, cached_tokens=960))])
    assert got.ttft_s == pytest.approx(expected.ttft_s) and got.num_batches == expected.num_batches
    cold = estimate(prepare(state_from_snapshot(message, lambda r: 79 if r.request_id == "r1" else 20)),
                    Query("q", 100, 10), COEFFICIENTS, query_time_s=0.01,
                    arrivals=[Arrival(0.001, ResidentRequest("d1", 1500, 0, 0, 10))])
    assert got.ttft_s < cold.ttft_s


def test_a_dispatch_keeps_its_prefix_blocks_only_until_its_request_runs() -> None:
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")]))
    hashes = _blocks(SYSTEM)
    estimator.record_dispatch(Dispatch("d1", "a", "m", NOW + 0.001, 960, 20.0, prefix_hashes=hashes))
    estimator.update_snapshot(snapshot("a", NOW + 0.1, [decoding("r1")], [queued("d1", 960)]), NOW + 0.1)
    assert estimator._instances["a"].dispatches.by_id["d1"].prefix_hashes == hashes  # noqa: SLF001 - waiting
    estimator.update_snapshot(snapshot("a", NOW + 0.2, [decoding("r1"), decoding("d1", 960)]), NOW + 0.2)
    assert estimator._instances["a"].dispatches.by_id["d1"].prefix_hashes == b""  # noqa: SLF001 - running
    query = Query("q", 1000, 10)  # its blocks stay in the instance's account
    assert estimator.estimate(query, ["a"], NOW + 0.3, prefix_hashes=_blocks(SYSTEM, range(40)))[0].cached_tokens == 960


def test_an_engine_that_started_over_has_an_empty_prefix_cache() -> None:
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")], sequence_number=500))
    estimator.record_dispatch(Dispatch("earlier", "a", "m", NOW - 30, 1000, 20.0, prefix_hashes=_blocks(SYSTEM)))
    query, hashes = Query("q", 1000, 10), _blocks(SYSTEM, range(40))
    warm = estimator.estimate(query, ["a"], NOW + 0.01, prefix_hashes=hashes)[0]
    estimator.update_snapshot(snapshot("a", NOW + 1, [decoding("r1")], sequence_number=3), NOW + 1)
    cold = estimator.estimate(query, ["a"], NOW + 1.01, prefix_hashes=hashes)[0]
    assert cold.ttft_s > 2 * warm.ttft_s
    estimator.update_snapshot(snapshot("a", NOW + 2, [decoding("r1")], sequence_number=9), NOW + 2)  # counting on
    estimator.record_dispatch(Dispatch("again", "a", "m", NOW + 2, 1000, 20.0, prefix_hashes=_blocks(SYSTEM)))
    assert estimator.estimate(query, ["a"], NOW + 2.01, prefix_hashes=hashes)[0].ttft_s < cold.ttft_s


def _started(message: snapshot_pb2.InstanceSnapshot, started_at_s: float,
             next_step_index: int = 0) -> snapshot_pb2.InstanceSnapshot:
    message.engine_started_at_s, message.next_step_index = started_at_s, next_step_index
    return message


def test_an_engine_restarted_by_its_start_time_has_an_empty_prefix_cache_though_its_sequence_grows() -> None:
    # The snapshotter's sequence numbers keep growing across restarts (the region's counter starts at its creation
    # time): the start time tells a new run apart (QA: a prompt routed before the restart stayed cached after it).
    estimator = estimator_with(_started(snapshot("a", NOW, [decoding("r1")], sequence_number=500), NOW - 100, 40))
    estimator.record_dispatch(Dispatch("earlier", "a", "m", NOW - 30, 1000, 20.0, prefix_hashes=_blocks(SYSTEM)))
    query, hashes = Query("q", 1000, 10), _blocks(SYSTEM, range(40))
    assert estimator.estimate(query, ["a"], NOW + 0.01, prefix_hashes=hashes)[0].cached_tokens == 960
    estimator.update_snapshot(_started(snapshot("a", NOW + 1, [decoding("r1")], sequence_number=900), NOW - 100, 41),
                              NOW + 1)  # the same run
    assert estimator.estimate(query, ["a"], NOW + 1.01, prefix_hashes=hashes)[0].cached_tokens == 960
    estimator.update_snapshot(_started(snapshot("a", NOW + 2, [decoding("r1")], sequence_number=901), NOW + 1.5, 45),
                              NOW + 2)  # a new run, further in its steps than the last was
    assert estimator.estimate(query, ["a"], NOW + 2.01, prefix_hashes=hashes)[0].cached_tokens == 0


def test_without_a_start_time_a_step_count_that_went_back_says_the_engine_restarted() -> None:
    estimator = estimator_with(_started(snapshot("a", NOW, [decoding("r1")], sequence_number=500), 0.0, 40))
    estimator.record_dispatch(Dispatch("earlier", "a", "m", NOW - 30, 1000, 20.0, prefix_hashes=_blocks(SYSTEM)))
    query, hashes = Query("q", 1000, 10), _blocks(SYSTEM, range(40))
    estimator.update_snapshot(_started(snapshot("a", NOW + 1, [decoding("r1")], sequence_number=900), 0.0, 2), NOW + 1)
    assert estimator.estimate(query, ["a"], NOW + 1.01, prefix_hashes=hashes)[0].cached_tokens == 0


@pytest.mark.parametrize("field, value", [("block_size", 0), ("num_gpu_blocks", 0)])
def test_a_snapshot_refused_for_its_engine_changes_nothing_the_estimator_holds(field: str, value: int) -> None:
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")]))
    estimator.record_dispatch(Dispatch("earlier", "a", "m", NOW - 30, 1000, 20.0, prefix_hashes=_blocks(SYSTEM)))
    query, hashes = Query("q", 1000, 10), _blocks(SYSTEM, range(40))
    estimator.record_dispatch(Dispatch("w", "a", "m", NOW + 0.5, 960, 20.0, prefix_hashes=_blocks(SYSTEM)))
    before = estimator.estimate(query, ["a"], NOW + 0.01, prefix_hashes=hashes)[0]
    broken = snapshot("a", NOW + 1, [decoding("r1")], [queued("w", 960)])  # its cache hit is looked up
    setattr(broken.engine, field, value)
    with pytest.raises(InvalidState):  # was a ZeroDivisionError for block_size 0, which stopped the feed's batch
        estimator.update_snapshot(broken, NOW + 1)
    after = estimator.estimate(query, ["a"], NOW + 1.01, prefix_hashes=hashes)[0]
    assert after.cached_tokens == before.cached_tokens == 960  # was 0: the index emptied by a refused snapshot


def test_a_prompt_the_engine_refuses_is_not_counted_in_its_prefix_cache() -> None:
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")]))
    too_long = estimator._instances["a"].prepared.state.engine.max_model_len  # noqa: SLF001
    estimator.record_dispatch(Dispatch("refused", "a", "m", NOW, too_long, 20.0,
                                       prefix_hashes=_blocks(SYSTEM, range(too_long // 16))))
    query = Query("q", 1000, 10)
    assert estimator.estimate(query, ["a"], NOW + 0.01, prefix_hashes=_blocks(SYSTEM, range(40)))[0].cached_tokens == 0


def test_dispatches_are_forgotten_as_new_ones_come_even_while_no_snapshot_is_adopted() -> None:
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")]), dispatch_ttl_s=60.0)
    for second in range(600):
        estimator.record_dispatch(Dispatch(f"d{second}", "a", "m", NOW + second, 100, 20.0))
    assert len(estimator._instances["a"].dispatches) <= 70  # noqa: SLF001 - was all 600


@pytest.mark.parametrize("prompt_tokens, why", [(32_768, "not shorter than max_model_len (32768)"),
                                                (16_001, "needs 1001 KV blocks, more than the cache's 1000")])
def test_a_prompt_the_engine_refuses_is_infeasible_however_its_ttft_would_be_estimated(prompt_tokens: int,
                                                                                       why: str) -> None:
    """Without a replay (not calibrated, or a snapshot past the age limit, LPS or none) the engine's settings still
    say which prompts it refuses: the router must shed such a query, not explore an instance that rejects it."""
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")]), max_snapshot_age_s=2.0)
    uncalibrated = snapshot("b", NOW, [decoding("r2")], model="m2")  # no peer of its model to borrow from
    estimator.add_instance("b", "m2")
    estimator.update_snapshot(uncalibrated, NOW)
    query = Query("q", prompt_tokens, 10)
    replayed, fresh = estimator.estimate(query, ["a", "b"], NOW)
    stale = estimator.estimate(query, ["a"], NOW + 5)[0]
    assert replayed.method is Method.REPLAY and replayed.ttft_s == math.inf and why in replayed.reason
    for refused, prefix in ((fresh, "not calibrated: "), (stale, "snapshot 5.000 s old: ")):
        assert refused.method is Method.NONE and refused.ttft_s == math.inf
        assert refused.reason.startswith(prefix) and why in refused.reason
    served = estimator.estimate(Query("q", 1000, 10), ["b"], NOW)[0]  # a prompt it takes: still no estimate
    assert served.ttft_s is None and served.reason == "not calibrated, no LPS parameters"


def test_waiting_requests_the_snapshot_leaves_out_delay_the_query_and_make_its_estimate_a_lower_bound() -> None:
    written = [queued("w1", prompt=300), queued("w2", prompt=500)]
    complete = estimator_with(snapshot("a", NOW, [decoding("r1")], written))
    truncated_message = snapshot("a", NOW, [decoding("r1")], written)
    truncated_message.num_omitted_waiting = 10
    truncated = estimator_with(truncated_message)
    query = Query("q", 100, 10)
    [whole] = complete.estimate(query, ["a"], NOW)
    [behind] = truncated.estimate(query, ["a"], NOW)
    # ten more requests of the written ones' mean (400 tokens) prefill ahead of the query: 4000 tokens, two budgets
    added = COEFFICIENTS.time_s(BatchFeatures(4000, 0, 0, 10 * (400 * 401 // 2)), 2)
    assert not whole.lower_bound and behind.lower_bound
    assert behind.ttft_s == pytest.approx(whole.ttft_s + added)
    assert behind.reason.startswith("10 waiting requests the snapshot leaves out are ahead of the query")
    nothing_written = snapshot("a", NOW, [decoding("r1")])
    nothing_written.num_omitted_waiting = 3  # a snapshotter writing no waiting rows: the query's prompt stands in
    [alone] = estimator_with(snapshot("a", NOW, [decoding("r1")])).estimate(query, ["a"], NOW)
    [unwritten] = estimator_with(nothing_written).estimate(query, ["a"], NOW)
    assert unwritten.ttft_s == pytest.approx(
        alone.ttft_s + COEFFICIENTS.time_s(BatchFeatures(300, 0, 0, 3 * (100 * 101 // 2)), 1))


@pytest.mark.parametrize("coefficients", [BatchTimeCoefficients(1e308, 1e308, 0.0, 0.0),
                                          BatchTimeCoefficients(1e12, 0.0, 0.0, 0.0)])
def test_coefficients_no_engine_has_give_no_estimate_rather_than_an_absurd_one(
        coefficients: BatchTimeCoefficients) -> None:
    estimator = estimator_with(snapshot("a", NOW, [decoding("r1")]), snapshot("b", NOW, [decoding("r2")]))
    estimator.set_calibration("a", Calibration(coefficients))
    bad, good = estimator.estimate(Query("q", 100, 10), ["a", "b"], NOW)
    assert (bad.method, bad.ttft_s) == (Method.NONE, None)
    assert bad.reason.startswith("cannot replay: the batch-time model gives ") and "more than 1e+09 s" in bad.reason
    assert good.method is Method.REPLAY and 0 < good.ttft_s < 1
