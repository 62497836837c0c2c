"""Observed outcomes per instance, as the baselines read them."""

from __future__ import annotations

import math

import pytest

from bear.routing.observations import InstanceObservations, ttft_estimates_s


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
