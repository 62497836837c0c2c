"""Arrival processes and TTFT targets of the paper's experiments."""

from __future__ import annotations

import numpy as np
import pytest

from bear.evaluation.workload import Mmpp2, poisson_arrivals_s, ttft_targets_s


def test_poisson_arrivals_have_the_rate_and_exponential_gaps() -> None:
    times = poisson_arrivals_s(8.0, 40_000, np.random.default_rng(0))
    gaps = np.diff(times)
    assert np.all(gaps > 0)
    assert 1 / gaps.mean() == pytest.approx(8.0, rel=0.03)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize(("mean", "ratio", "low", "high"), [(6, 3, 4.29, 12.86), (8, 6, 4.0, 24.0), (7, 6, 3.5, 21.0)])
def test_mmpp2_rates_match_the_papers_table_3(mean: float, ratio: float, low: float, high: float) -> None:
    process = Mmpp2(mean, ratio)
    assert process.low_rate_qps == pytest.approx(low, abs=0.01)
    assert process.high_rate_qps == pytest.approx(high, abs=0.01)


def test_mmpp2_keeps_the_mean_rate_and_is_burstier_than_poisson() -> None:
    times = Mmpp2(8.0, 6.0).arrivals_s(200_000, np.random.default_rng(1))
    gaps = np.diff(times)
    assert len(times) / times[-1] == pytest.approx(8.0, rel=0.05)
    assert gaps.var() / gaps.mean() ** 2 > 1.3  # squared coefficient of variation above Poisson's 1


def test_ttft_targets_follow_appendix_a2() -> None:
    rng = np.random.default_rng(2)
    prompts = np.array([1, 1000, 10_000, 400_000] * 5000)
    targets = ttft_targets_s(prompts, rng)
    assert targets.min() >= 0.150 and targets.max() <= 1.120
    mid = targets[prompts == 10_000]
    assert mid.mean() == pytest.approx(0.158 + 3.5e-3 * 10_000 / 1000, rel=0.01)
    assert np.all(targets[prompts == 400_000] == 1.120)
    short = targets[prompts == 1]  # u + 155·v ms: 152.9 to 163.1
    assert short.min() >= 0.1529 and short.max() <= 0.1632
    loose = ttft_targets_s(prompts, np.random.default_rng(2), looseness=2.0)
    assert np.allclose(loose, 2 * targets)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="arrival rate"):
        poisson_arrivals_s(0.0, 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="ratio"):
        Mmpp2(5.0, 0.5)
    with pytest.raises(ValueError, match="looseness"):
        ttft_targets_s(np.array([10]), np.random.default_rng(0), looseness=0)
