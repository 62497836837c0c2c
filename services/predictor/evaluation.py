"""How good the predictions are, against the constant predictor that needs no model.

Per model: accuracy_mae (mean |predicted − score|), accuracy_spearman (rank correlation of predicted and real scores;
0 for a constant prediction, which ranks nothing) and length_mape (mean |predicted − real| / real output tokens).

The constant baseline is the best constant for each metric, fitted on the training table and stored with the model: the
median score per model (it minimises the absolute error) and the output length that minimises MAPE (the median of the
lengths weighted by their inverses). Beating it is the least a learned model must do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

METRICS = ("accuracy_mae", "accuracy_spearman", "length_mape")


@dataclass(frozen=True, slots=True)
class ConstantBaseline:
    accuracy: float
    output_tokens: float

    @staticmethod
    def fit(scores: np.ndarray, output_tokens: np.ndarray) -> ConstantBaseline:
        return ConstantBaseline(float(np.median(scores)), mape_optimal_constant(output_tokens))


def metrics(predicted_accuracy: np.ndarray, scores: np.ndarray, predicted_tokens: np.ndarray,
            output_tokens: np.ndarray) -> dict[str, float]:
    return {
        "accuracy_mae": float(np.mean(np.abs(predicted_accuracy - scores))),
        "accuracy_spearman": spearman(predicted_accuracy, scores),
        "length_mape": float(np.mean(np.abs(predicted_tokens - output_tokens) / output_tokens)),
    }


def report(models: np.ndarray, scores: np.ndarray, output_tokens: np.ndarray, predicted_accuracy: np.ndarray,
           predicted_tokens: np.ndarray, baselines: Mapping[str, ConstantBaseline]) -> dict[str, Any]:
    """`{"models": {model: metrics}, "constant_baseline": {model: metrics}}` for the models present, in `baselines`'
    order (the catalogue's)."""
    learned: dict[str, dict[str, float]] = {}
    constant: dict[str, dict[str, float]] = {}
    for model, baseline in baselines.items():
        rows = models == model
        if not rows.any():
            continue
        s, n = scores[rows], output_tokens[rows].astype(np.float64)
        learned[model] = metrics(predicted_accuracy[rows], s, predicted_tokens[rows], n)
        constant[model] = metrics(np.full_like(s, baseline.accuracy), s, np.full_like(n, baseline.output_tokens), n)
    return {"models": learned, "constant_baseline": constant}


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); 0 when either side is constant."""
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    return float(np.corrcoef(_average_ranks(a), _average_ranks(b))[0, 1])


def mape_optimal_constant(values: np.ndarray) -> float:
    """argmin_c mean(|c − y| / y): the median of y weighted by 1 / y."""
    order = np.sort(values.astype(np.float64))
    weights = 1.0 / order
    cumulative = np.cumsum(weights)
    return float(order[np.searchsorted(cumulative, cumulative[-1] / 2)])


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing the mean of their ranks (scipy's rankdata, without importing scipy.stats)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts
    return (first + (counts + 1) / 2.0)[inverse]
