"""The per-step time model (paper eq. 12) and its calibration from logged steps.

    T = b0 + b1·Σ(prefill + decode tokens) + b2·Σ(context·decode) + b3·Σ(prefill·context + prefill·(prefill + 1)/2)

Features are exact integers. A time over many batches is evaluated once on their summed features, in one fixed order
(`time_s`), by both the compiled core and the Python reference, so the two agree to the last bit however the batches
were summed.

An engine's speed drifts on shorter scales than a fit describes (the host's other work, clocks). What drifts is the
work every step does whatever its tokens, and decode attention: a snapshot's `step_time_ratio` scales b0 and b2 alone
(`at_speed`), and is measured on those terms (`step_time_ratio`). On two runs against a real vLLM server here, the
ratio of the 8 steps before, applied to all four terms, took decode-only steps' median error from 9–10% to 5.5% but
made steps with prefill chunks worse (mixed steps 5.4% → 8.0–8.5%, prefill-only 5.6–8.0% → 7.2–7.7%); on b0 and b2
alone it kept the decode steps' gain and left mixed steps at 5.4–5.5%, prefill-only ones at 5.1–7.3% — and the
query's own prefill makes most of a TTFT.

Calibration is non-negative least squares with every row divided by its measured time, so the fit minimises relative
error — what MAPE measures. Unweighted fits let the many long steps dominate: on a real vLLM step log they over-predict
the dominant decode-only steps and under-predict small prefill steps by 11–16%.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls


@dataclass(frozen=True, slots=True)
class BatchTimeCoefficients:
    """Eq. 12 coefficients of one instance, in seconds."""

    b0: float  # per step
    b1: float  # per scheduled token
    b2: float  # per decode token × context token
    b3: float  # per prefill attention pair

    def __post_init__(self) -> None:
        for name in ("b0", "b1", "b2", "b3"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"batch time coefficient {name} must be a finite number >= 0, got {value!r}")

    def at_speed(self, step_time_ratio: float) -> BatchTimeCoefficients:
        """At a snapshot's `step_time_ratio` where it is known (a finite number > 0; else as they are): the per-step
        and decode-attention terms (b0, b2) multiplied by it, the per-token and prefill-attention terms (b1, b3) as
        fitted. The inverse of `step_time_ratio`."""
        if math.isfinite(step_time_ratio) and step_time_ratio > 0:
            return BatchTimeCoefficients(self.b0 * step_time_ratio, self.b1, self.b2 * step_time_ratio, self.b3)
        return self

    def step_time_ratio(self, features: BatchFeatures, measured_s: float) -> float | None:
        """The factor on the per-step and decode-attention terms (b0, b2) that gives one step of `features` its
        `measured_s`, the other terms as fitted (at least 0); None when the step has neither term (b0 and b2 zero)."""
        varying_s = self.b0 + self.b2 * features.decode_context
        if varying_s <= 0:
            return None
        return max(0.0, measured_s - self.b1 * features.num_tokens - self.b3 * features.prefill_attention) / varying_s

    def time_s(self, features: BatchFeatures, num_batches: int = 1) -> float:
        """Time of `num_batches` batches whose features sum to `features` (the one evaluation order)."""
        return (
            self.b0 * num_batches
            + self.b1 * features.num_tokens
            + self.b2 * features.decode_context
            + self.b3 * features.prefill_attention
        )


@dataclass(frozen=True, slots=True)
class BatchFeatures:
    """Eq. 12 features of one batch, or summed over several."""

    num_prefill_tokens: int = 0  # Σ prefill tokens (also what the prefill-throughput estimator counts)
    num_decode_tokens: int = 0  # Σ decode tokens
    decode_context: int = 0  # Σ context · decode
    prefill_attention: int = 0  # Σ prefill · context + prefill · (prefill + 1) / 2

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @staticmethod
    def of_request(num_prefill_tokens: int, num_decode_tokens: int, num_context_tokens: int) -> BatchFeatures:
        p, c = num_prefill_tokens, num_context_tokens
        return BatchFeatures(p, num_decode_tokens, c * num_decode_tokens, p * c + p * (p + 1) // 2)

    @staticmethod
    def of_batch(entries: Iterable[tuple[int, int, int]]) -> BatchFeatures:
        """Features of a batch from (prefill tokens, decode tokens, context tokens) per scheduled request."""
        prefill_tokens = decode_tokens = decode_context = prefill_attention = 0
        for p, d, c in entries:
            prefill_tokens += p
            decode_tokens += d
            decode_context += c * d
            prefill_attention += p * c + p * (p + 1) // 2
        return BatchFeatures(prefill_tokens, decode_tokens, decode_context, prefill_attention)

    def __add__(self, other: BatchFeatures) -> BatchFeatures:
        return BatchFeatures(
            self.num_prefill_tokens + other.num_prefill_tokens,
            self.num_decode_tokens + other.num_decode_tokens,
            self.decode_context + other.decode_context,
            self.prefill_attention + other.prefill_attention,
        )


def is_decode(num_scheduled_tokens: int) -> bool:
    """Whether a request's tokens in a step count as decode (else prefill): exactly one token, as vLLM's attention
    backends split a batch (`split_decodes_and_prefills`, decode_threshold 1) — its cost is one token against its
    context, whether that token is an output or the last of a prompt or recomputation."""
    return num_scheduled_tokens == 1


@dataclass(frozen=True, slots=True)
class CalibrationFit:
    coefficients: BatchTimeCoefficients
    mape: float  # mean absolute percentage error on the fitted records, as a fraction
    num_samples: int  # records used
    num_rejected: int  # records dropped (non-positive or non-finite durations, empty batches)


def fit(samples: Sequence[tuple[BatchFeatures, float]], *, balance_prefill: bool = True) -> CalibrationFit:
    """Fits eq. 12 to (features, measured duration) pairs, minimising relative error under b ≥ 0.

    Steps with prefill chunks are rare in a step log (a few percent: every request decodes hundreds of steps for one
    prefill) yet they make most of a TTFT, so with `balance_prefill` the two kinds of step weigh the same in the
    fit, whatever their counts. Degenerate logs (only decodes, only prefills, fewer rows than coefficients) give
    coefficients that are finite and non-negative; the terms the log cannot identify get zero weight. Raises
    ValueError if no usable record remains.
    """
    usable = [(f, t) for f, t in samples if math.isfinite(t) and t > 0 and f.num_tokens > 0]
    if not usable:
        raise ValueError("calibration needs at least one record with a positive duration and scheduled tokens")
    design = np.array([[1.0, f.num_tokens, f.decode_context, f.prefill_attention] for f, _ in usable])
    durations = np.array([t for _, t in usable])
    weights = 1.0 / durations  # row i divided by t_i: residuals become relative errors
    if balance_prefill:
        with_prefill = np.array([f.num_prefill_tokens > 0 for f, _ in usable])
        count = with_prefill.sum()
        if 0 < count < len(usable):  # sqrt: least squares weighs squared residuals
            weights = weights * np.where(with_prefill, np.sqrt(len(usable) / (2 * count)),
                                         np.sqrt(len(usable) / (2 * (len(usable) - count))))
    weighted = design * weights[:, None]
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0  # a feature absent from every record keeps coefficient 0
    solution, _ = nnls(weighted / scale, durations * weights, maxiter=50 * design.shape[1])
    coefficients = BatchTimeCoefficients(*(float(max(b, 0.0)) for b in solution / scale))
    predicted = design @ np.array([coefficients.b0, coefficients.b1, coefficients.b2, coefficients.b3])
    return CalibrationFit(
        coefficients=coefficients,
        mape=mape(predicted, durations),
        num_samples=len(usable),
        num_rejected=len(samples) - len(usable),
    )


def mape(predicted: Sequence[float] | np.ndarray, actual: Sequence[float] | np.ndarray) -> float:
    """Mean absolute percentage error, as a fraction."""
    predicted_array, actual_array = np.asarray(predicted, dtype=float), np.asarray(actual, dtype=float)
    if predicted_array.shape != actual_array.shape or actual_array.size == 0:
        raise ValueError("mape needs two non-empty sequences of equal length")
    return float(np.mean(np.abs(predicted_array - actual_array) / np.abs(actual_array)))
