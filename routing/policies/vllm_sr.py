"""`vllm-sr`: vLLM Semantic Router's latency-aware selection: the instance whose recently observed TTFT and TPOT
percentiles are lowest, each normalised by the best candidate's:

    s_j = (1/|P|) Σ_{p ∈ P} perc_p(j) / min_k perc_p(k),   P ⊆ {TTFT, TPOT} (metrics whose percentile is set)
    choose argmin_j s_j

perc_p(j) is the `ttft_percentile`-th (or `tpot_percentile`-th) percentile of the last `window` observations at the
instance (`recent_ttft_s`, `recent_tpot_s`, oldest first), by linear interpolation between order statistics
(rank q·(n − 1)); with fewer than 3 observations it is their exponential moving average (weight 0.3 on each newer
one). A minimum ≤ 0 divides by 1. Quality and cost play no part.

Source: github.com/vllm-project/semantic-router, `pkg/selection/latency_aware.go` (the score above, argmin, first
candidate on ties or when no candidate has data) and `pkg/latency/cache.go` (a sliding window of the last 1000
observations per model, interpolated percentiles from 3 observations, the 0.3 moving average below that), and its
paper's §"Latency-Aware Selection"; defaults from its shipped `latency-aware.yaml` (TPOT p90, TTFT p95). Reimplemented,
per instance rather than per model (the BEAR paper, §5.1 and Appendix F: percentiles over a rolling window at each
instance). One deliberate difference, `unobserved`: Semantic Router skips a candidate that has no observations for a
configured metric; with per-instance rolling windows an idle instance would then never be chosen again, so by default
(`fastest`) a missing metric counts as better than any measured one (ratio 0), which sends traffic there until it is
measured. (As ratio 1 it tied with the best measured instance, and ties go to the first candidate: once the first
instance had been measured, no other ever was, and every query went there.) `skip` keeps Semantic Router's rule.

`Score.score` is −s_j; `Score.ttft_s` is the TTFT percentile (the policy's TTFT estimate), when observed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from bear.routing.contract import Candidate, Choice, Decision, Estimator, RouteRequest, Score, best
from bear.routing.registry import register

UNOBSERVED = ("fastest", "skip")
MIN_OBSERVATIONS_FOR_PERCENTILE = 3
SMOOTHING = 0.3  # weight of each newer observation in the moving average used below 3 observations


@register
@dataclass
class VllmSemanticRouter:
    name: ClassVar[str] = "vllm-sr"
    estimator: ClassVar[Estimator | None] = None

    ttft_percentile: int = 95  # 0: TTFT not used
    tpot_percentile: int = 90  # 0: TPOT not used
    window: int = 1000  # the last observations a percentile is taken over
    unobserved: str = "fastest"  # a candidate without observations: `fastest` (ratio 1) or `skip`

    def __post_init__(self) -> None:
        for name in ("ttft_percentile", "tpot_percentile"):
            value = getattr(self, name)
            if not (isinstance(value, int) and 0 <= value <= 100):
                raise ValueError(f"{name} must be an integer in [0, 100], got {value!r}")
        if self.ttft_percentile == 0 and self.tpot_percentile == 0:
            raise ValueError("at least one of ttft_percentile and tpot_percentile must be set (1-100)")
        if not (isinstance(self.window, int) and self.window >= 1):
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        if self.unobserved not in UNOBSERVED:
            raise ValueError(f"unobserved must be one of {', '.join(UNOBSERVED)}, got {self.unobserved!r}")

    def choose(self, request: RouteRequest, candidates: Sequence[Candidate]) -> Choice:
        ttfts = [percentile(c.signals.recent_ttft_s[-self.window:], self.ttft_percentile) if self.ttft_percentile
                 else None for c in candidates]
        tpots = [percentile(c.signals.recent_tpot_s[-self.window:], self.tpot_percentile) if self.tpot_percentile
                 else None for c in candidates]
        metrics = [_ratios(values) for q, values in ((self.ttft_percentile, ttfts), (self.tpot_percentile, tpots)) if q]
        scores = []
        for i, c in enumerate(candidates):
            ratios = [metric[i] for metric in metrics]
            if self.unobserved == "skip" and any(r is None for r in ratios):
                score = -math.inf
            else:
                score = -sum(0.0 if r is None else r for r in ratios) / len(ratios)
            scores.append(Score(c.instance_id, c.utility(request.lambda_per_micro_usd), score, ttfts[i]))
        if all(s.score == -math.inf for s in scores) or all(r is None for metric in metrics for r in metric):
            return Choice(scores[0].instance_id, Decision.ROUTE, "no latency observations: first candidate",
                          tuple(scores))
        return Choice(best(scores).instance_id, Decision.ROUTE,
                      "lowest observed latency percentiles, normalised by the best candidate's", tuple(scores))


def _ratios(values: list[float | None]) -> list[float | None]:
    """Each value over the smallest observed one (over 1 if that is not positive); None where unobserved."""
    observed = [v for v in values if v is not None]
    if not observed:
        return [None] * len(values)
    smallest = min(observed)
    denominator = smallest if smallest > 0 else 1.0
    return [None if v is None else v / denominator for v in values]


def percentile(observations: Sequence[float], q: int) -> float | None:
    """The q-th percentile (linear interpolation at rank q/100·(n−1)); a moving average below 3 observations."""
    values = [v for v in observations if math.isfinite(v) and v > 0]
    if not values:
        return None
    if len(values) < MIN_OBSERVATIONS_FOR_PERCENTILE:
        average = values[0]
        for v in values[1:]:
            average = SMOOTHING * v + (1 - SMOOTHING) * average
        return average
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    lower = int(rank)
    if lower + 1 >= len(ordered):
        return ordered[-1]
    weight = rank - lower
    return ordered[lower] * (1 - weight) + ordered[lower + 1] * weight
