"""How a model's real output length spreads around its prediction, and what remains of a running request.

The output-length model predicts, per prompt, a scale s = exp(f(x)) (LightGBM fitted on log tokens, so it fits relative
errors and is not thrown by the long tail). Out-of-fold pairs of real length and predicted scale (each row predicted by
a model that did not see its prompt) calibrate it: the mean is μ = s·`scale_to_mean` with scale_to_mean = Σ real /
Σ s, so that predicted means add up to real lengths and costs are right in aggregate. Around μ, a model's lengths follow
L = μ·q, with q drawn from the model's ratios real / μ, kept as `num_quantiles` quantiles scaled to mean 1 (so that the
expected length of a request that has generated nothing is μ).

For a request predicted at μ that has generated g tokens and may generate at most M (its max_tokens), the estimator
needs

    expected_remaining = E[min(L, M) − g | L > g]

rather than μ − g, which turns negative for every request that outlives its mean. Within the table the expectation is
exact over the ratios above g/μ. Past the table's last `tail_points` ratios there is too little data, so the tail is
taken as memoryless: beyond the threshold t = μ·q_T, L − g given L > g is distributed as L − t given L > t (the
excesses of the last ratios). The result is at least 1 token and at most M − g; at g = 0 without a cap it is μ; and
the expected total g + remaining = E[min(L, M) | L > g] never decreases as g grows
(tests/unit/predictor/test_length_distribution.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bear.predictor.evals import MAX_OUTPUT_TOKENS

UNBOUNDED = 1e18  # max_tokens when the request sets none
# scale_to_mean = Σ real / Σ predicted scale, over lengths in [1, MAX_OUTPUT_TOKENS] (evals.py) and scales exp(f(x)) of
# a regressor fitted on their logs, hence within about the same range: a ratio outside [1/M, M] is a corrupt artifact.
MAX_SCALE_TO_MEAN = float(MAX_OUTPUT_TOKENS)


@dataclass(frozen=True, slots=True, eq=False)
class LengthDistribution:
    ratios: np.ndarray  # sorted ascending, mean 1: quantiles of actual / predicted mean output length
    tail_points: int  # the last `tail_points` ratios form the memoryless tail
    scale_to_mean: float  # Σ real / Σ predicted scale: the mean length is scale × scale_to_mean

    def __post_init__(self) -> None:
        r = self.ratios
        if r.ndim != 1 or r.size < 3 or not np.isfinite(r).all() or (r <= 0).any() or (np.diff(r) < 0).any():
            raise ValueError("length ratios must be at least 3 finite positive numbers in ascending order")
        if not 1 <= self.tail_points <= r.size - 2:
            raise ValueError(f"tail_points must be in [1, {r.size - 2}], got {self.tail_points}")
        if not 1 / MAX_SCALE_TO_MEAN <= self.scale_to_mean <= MAX_SCALE_TO_MEAN:  # NaN fails it too
            raise ValueError(f"scale_to_mean must be a number in [{1 / MAX_SCALE_TO_MEAN:g}, {MAX_SCALE_TO_MEAN:g}], "
                             f"got {self.scale_to_mean!r}")

    @staticmethod
    def fit(actual: np.ndarray, predicted_scale: np.ndarray, num_quantiles: int = 256,
            tail_fraction: float = 0.05) -> LengthDistribution:
        """From out-of-fold pairs of one model: real output tokens and the scale predicted for them."""
        if actual.size < 3 or actual.shape != predicted_scale.shape:
            raise ValueError(f"need at least 3 aligned (actual, predicted) pairs, got {actual.size}")
        scale = np.maximum(predicted_scale, 1e-9)
        scale_to_mean = float(actual.sum() / scale.sum())
        ratios = actual / (scale * scale_to_mean)
        table = np.maximum.accumulate(np.quantile(ratios, (np.arange(num_quantiles) + 0.5) / num_quantiles))
        tail = min(max(1, round(tail_fraction * num_quantiles)), num_quantiles - 2)
        return LengthDistribution(table / table.mean(), tail, scale_to_mean)

    def expected_remaining(self, predicted_tokens: np.ndarray | float, generated_tokens: np.ndarray | float,
                           max_tokens: np.ndarray | float | None = None) -> np.ndarray:
        """E[min(L, M) − g | L > g] for each (predicted mean μ, g, M) (broadcast), at least 1 and at most M − g."""
        mu = np.maximum(np.asarray(predicted_tokens, dtype=np.float64), 1.0)
        g = np.asarray(generated_tokens, dtype=np.float64)
        cap = np.asarray(UNBOUNDED if max_tokens is None else max_tokens, dtype=np.float64)
        if not (np.isfinite(mu).all() and np.isfinite(g).all() and (g >= 0).all()):
            raise ValueError("predicted_tokens must be finite and generated_tokens finite and >= 0")
        if (cap <= g).any():
            raise ValueError("max_tokens must exceed generated_tokens: a request at its max_tokens has finished")
        mu, g, cap = np.broadcast_arrays(mu, g, cap)
        r = self.ratios
        k = r.size
        threshold = k - self.tail_points - 1  # index of the tail's threshold ratio r_T
        prefix = np.concatenate(([0.0], np.cumsum(r)))
        # Within the table: the ratios above g/μ, each contributing min(μ·r, M).
        first = np.searchsorted(r, g / mu, side="right")
        capped = np.maximum(np.searchsorted(r, cap / mu, side="left"), first)
        body_sum = mu * (prefix[capped] - prefix[first]) + cap * (k - capped)
        body = body_sum / np.maximum(k - first, 1) - g
        # The memoryless tail: excesses over r_T, capped at M − g.
        excess = r[threshold + 1:] - r[threshold]
        excess_prefix = np.concatenate(([0.0], np.cumsum(excess)))
        excess_capped = np.searchsorted(excess, (cap - g) / mu, side="left")
        tail = (mu * excess_prefix[excess_capped] + (cap - g) * (excess.size - excess_capped)) / excess.size
        remaining = np.where(g / mu < r[threshold], body, tail)
        return np.clip(remaining, 1.0, cap - g)
