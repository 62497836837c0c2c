"""Observed outcomes per instance, as the baselines read them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bear.routing.observations import MIN_RESIDUALS, InstanceObservations, ttft_estimates_s, weighted_median


def test_windows_keep_the_latest_observations_oldest_first() -> None:
    observed = InstanceObservations(window=3)
    for k in range(5):
        observed.observe(ttft_s=k, tpot_s=k / 10)
    observed.observe(ttft_s=math.nan)
    assert observed.recent_ttft_s == (2, 3, 4) and observed.recent_tpot_s == (0.2, 0.3, 0.4)


def test_throughput_counts_completions_in_the_window_cut_to_the_time_observed() -> None:
    observed = InstanceObservations(throughput_window_s=10.0, started_at_s=100.0)
    assert observed.request_throughput_rps(now_s=101.0) is None
    for at in (101.0, 102.0, 103.0, 104.0):
        observed.observe(completed_at_s=at)
    assert observed.request_throughput_rps(now_s=104.0) == pytest.approx(4 / 4.0)
    assert observed.request_throughput_rps(now_s=112.5) == pytest.approx(2 / 10.0)  # 101 and 102 left the window


def test_estimates_by_estimator_name() -> None:
    assert ttft_estimates_s(None) == {}
    assert ttft_estimates_s(0.2, prefill_tps_ttft_s=0.1) == {"bea": 0.2, "prefill-tps": 0.1}
    assert ttft_estimates_s(math.inf, lps=True) == {"bea": math.inf, "lps": math.inf}


def test_the_ttft_offset_is_a_median_residual_and_ignores_stalls() -> None:
    observations = InstanceObservations(residual_window=64)
    rng = np.random.default_rng(0)
    estimated = rng.uniform(0.005, 0.4, 60)
    observed = estimated + 0.006 + rng.normal(0, 0.001, 60)
    observed[::4] += 0.3  # stalls: a quarter of the outcomes
    for n, (e, o) in enumerate(zip(estimated, observed, strict=True)):
        assert (observations.ttft_offset_s() == 0.0) is (n < MIN_RESIDUALS)
        observations.observe(ttft_s=float(o), estimated_ttft_s=float(e))
        observations.observe(ttft_s=float(o))  # no estimate: not a residual
    assert observations.ttft_offset_s() == pytest.approx(0.006, abs=0.001)


def test_the_ttft_offset_has_the_least_relative_error_not_the_least_absolute_error() -> None:
    """Five short TTFTs 5 ms late and six long ones 20 ms late: the plain median (20 ms) doubles the short ones'
    prediction error in percent; the offset weighs each residual by 1 / observed TTFT and takes 5 ms."""
    observations = InstanceObservations(residual_window=64)
    pairs = [(0.015, 0.020)] * 5 + [(0.180, 0.200)] * 6  # (estimated, observed)
    for estimated, observed in pairs:
        observations.observe(ttft_s=observed, estimated_ttft_s=estimated)
    assert observations.ttft_offset_s() == pytest.approx(0.005)
    relative_error = lambda m: sum(abs(e + m - o) / o for e, o in pairs)  # noqa: E731
    assert relative_error(0.005) < relative_error(float(np.median([o - e for e, o in pairs])))


@pytest.mark.parametrize("seed", range(5))
def test_the_weighted_median_minimises_the_weighted_absolute_deviation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values, weights = rng.normal(0, 1, 1 + seed * 7), rng.uniform(0.01, 5, 1 + seed * 7)
    m = weighted_median(values, weights)
    cost = lambda c: float(np.sum(weights * np.abs(values - c)))  # noqa: E731
    assert m in values and all(cost(m) <= cost(v) + 1e-12 for v in values)
    assert weighted_median(np.array([1.0, 2.0, 3.0]), np.ones(3)) == 2.0


def test_the_ttft_offset_keeps_the_last_window_and_can_be_off() -> None:
    observations = InstanceObservations(residual_window=10)
    for _ in range(10):
        observations.observe(ttft_s=0.3, estimated_ttft_s=0.1)
    for _ in range(10):
        observations.observe(ttft_s=0.05, estimated_ttft_s=0.1)
    assert observations.ttft_offset_s() == pytest.approx(-0.05)  # an over-estimate is corrected too
    off = InstanceObservations(residual_window=0)
    for _ in range(10):
        off.observe(ttft_s=0.05, estimated_ttft_s=0.1)
    assert off.ttft_offset_s() == 0.0


def test_outcomes_far_beyond_any_overhead_do_not_move_the_offset() -> None:
    """A client reporting microseconds as milliseconds (30 ms → 30 s) in 40 of 64 reports: the median alone would
    follow it (the offset went to 25 s); the residuals it keeps are overheads, whatever the mix."""
    observations = InstanceObservations(residual_window=64)
    for n in range(64):
        estimated = 0.03
        observed = 30.0 if n % 8 < 5 else estimated + 0.006  # most reports in the wrong unit
        observations.observe(ttft_s=observed, estimated_ttft_s=estimated)
    assert observations.ttft_offset_s() == pytest.approx(0.006)
    slow = InstanceObservations(residual_window=64)
    for _ in range(16):  # long queries: an overhead above MAX_RESIDUAL_S but below the estimate still counts
        slow.observe(ttft_s=5.0 + 1.5, estimated_ttft_s=5.0)
    assert slow.ttft_offset_s() == pytest.approx(1.5)


def test_queries_that_found_the_engine_idle_learn_an_offset_of_their_own() -> None:
    """An idle engine starts its first step later than a busy one reaches its next: 2 ms left out for a busy engine,
    7 ms for an idle one. Until the window holds MIN_RESIDUALS of a kind, that kind takes the offset of all."""
    observations = InstanceObservations(residual_window=64)
    for _ in range(3 * MIN_RESIDUALS):
        observations.observe(ttft_s=0.052, estimated_ttft_s=0.050)
    assert observations.ttft_offset_s(engine_idle=False) == observations.ttft_offset_s(engine_idle=True) \
        == pytest.approx(0.002)
    for n in range(MIN_RESIDUALS):
        assert observations.ttft_offset_s(engine_idle=True) == pytest.approx(0.002)  # too few idle ones yet: all of them
        observations.observe(ttft_s=0.037, estimated_ttft_s=0.030, engine_idle=True)
    assert observations.ttft_offset_s(engine_idle=True) == pytest.approx(0.007)
    assert observations.ttft_offset_s(engine_idle=False) == pytest.approx(0.002)
    assert observations.ttft_offset_s() == pytest.approx(0.002)  # busy unless said otherwise
