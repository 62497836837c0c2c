"""Eq. 12 features and the calibration fit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bear.core.batch_time import BatchFeatures, BatchTimeCoefficients, fit, mape

TRUE = BatchTimeCoefficients(b0=4e-3, b1=2e-5, b2=1e-8, b3=1e-9)


def _random_batches(rng: np.random.Generator, count: int, *, decode: bool = True, prefill: bool = True) -> list[BatchFeatures]:
    batches = []
    for _ in range(count):
        entries = []
        if decode:
            entries += [(0, 1, int(c)) for c in rng.integers(10, 4000, size=int(rng.integers(1, 64)))]
        if prefill and (not decode or rng.random() < 0.4):
            entries += [(int(rng.integers(1, 2048)), 0, int(rng.integers(0, 2000)))]
        batches.append(BatchFeatures.of_batch(entries))
    return batches


def test_features_follow_eq_12() -> None:
    features = BatchFeatures.of_batch([(0, 1, 900), (0, 1, 100), (300, 0, 0), (200, 0, 50)])
    assert features == BatchFeatures(num_prefill_tokens=500, num_decode_tokens=2, decode_context=1000,
                                      prefill_attention=300 * 301 // 2 + 200 * 50 + 200 * 201 // 2)
    assert features.num_tokens == 502
    assert TRUE.time_s(features) == pytest.approx(4e-3 + 2e-5 * 502 + 1e-8 * 1000 + 1e-9 * features.prefill_attention)


def test_fit_recovers_known_coefficients_from_exact_records() -> None:
    batches = _random_batches(np.random.default_rng(0), 300)
    result = fit([(b, TRUE.time_s(b)) for b in batches])
    for name in ("b0", "b1", "b2", "b3"):
        assert getattr(result.coefficients, name) == pytest.approx(getattr(TRUE, name), rel=1e-6)
    assert result.mape < 1e-9 and result.num_samples == 300 and result.num_rejected == 0


def test_fit_minimises_relative_error_under_noise() -> None:
    rng = np.random.default_rng(1)
    batches = _random_batches(rng, 2000)
    durations = [TRUE.time_s(b) * float(rng.lognormal(0.0, 0.05)) for b in batches]
    result = fit(list(zip(batches, durations)))
    assert 0.02 < result.mape < 0.06
    assert result.coefficients.b1 == pytest.approx(TRUE.b1, rel=0.1)
    # Relative weighting: small prefill-free steps are predicted as well as large ones.
    small = [b for b in batches if b.num_tokens < 8]
    large = [b for b in batches if b.num_tokens > 1000]
    assert small and large
    errors = [abs(result.coefficients.time_s(b) / TRUE.time_s(b) - 1) for b in small + large]
    assert max(errors) < 0.1


@pytest.mark.parametrize("kind", ["decode_only", "prefill_only", "few_rows", "constant"])
def test_fit_stays_finite_and_non_negative_on_degenerate_records(kind: str) -> None:
    rng = np.random.default_rng(2)
    if kind == "decode_only":
        batches = _random_batches(rng, 50, prefill=False)
    elif kind == "prefill_only":
        batches = _random_batches(rng, 50, decode=False)
    elif kind == "few_rows":
        batches = _random_batches(rng, 2)
    else:
        batches = [BatchFeatures.of_batch([(0, 1, 100)])] * 10
    samples = [(b, TRUE.time_s(b) * float(rng.lognormal(0.0, 0.2))) for b in batches]
    result = fit(samples)
    values = [result.coefficients.b0, result.coefficients.b1, result.coefficients.b2, result.coefficients.b3]
    assert all(math.isfinite(v) and v >= 0 for v in values)
    assert math.isfinite(result.mape)
    if kind == "decode_only":
        assert result.coefficients.b3 == 0.0  # nothing in the log identifies the prefill term


def test_fit_rejects_unusable_records() -> None:
    good = BatchFeatures.of_batch([(0, 1, 10)])
    result = fit([(good, 0.01), (good, 0.0), (good, float("nan")), (BatchFeatures(), 0.01)])
    assert result.num_samples == 1 and result.num_rejected == 3
    with pytest.raises(ValueError, match="at least one record"):
        fit([(good, -1.0)])


def test_coefficients_must_be_finite_and_non_negative() -> None:
    with pytest.raises(ValueError, match="b2"):
        BatchTimeCoefficients(0.0, 0.0, -1e-9, 0.0)
    with pytest.raises(ValueError, match="b0"):
        BatchTimeCoefficients(float("inf"), 0.0, 0.0, 0.0)


def test_mape() -> None:
    assert mape([1.1, 0.9], [1.0, 1.0]) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        mape([], [])


def test_coefficients_at_a_speed_scale_the_per_step_and_decode_attention_terms() -> None:
    coefficients = BatchTimeCoefficients(b0=4e-3, b1=2e-5, b2=1e-8, b3=1e-9)
    for factor in (0.0, -1.0, math.nan, math.inf):
        assert coefficients.at_speed(factor) == coefficients  # not a known speed
    assert coefficients.at_speed(0.8) == BatchTimeCoefficients(b0=0.8 * 4e-3, b1=2e-5, b2=0.8 * 1e-8, b3=1e-9)


@pytest.mark.parametrize("entries", [[(0, 1, 2000), (0, 1, 50)], [(300, 0, 100), (0, 1, 2000)], [(512, 0, 0)]])
def test_a_steps_time_ratio_is_the_speed_that_gives_it_its_measured_time(entries: list[tuple[int, int, int]]) -> None:
    """The ratio scales the per-step and decode-attention terms alone (`at_speed`), and is their inverse."""
    coefficients = BatchTimeCoefficients(b0=4e-3, b1=2e-5, b2=1e-8, b3=1e-9)
    features = BatchFeatures.of_batch(entries)
    for ratio in (0.7, 1.0, 1.3, 3.0):
        measured = coefficients.at_speed(ratio).time_s(features)
        assert coefficients.step_time_ratio(features, measured) == pytest.approx(ratio, rel=1e-12)
    fixed = coefficients.b1 * features.num_tokens + coefficients.b3 * features.prefill_attention
    assert coefficients.step_time_ratio(features, fixed / 2) == 0.0  # faster than the terms that do not drift
    assert BatchTimeCoefficients(0.0, 2e-5, 0.0, 1e-9).step_time_ratio(features, 1e-3) is None  # nothing to scale
