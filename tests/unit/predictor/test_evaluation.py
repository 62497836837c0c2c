"""The metrics and the constant baseline, on numbers small enough to check by hand."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from bear.predictor.evaluation import ConstantBaseline, mape_optimal_constant, metrics, report, spearman


def test_metrics_by_hand() -> None:
    result = metrics(np.array([0.5, 0.5, 1.0]), np.array([0.0, 1.0, 1.0]), np.array([100.0, 300.0, 50.0]),
                     np.array([200.0, 300.0, 100.0]))
    assert result["accuracy_mae"] == pytest.approx(1 / 3)
    assert result["length_mape"] == pytest.approx((0.5 + 0 + 0.5) / 3)
    assert result["accuracy_spearman"] == pytest.approx(spearmanr([0.5, 0.5, 1.0], [0.0, 1.0, 1.0]).statistic)


def test_spearman_matches_scipy_and_is_zero_for_a_constant() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=300), rng.normal(size=300)
    b[:100] = a[:100]
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic)
    assert spearman(np.full(5, 0.7), np.arange(5.0)) == 0.0


def test_the_mape_optimal_constant_beats_every_other_constant() -> None:
    values = np.random.default_rng(5).lognormal(5, 1, 301)
    best = mape_optimal_constant(values)

    def mape(c: float) -> float:
        return float(np.mean(np.abs(c - values) / values))

    grid = np.linspace(values.min(), values.max(), 2000)
    assert mape(best) <= min(mape(c) for c in grid) + 1e-12
    assert best < np.median(values)  # relative error favours the short ones


def test_a_report_covers_the_models_present_against_their_baselines() -> None:
    models = np.array(["a", "a", "b", "b"], dtype=object)
    scores = np.array([0.2, 0.8, 0.4, 0.6])
    tokens = np.array([100, 200, 300, 400])
    baselines = {"a": ConstantBaseline.fit(scores[:2], tokens[:2]), "b": ConstantBaseline(0.5, 350.0),
                 "c": ConstantBaseline(0.5, 1.0)}
    out = report(models, scores, tokens, scores.copy(), tokens.astype(float), baselines)
    assert list(out["models"]) == list(out["constant_baseline"]) == ["a", "b"]
    assert out["models"]["a"] == pytest.approx({"accuracy_mae": 0.0, "accuracy_spearman": 1.0, "length_mape": 0.0})
    assert out["constant_baseline"]["b"]["accuracy_mae"] == pytest.approx(0.1)
    assert out["constant_baseline"]["a"]["accuracy_spearman"] == 0.0
