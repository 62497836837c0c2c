"""Online calibration of one instance's batch-time model (eq. 12) from the steps its engine executes.

A rolling window keeps the latest executed steps (features and measured time: the execution and, on a synchronous
engine, its own work until the next step, `overhead_s`). A fit is non-negative least
squares on relative error (`bear.core.batch_time.fit`), made robust by trimming: after a first fit, steps whose relative
error is far outside the typical one (beyond OUTLIER_MADS robust standard deviations, and beyond MIN_OUTLIER_ERROR) are
left out and the fit is repeated, at most MAX_TRIM_ROUNDS times. Stalls of the host (a garbage collection, a page
fault storm, a noisy neighbour) make a few steps several times longer than the model can explain; they would otherwise
pull every coefficient up. The fit is published with its MAPE on the steps kept, their number, and the number trimmed,
together with the prefill throughput θ of eq. 8 (`bear.core.prefill_throughput`) on the same kept steps (0 when none
of them has prefill tokens).

The fit describes the engine over thousands of steps; its speed drifts on shorter scales (the host's other work, clock
changes). `recent_time_ratio` tells how fast the latest `recent_steps` steps ran against the fit: the median of each
step's `BatchTimeCoefficients.step_time_ratio` (the factor on the per-step and decode-attention terms, b0 and b2, that
gives it its measured time), with one odd step outvoted. On a real vLLM server here, whose steps vary 10-28 ms for the
same composition in stretches (consecutive steps' durations correlate at 0.58), scaling eq. 12 by the ratio of the 8
steps before took its per-step MAPE from 17% to 9.5%; applied to all four terms it made steps with prefill chunks
worse, on b0 and b2 alone it does not (`bear.core.batch_time`). Latest steps far from what the fit says (their
median measured ÷ predicted time outside [1 / OFF_RATIO, OFF_RATIO], whichever term is off) are no drift but a fit
that does not describe the engine's current batches, such as a first fit on 50 steps of few residents followed by
bigger batches (the demo's 8B: 3-20x too slow, for the 2 s until the next fit): the refit then comes after
FAST_REFIT_S, not the usual interval.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from bear.core.batch_time import BatchFeatures, BatchTimeCoefficients, CalibrationFit, fit
from bear.core.prefill_throughput import fit_prefill_throughput
from bear.core.wire import coefficients_to_proto, samples_from_records
from bear.v1 import calibration_pb2

OUTLIER_MADS = 4.0
MIN_OUTLIER_ERROR = 0.5  # a step is never trimmed for a relative error below 50 %
MAX_TRIM_ROUNDS = 3
OFF_RATIO = 2.0  # a recent ratio beyond [1 / OFF_RATIO, OFF_RATIO]: the fit does not describe the current batches
FAST_REFIT_S = 0.25  # the refit interval while it does not
_MAD_TO_SIGMA = 1.4826


class OnlineCalibrator:
    """Not thread-safe: fed and refitted by the sidecar's poll loop."""

    def __init__(self, window: int, min_samples: int, refit_interval_s: float, recent_steps: int = 0):
        self._samples: deque[tuple[BatchFeatures, float]] = deque(maxlen=window)
        self._recent_steps = recent_steps  # 0: no recent ratio
        self._fitted: BatchTimeCoefficients | None = None
        self._min_samples = min_samples
        self._refit_interval_s = refit_interval_s
        self._num_new = 0
        self._last_fit_at_s = -math.inf
        self.latest: calibration_pb2.BatchTimeCoefficients | None = None
        self.num_steps_seen = 0

    def add(self, records: Iterable[calibration_pb2.BatchRecord]) -> None:
        """Executed steps (duration > 0) join the window; the rest are ignored."""
        samples = samples_from_records(records)
        self._samples.extend(samples)
        self._num_new += len(samples)
        self.num_steps_seen += len(samples)

    def refit_if_due(self, now_s: float) -> calibration_pb2.BatchTimeCoefficients | None:
        """Fits again if enough steps are in the window, some are new, and the last fit is old enough. Returns the
        new coefficients, or None if no fit was due (or possible)."""
        if len(self._samples) < self._min_samples or self._num_new == 0:
            return None
        interval = self._refit_interval_s
        if interval > FAST_REFIT_S and self._fitted is not None:
            ratio = self._recent_median(lambda f, t, fitted: t / p if (p := fitted.time_s(f)) > 0 else None)
            if ratio > 0 and not 1 / OFF_RATIO <= ratio <= OFF_RATIO:
                interval = FAST_REFIT_S
        if now_s - self._last_fit_at_s < interval:
            return None
        self._last_fit_at_s, self._num_new = now_s, 0
        try:
            result, kept = trimmed_fit(list(self._samples))
        except ValueError:  # no usable step (e.g. only empty batches)
            return None
        self._fitted = result.coefficients
        message = coefficients_to_proto(result, fitted_at_s=now_s)
        message.num_outliers = len(self._samples) - len(kept)
        message.prefill_tokens_per_s = prefill_throughput_or_zero(kept)
        self.latest = message
        return message

    def recent_time_ratio(self) -> float:
        """Median, over the latest `recent_steps` steps, of the factor on the latest fit's per-step and
        decode-attention terms that gives each step its measured time (`BatchTimeCoefficients.step_time_ratio`); 0
        when there is no fit, no step, or the ratio is turned off."""
        return self._recent_median(lambda f, t, fitted: fitted.step_time_ratio(f, t))

    def _recent_median(self, ratio: Callable[[BatchFeatures, float, BatchTimeCoefficients], float | None]) -> float:
        """Median of `ratio(features, measured time, latest fit)` over the latest `recent_steps` steps (None: left
        out); 0 when there is no fit, no step, or the ratio is turned off."""
        if self._fitted is None or self._recent_steps == 0 or not self._samples:
            return 0.0
        count = min(self._recent_steps, len(self._samples))
        ratios = [r for f, t in (self._samples[-i] for i in range(count, 0, -1))
                  if (r := ratio(f, t, self._fitted)) is not None]
        return float(np.median(ratios)) if ratios else 0.0


def robust_fit(samples: list[tuple[BatchFeatures, float]]) -> tuple[CalibrationFit, int]:
    """Eq. 12 fitted with outliers trimmed; returns the fit on the kept samples and how many were trimmed."""
    result, kept = trimmed_fit(samples)
    return result, len(samples) - len(kept)


def trimmed_fit(samples: list[tuple[BatchFeatures, float]]
                ) -> tuple[CalibrationFit, list[tuple[BatchFeatures, float]]]:
    """Eq. 12 fitted with outliers trimmed; returns the fit and the samples it was fitted on."""
    kept = [(f, t) for f, t in samples if math.isfinite(t) and t > 0 and f.num_tokens > 0]
    result = fit(kept)
    for _ in range(MAX_TRIM_ROUNDS):
        errors = relative_errors(result, kept)
        center = float(np.median(errors))
        spread = _MAD_TO_SIGMA * float(np.median(np.abs(errors - center)))
        limit = max(OUTLIER_MADS * spread, MIN_OUTLIER_ERROR)
        inliers = np.abs(errors - center) <= limit
        if inliers.all() or inliers.sum() < 4:
            break
        kept = [sample for sample, keep in zip(kept, inliers) if keep]
        result = fit(kept)
    return result, kept


def prefill_throughput_or_zero(samples: list[tuple[BatchFeatures, float]]) -> float:
    """Eq. 8's θ (prefill tokens per second) on `samples`; 0 when none of them has prefill tokens."""
    try:
        return fit_prefill_throughput(samples)
    except ValueError:
        return 0.0


def relative_errors(result: CalibrationFit, samples: list[tuple[BatchFeatures, float]]) -> np.ndarray:
    """(predicted − measured) / measured, per sample."""
    coefficients = result.coefficients
    predicted = np.array([coefficients.time_s(f) for f, _ in samples])
    measured = np.array([t for _, t in samples])
    return (predicted - measured) / measured
