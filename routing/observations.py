"""What a router observes of each instance's outcomes, and the estimator's TTFTs as policies read them: the inputs of
`InstanceSignals` that do not come from a snapshot. Shared by the router service (fed by `ReportOutcome`) and usable by
the simulated pool's router (fed by simulated first tokens and completions).

    recent_ttft_s, recent_tpot_s   the last `window` observations at the instance, oldest first (vLLM-SR, SCORE,
                                   RouteBalance)
    request_throughput_rps         completions in the last `throughput_window_s`, per second (LMDeploy's proxy);
                                   the window is cut to the time since observation began, None before any completion
"""

from __future__ import annotations

import math
from collections import deque

from bear.routing.contract import Estimator

OBSERVATION_WINDOW = 1000  # recent TTFT/TPOT observations kept per instance
THROUGHPUT_WINDOW_S = 10.0


class InstanceObservations:
    """Outcomes observed at one instance. Not thread-safe: one owner (an event loop, a simulation) feeds and reads it."""

    def __init__(self, window: int = OBSERVATION_WINDOW, throughput_window_s: float = THROUGHPUT_WINDOW_S,
                 started_at_s: float = 0.0) -> None:
        if window < 1 or not throughput_window_s > 0:
            raise ValueError("window must be >= 1 and throughput_window_s > 0")
        self._ttft_s: deque[float] = deque(maxlen=window)
        self._tpot_s: deque[float] = deque(maxlen=window)
        self._completions_s: deque[float] = deque()
        self._throughput_window_s = throughput_window_s
        self._started_at_s = started_at_s

    def observe(self, ttft_s: float | None = None, tpot_s: float | None = None,
                completed_at_s: float | None = None) -> None:
        if ttft_s is not None and math.isfinite(ttft_s):
            self._ttft_s.append(ttft_s)
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

    def request_throughput_rps(self, now_s: float) -> float | None:
        completions = self._completions_s
        while completions and completions[0] < now_s - self._throughput_window_s:
            completions.popleft()
        window_s = min(self._throughput_window_s, now_s - self._started_at_s)
        return len(completions) / window_s if window_s > 0 and completions else None


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
