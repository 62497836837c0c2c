"""The prefill-throughput estimator (eq. 8) and the LPS closed form (eq. 13–15)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bear.core.batch_time import BatchFeatures
from bear.core.lps import LpsParameters, arrival_statistics, lps_ttft_s, lps_wait_s
from bear.core.prefill_throughput import fit_prefill_throughput, prefill_throughput_ttft_s
from tests.builders import decoding, make_query, make_state, prefilling, queued


def test_prefill_throughput_counts_only_batches_with_prefill() -> None:
    samples = [
        (BatchFeatures.of_batch([(1000, 0, 0), (0, 1, 50)]), 0.05),
        (BatchFeatures.of_batch([(3000, 0, 0)]), 0.15),
        (BatchFeatures.of_batch([(0, 1, 50)]), 0.01),  # decode only: ignored
    ]
    assert fit_prefill_throughput(samples) == pytest.approx(4000 / 0.2)
    with pytest.raises(ValueError):
        fit_prefill_throughput(samples[2:])


def test_prefill_throughput_ttft_sums_remaining_prefill_work() -> None:
    state = make_state(running=[decoding("a"), prefilling("b", prompt=1000, computed=400)],
                       waiting=[queued("c", prompt=300), queued("d", prompt=50, output=20)])
    # b: 600 left; c: 300; d (preempted): 70 to recompute; a decodes: nothing.
    assert prefill_throughput_ttft_s(state, make_query(prompt=30), 1000.0) == pytest.approx((600 + 300 + 70 + 30) / 1000)
    with pytest.raises(ValueError):
        prefill_throughput_ttft_s(state, make_query(), 0.0)


def test_lps_wait_is_eq_13_for_poisson_and_exponential() -> None:
    params = LpsParameters(arrival_rate_qps=8.0, service_rate_qps=10.0, concurrency=3, prefill_tokens_per_s=5000.0)
    assert lps_wait_s(params) == pytest.approx(0.8**3 / (10.0 - 8.0))
    assert lps_ttft_s(params, 500) == pytest.approx(0.8**3 / 2.0 + 0.1)
    # k = 1 is the M/M/1 queue.
    mm1 = LpsParameters(8.0, 10.0, 1, 5000.0)
    assert lps_wait_s(mm1) == pytest.approx(0.8 / 2.0)


def test_lps_variability_correction_scales_the_wait() -> None:
    base = LpsParameters(8.0, 10.0, 3, 5000.0)
    bursty = LpsParameters(8.0, 10.0, 3, 5000.0, arrival_scv=3.0, service_scv=2.0)
    assert lps_wait_s(bursty) == pytest.approx(lps_wait_s(base) * 2.5)


def test_lps_is_infinite_at_or_beyond_saturation_and_rejects_bad_parameters() -> None:
    assert lps_wait_s(LpsParameters(10.0, 10.0, 4, 1.0)) == math.inf
    with pytest.raises(ValueError):
        LpsParameters(1.0, 0.0, 4, 1.0)
    with pytest.raises(ValueError):
        LpsParameters(float("nan"), 1.0, 4, 1.0)


def test_lps_matches_a_simulated_limited_processor_sharing_queue() -> None:
    """Eq. 13 against a direct simulation of the LPS queue it models (exponential service, Poisson arrivals)."""
    rng = np.random.default_rng(3)
    alpha, mu, k = 9.0, 10.0, 4
    arrivals = np.cumsum(rng.exponential(1 / alpha, 200_000))
    # Under LPS with equal sharing, completions happen at rate mu whenever anyone is in service (memoryless), so the
    # resident count is an M/M/1 chain; a query waits for n - k + 1 completions if it finds n >= k residents.
    waits, completions, n = [], [], 0
    next_completion = math.inf
    for arrival in arrivals:
        while next_completion <= arrival:
            n -= 1
            completions.append(next_completion)
            next_completion = next_completion + rng.exponential(1 / mu) if n > 0 else math.inf
        if n >= k:
            waits.append(sum(rng.exponential(1 / mu, n - k + 1)))
        else:
            waits.append(0.0)
        n += 1
        if n == 1:
            next_completion = arrival + rng.exponential(1 / mu)
    simulated = float(np.mean(waits[10_000:]))
    assert simulated == pytest.approx(lps_wait_s(LpsParameters(alpha, mu, k, 1.0)), rel=0.1)


def test_arrival_statistics_of_a_poisson_process() -> None:
    rng = np.random.default_rng(4)
    rate, scv = arrival_statistics(np.cumsum(rng.exponential(0.5, 50_000)))
    assert rate == pytest.approx(2.0, rel=0.03)
    assert scv == pytest.approx(1.0, rel=0.05)
    with pytest.raises(ValueError):
        arrival_statistics([1.0, 1.0])
