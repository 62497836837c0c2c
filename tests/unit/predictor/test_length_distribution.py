"""Expected remaining output of a running request: positive, bounded by max_tokens, a total that never shrinks as
the request lives on, exact against a direct computation over the ratio table."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bear.predictor.length_distribution import LengthDistribution


def _distribution(seed: int = 0, n: int = 4000, quantiles: int = 64) -> LengthDistribution:
    """Lengths around a predicted scale with a lognormal body and a few runaways."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(50, 800, n)
    actual = scale * rng.lognormal(0, 0.5, n)
    runaway = rng.random(n) < 0.03
    actual[runaway] = rng.uniform(1500, 4000, runaway.sum())
    return LengthDistribution.fit(np.rint(actual), scale, quantiles, tail_fraction=0.1)


def _direct(d: LengthDistribution, mu: float, g: float, cap: float) -> float:
    """E[min(L, cap) − g | L > g] by listing the table's lengths (the tail by its excesses), then the bounds."""
    q = d.ratios
    threshold = q.size - d.tail_points - 1
    if g / mu < q[threshold]:
        lengths = mu * q[mu * q > g]
        value = float(np.minimum(lengths, cap).mean()) - g
    else:
        value = float(np.minimum(mu * (q[threshold + 1:] - q[threshold]), cap - g).mean())
    return min(max(value, 1.0), cap - g)


def test_fit_calibrates_the_mean_and_scales_the_table_to_mean_one() -> None:
    actual = np.array([100.0, 200, 300, 400, 1000])
    scale = np.array([80.0, 160, 240, 320, 400])
    d = LengthDistribution.fit(actual, scale, num_quantiles=16)
    assert d.scale_to_mean == pytest.approx(actual.sum() / scale.sum())
    assert d.ratios.mean() == pytest.approx(1.0)
    assert (np.diff(d.ratios) >= 0).all() and d.ratios.size == 16


def test_a_request_that_has_generated_nothing_expects_its_predicted_mean() -> None:
    d = _distribution()
    assert d.expected_remaining(300.0, 0) == pytest.approx(300.0)
    assert d.expected_remaining(300.0, 0, max_tokens=200) < 200


@settings(max_examples=200, deadline=None)
@given(mu=st.floats(5, 3000), g=st.integers(0, 20_000), headroom=st.integers(1, 20_000))
def test_matches_a_direct_computation_and_stays_within_bounds(mu: float, g: int, headroom: int) -> None:
    d = _distribution()
    cap = g + headroom
    remaining = float(d.expected_remaining(mu, g, cap))
    assert remaining == pytest.approx(_direct(d, mu, g, cap), rel=1e-9, abs=1e-9)
    assert 1.0 <= remaining <= cap - g
    assert float(d.expected_remaining(mu, g)) >= 1.0


@pytest.mark.parametrize("cap", [None, 600, 4096])
@pytest.mark.parametrize("mu", [20.0, 250.0, 1200.0])
def test_the_expected_total_never_decreases_as_the_request_lives_on(mu: float, cap: int | None) -> None:
    d = _distribution()
    top = (cap or 50_000) - 1
    g = np.arange(0, top)
    total = g + d.expected_remaining(mu, g, cap)
    assert (np.diff(total) >= -1e-9 * total[1:]).all()
    if cap is not None:
        assert total.max() <= cap


def test_past_the_table_the_tail_is_memoryless() -> None:
    d = _distribution()
    far = d.expected_remaining(100.0, np.array([10_000, 20_000, 40_000]))
    assert np.allclose(far, far[0]) and far[0] > 1


def test_vectorised_calls_equal_one_by_one() -> None:
    d = _distribution()
    mu = np.array([50.0, 400.0, 400.0, 900.0])
    g = np.array([0, 100, 700, 5000])
    cap = np.array([100, 4096, 800, 8192])
    assert np.array_equal(d.expected_remaining(mu, g, cap),
                          [float(d.expected_remaining(m, x, c)) for m, x, c in zip(mu, g, cap, strict=True)])


@pytest.mark.parametrize(("g", "cap", "message"), [
    (10, 10, "max_tokens must exceed generated_tokens"),
    (-1, None, "generated_tokens finite and >= 0"),
    (float("nan"), None, "generated_tokens finite"),
])
def test_bad_requests(g: float, cap: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _distribution().expected_remaining(100.0, g, cap)


def test_bad_tables() -> None:
    with pytest.raises(ValueError, match="ascending"):
        LengthDistribution(np.array([1.0, 0.5, 2.0]), 1, 1.0)
    with pytest.raises(ValueError, match="tail_points"):
        LengthDistribution(np.array([0.5, 1.0, 1.5]), 2, 1.0)
    with pytest.raises(ValueError, match="scale_to_mean"):
        LengthDistribution(np.array([0.5, 1.0, 1.5]), 1, 0.0)


@pytest.mark.parametrize("scale_to_mean", [1e308, float("inf"), float("nan"), 2e9, 1e-12, -1.0])
def test_a_scale_to_mean_no_training_gives_is_refused(scale_to_mean: float) -> None:
    """(Probe: an artifact with 1e308 loaded, and `bear predictor predict` printed `"output_tokens": Infinity`.)"""
    with pytest.raises(ValueError, match=r"scale_to_mean must be a number in \[1e-09, 1e\+09\]"):
        LengthDistribution(np.array([0.5, 1.0, 1.5]), 1, scale_to_mean)
    for bound in (1e-9, 1e9):
        assert LengthDistribution(np.array([0.5, 1.0, 1.5]), 1, bound).scale_to_mean == bound
