"""What a router observes of each instance's outcomes, and the estimator's TTFTs as policies read them: the inputs of
`InstanceSignals` that do not come from a snapshot. Shared by the router service (fed by `ReportOutcome`) and usable by
the simulated pool's router (fed by simulated first tokens and completions).

    recent_ttft_s, recent_tpot_s   the last `window` observations at the instance, oldest first (vLLM-SR, SCORE,
                                   RouteBalance)
    request_throughput_rps         completions in the last `throughput_window_s`, per second (LMDeploy's proxy);
                                   the window is cut to the time since observation began, None before any completion
    ttft_offset_s                  the median of the last `residual_window` observed − estimated TTFTs, each
                                   weighted by 1 / observed TTFT (0 before `MIN_RESIDUALS`): what the estimate
                                   leaves out at this instance every time (the API server's tokenising and IPC, the
                                   network, overhead between engine steps). The weights make it the offset with the
                                   least mean absolute percentage error over the window — what TTFT targets and MAPE
                                   judge; the plain median let long TTFTs pull it (re-done on 10 recorded runs against a
                                   real vLLM server: median error 0.1–1.5 points lower in 9, 0.6 higher in one;
                                   MAPE about the same). A median ignores stalls (it tolerates up to half the
                                   window being outliers; a fitted slope, tried on a real vLLM server here, was
                                   thrown off by them). A residual over
                                   MAX_RESIDUAL_S and over the estimate itself is no overhead of that kind (a client
                                   reporting microseconds as milliseconds, a stall of seconds) and is not kept: a
                                   client reporting in the wrong unit took the offset to 25 s in 30 reports.
                                   Learnt apart for queries that found the engine idle (nothing running or waiting,
                                   as the estimator says) and queries that found it busy, once the window holds
                                   MIN_RESIDUALS of the kind (before, from all of them): an idle engine takes longer
                                   to start its first step than one between steps (vLLM CPU here: its TTFT ~7 ms over
                                   the replay's after 200 ms idle, ~2.5 ms for a busy one), which one offset for
                                   both splits the difference of, wrong for either (services/router/README.md).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from bear.routing.contract import Estimator

OBSERVATION_WINDOW = 1000  # recent TTFT/TPOT observations kept per instance
THROUGHPUT_WINDOW_S = 10.0
RESIDUAL_WINDOW = 64  # recent observed − estimated TTFTs kept per instance
MIN_RESIDUALS = 8
MIN_WEIGHTED_TTFT_S = 1e-4  # a reported TTFT of 0 weighs as 0.1 ms
MAX_RESIDUAL_S = 1.0  # observed later than estimated by more than this and more than the estimate: not an overhead


class InstanceObservations:
    """Outcomes observed at one instance. Not thread-safe: one owner (an event loop, a simulation) feeds and reads it."""

    def __init__(self, window: int = OBSERVATION_WINDOW, throughput_window_s: float = THROUGHPUT_WINDOW_S,
                 started_at_s: float = 0.0, residual_window: int = RESIDUAL_WINDOW) -> None:
        if window < 1 or not throughput_window_s > 0 or residual_window < 0:
            raise ValueError("window must be >= 1, throughput_window_s > 0 and residual_window >= 0")
        # (residual, observed TTFT, whether the query found the engine idle)
        self._residuals_s: deque[tuple[float, float, bool]] = deque(maxlen=residual_window)
        self._offsets_s = (0.0, 0.0)  # (busy, idle), as of the latest residual: read on every Route call
        self._ttft_s: deque[float] = deque(maxlen=window)
        self._tpot_s: deque[float] = deque(maxlen=window)
        self._completions_s: deque[float] = deque()
        self._throughput_window_s = throughput_window_s
        self._started_at_s = started_at_s

    def observe(self, ttft_s: float | None = None, tpot_s: float | None = None,
                completed_at_s: float | None = None, estimated_ttft_s: float | None = None,
                engine_idle: bool = False) -> None:
        """`estimated_ttft_s`: the estimator's TTFT for this query, without any offset (feeds `ttft_offset_s`);
        `engine_idle`: the estimator found the engine without work when the query arrived."""
        if ttft_s is not None and math.isfinite(ttft_s):
            self._ttft_s.append(ttft_s)
            if estimated_ttft_s is not None and math.isfinite(estimated_ttft_s) and self._residuals_s.maxlen:
                residual = ttft_s - estimated_ttft_s
                if residual <= max(MAX_RESIDUAL_S, estimated_ttft_s):
                    self._residuals_s.append((residual, ttft_s, engine_idle))
                    self._offsets_s = (self._offset_s(False), self._offset_s(True))
        if tpot_s is not None and math.isfinite(tpot_s):
            self._tpot_s.append(tpot_s)
        if completed_at_s is not None:
            self._completions_s.append(completed_at_s)

    @property
    def recent_ttft_s(self) -> tuple[float, ...]:
        return tuple(self._ttft_s)

    @property
    def recent_tpot_s(self) -> tuple[float, ...]:
        return tuple(self._tpot_s)

    def ttft_offset_s(self, engine_idle: bool = False) -> float:
        """The offset for a query that finds the engine idle (`engine_idle`) or busy."""
        return self._offsets_s[engine_idle]

    def _offset_s(self, engine_idle: bool) -> float:
        if len(self._residuals_s) < MIN_RESIDUALS:
            return 0.0
        rows = np.array(self._residuals_s)
        alike = rows[rows[:, 2] == engine_idle]
        if len(alike) >= MIN_RESIDUALS:
            rows = alike
        return weighted_median(rows[:, 0], 1.0 / np.maximum(rows[:, 1], MIN_WEIGHTED_TTFT_S))

    def request_throughput_rps(self, now_s: float) -> float | None:
        completions = self._completions_s
        while completions and completions[0] < now_s - self._throughput_window_s:
            completions.popleft()
        window_s = min(self._throughput_window_s, now_s - self._started_at_s)
        return len(completions) / window_s if window_s > 0 and completions else None


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The value at which the weights below and above balance (the lower one where they tie): the minimiser of
    Σ weight · |value − m|. Weights > 0."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def ttft_estimates_s(ttft_s: float | None, *, lps: bool = False,
                     prefill_tps_ttft_s: float | None = None) -> dict[str, float]:
    """An estimator's answer as `InstanceSignals.ttft_estimates_s`: the TTFT (math.inf: never served there) under
    `bea` whatever the method, and also under `lps` when the closed form produced it; eq. 8's under `prefill-tps`."""
    estimates: dict[str, float] = {}
    if ttft_s is not None:
        estimates[str(Estimator.BEA)] = ttft_s
        if lps:
            estimates[str(Estimator.LPS)] = ttft_s
    if prefill_tps_ttft_s is not None:
        estimates[str(Estimator.PREFILL_TPS)] = prefill_tps_ttft_s
    return estimates
