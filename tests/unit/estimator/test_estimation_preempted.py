"""A waiting request the engine preempted, whose snapshot reports what the engine's prefix cache still holds of it:
the estimator replays it with those figures instead of its own guess, and refuses figures that do not add up."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bear.core.replay import estimate, prepare
from bear.core.state import InvalidState, Query
from bear.core.wire import state_from_snapshot
from bear.estimator.estimation import Calibration, Dispatch, Estimator
from bear.v1 import snapshot_pb2
from tests.estimator_builders import BLOCK_SIZE, COEFFICIENTS, decoding, engine, queued, snapshot

NOW = 1000.0
SYSTEM = range(10_000, 10_000 + 960)  # 60 prefix blocks


def remaining(model: str, predicted: np.ndarray, generated: np.ndarray, max_tokens: np.ndarray) -> np.ndarray:
    return np.maximum(predicted - generated, 1.0)


def preempted(request_id: str, prompt: int, outputs: int, cached: int, evictable: int,
              ahead: int) -> snapshot_pb2.RequestState:
    return snapshot_pb2.RequestState(request_id=request_id, num_prompt_tokens=prompt, num_output_tokens=outputs,
                                     num_preemptions=1, num_cached_tokens=cached, num_evictable_blocks=evictable,
                                     num_free_blocks_ahead=ahead)


def estimator_for(instance_id: str = "a") -> Estimator:
    estimator = Estimator(remaining, {"m": 80.0})
    estimator.add_instance(instance_id, "m")
    estimator.set_calibration(instance_id, Calibration(COEFFICIENTS))
    return estimator


def hashes(*parts: range) -> bytes:
    from bear.common.prefix_blocks import prefix_block_hashes

    return prefix_block_hashes(np.concatenate([np.arange(p.start, p.stop) for p in parts]))


def waiting_state(estimator: Estimator, instance_id: str = "a") -> tuple:
    prepared = estimator._instances[instance_id].prepared  # noqa: SLF001 - what the replays start from
    assert prepared is not None
    return tuple((r.id, r.cached_tokens, r.num_evictable_blocks, r.num_free_blocks_ahead)
                 for r in prepared.state.waiting)


def test_the_engines_figures_replace_the_guess_for_a_preempted_request_only() -> None:
    estimator = estimator_for()
    # both requests were routed with a 960-token prefix the instance had been sent before: the guess is 960 each
    estimator.record_dispatch(Dispatch("first", "a", "m", NOW - 60, 1000, 20.0, prefix_hashes=hashes(SYSTEM)))
    for request_id in ("p", "w"):
        estimator.record_dispatch(Dispatch(request_id, "a", "m", NOW - 1, 1000, 20.0,
                                           prefix_hashes=hashes(SYSTEM, range(40))))
    message = snapshot("a", NOW, [decoding("r1")], [preempted("p", 1000, 12, cached=320, evictable=20, ahead=7),
                                                    queued("w", prompt=1000)])
    estimator.update_snapshot(message, NOW)
    assert waiting_state(estimator) == (("p", 320, 20, 7), ("w", 960, 0, 0))
    got = estimator.estimate(Query("q", 100, 10), ["a"], NOW + 0.01)[0]
    state = state_from_snapshot(message, lambda r: {"r1": 79, "p": 8, "w": 20}[r.request_id])
    p, w = state.waiting
    state = replace(state, waiting=(replace(p, cached_tokens=320, num_evictable_blocks=20, num_free_blocks_ahead=7),
                                    replace(w, cached_tokens=960)))
    expected = estimate(prepare(state), Query("q", 100, 10), COEFFICIENTS, query_time_s=0.01)
    assert got.ttft_s == pytest.approx(expected.ttft_s) and got.num_batches == expected.num_batches


def test_an_engine_that_reports_nothing_cached_is_believed() -> None:
    estimator = estimator_for()
    estimator.record_dispatch(Dispatch("first", "a", "m", NOW - 60, 1000, 20.0, prefix_hashes=hashes(SYSTEM)))
    estimator.record_dispatch(Dispatch("p", "a", "m", NOW - 1, 1000, 20.0, prefix_hashes=hashes(SYSTEM)))
    estimator.update_snapshot(snapshot("a", NOW, [], [preempted("p", 1000, 3, cached=0, evictable=0, ahead=0)]), NOW)
    assert waiting_state(estimator) == (("p", 0, 0, 0),)


def test_an_engine_without_prefix_caching_is_replayed_without_cached_prefixes() -> None:
    estimator = estimator_for()
    message = snapshot("a", NOW, [], [preempted("p", 1000, 3, cached=320, evictable=20, ahead=7)],
                       engine_config=engine(enable_prefix_caching=False))
    estimator.update_snapshot(message, NOW)
    assert waiting_state(estimator) == (("p", 0, 0, 0),)


@pytest.mark.parametrize(("figures", "problem"), [
    (dict(cached=320, evictable=21, ahead=0), "num_evictable_blocks exceeds the blocks behind cached_tokens"),
    (dict(cached=320, evictable=20, ahead=975), "num_free_blocks_ahead + num_evictable_blocks exceed free_blocks"),
    (dict(cached=1013, evictable=0, ahead=0), "cached_tokens must be in [0, num_prompt_tokens + num_output_tokens]"),
])
def test_figures_that_do_not_add_up_are_refused_and_the_previous_snapshot_kept(figures: dict[str, int],
                                                                               problem: str) -> None:
    estimator = estimator_for()
    first = snapshot("a", NOW, [decoding("r1")])
    estimator.update_snapshot(first, NOW)
    bad = snapshot("a", NOW + 0.1, [decoding("r1")], [preempted("p", 1000, 12, **figures)])
    assert bad.num_free_blocks == 1000 - 7 and 20 * BLOCK_SIZE == 320
    with pytest.raises(InvalidState) as refused:
        estimator.update_snapshot(bad, NOW + 0.1)
    assert str(refused.value).startswith("waiting[0] (id 'p'): ") and problem in str(refused.value)
    assert estimator.snapshot("a") is first
