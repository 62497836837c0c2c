"""`bear`: BEAR's latency-constrained routing (paper eq. 5) with a stated rule for queries no instance can serve in time.

    feasible = {j : safety · TTFT_j ≤ τ}          TTFT_j: the instance's BEA (replay) estimate for this query
    choose argmax_{j ∈ feasible} U_j,  U_j = acc_j − λ·cost_j  (eq. 4)

When no instance is feasible, eq. 5 takes the lowest estimated TTFT. Past saturation that rule sends every doomed query
to the least loaded instance and floods them all in turn, so the fallback is a parameter:

- `max-utility` (the default): the best utility anyway, among the instances with an estimate (all of them when none
  has one): the query misses its target wherever it goes, and it takes the capacity of the instances fast enough to
  save others no more than its fair share;
- `min-ttft`: eq. 5 as published;
- `shed`: refuse the query (`Decision.SHED`) when even the lowest estimate exceeds `shed_ratio` × τ; otherwise
  `min-ttft`.

On the simulated paper pool (`bear eval`'s quick setting, two workload seeds each of scenario seeds 0 and 3) the two
routed alike up to 1.5× saturation (identical OnTimeUtility), within 0.002 at 2×, and `max-utility` led at 3×
(0.329 / 0.289 against 0.278 / 0.270) and 5× (0.209 / 0.265 against 0.077 / 0.119, where `min-ttft` fell below
latency-agnostic routing's 0.199 / 0.202).

Among feasible instances of equal utility (replicas of one pool), the lower TTFT wins, then the first candidate.

A candidate without an estimate is treated as infeasible, unless its instance is idle (nothing running or waiting in
its latest snapshot; `explore_idle`): an idle instance serves a query at once, and that is how an instance with no
calibration to estimate from — whose model no calibrated instance serves yet, in a fresh pool — gets the steps its
sidecar fits eq. 12 from. (An instance only short of its own fit is estimated with a calibrated peer's; once busy, an
instance without an estimate is infeasible again.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from bear.routing.contract import Candidate, Choice, Decision, Estimator, RouteRequest, Score, best
from bear.routing.registry import register

FALLBACKS = ("min-ttft", "max-utility", "shed")


@register
@dataclass
class Bear:
    name: ClassVar[str] = "bear"
    estimator: ClassVar[Estimator | None] = Estimator.BEA

    safety: float = 1.0  # feasibility requires safety · TTFT ≤ τ
    fallback: str = "max-utility"
    shed_ratio: float = 2.0  # `shed`: refuse when the best TTFT exceeds shed_ratio · τ
    explore_idle: bool = True  # an idle instance without an estimate counts as feasible

    def __post_init__(self) -> None:
        if not (math.isfinite(self.safety) and self.safety > 0):
            raise ValueError(f"safety must be a positive number, got {self.safety!r}")
        if self.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {', '.join(FALLBACKS)}, got {self.fallback!r}")
        if not (math.isfinite(self.shed_ratio) and self.shed_ratio >= 1):
            raise ValueError(f"shed_ratio must be >= 1, got {self.shed_ratio!r}")

    def choose(self, request: RouteRequest, candidates: Sequence[Candidate]) -> Choice:
        scores = tuple(self._score(request, c) for c in candidates)
        feasible = [s for s in scores if s.feasible]
        if feasible:
            # Equal utilities (replicas of one pool) go to the lower TTFT, so that replicas share the load instead of
            # the first taking every query while it meets the target; an idle instance without an estimate counts as
            # the fastest.
            chosen = max(feasible, key=lambda s: (s.score, -(s.ttft_s or 0.0)))
            why = "best utility among instances meeting the TTFT target"
            if chosen.ttft_s is None:
                why += " (an idle instance without a TTFT estimate yet: explored)"
            return Choice(chosen.instance_id, Decision.ROUTE, why, scores)
        return self._fallback(request, scores)

    def _score(self, request: RouteRequest, candidate: Candidate) -> Score:
        utility = candidate.utility(request.lambda_per_micro_usd)
        ttft = candidate.ttft_s(self.estimator) if self.estimator else None
        feasible = ttft is not None and self.safety * ttft <= request.ttft_slo_s
        if ttft is None and self.explore_idle and candidate.signals.num_resident == 0:
            feasible = True
        return Score(candidate.instance_id, utility, utility, ttft, feasible)

    def _fallback(self, request: RouteRequest, scores: tuple[Score, ...]) -> Choice:
        known = [s for s in scores if s.ttft_s is not None]
        if self.fallback == "max-utility" or not known:
            chosen = best(known or scores)  # an instance with no estimate may be the most loaded of all
            why = "no instance meets the TTFT target" + ("" if known else " (no TTFT estimates)")
            return Choice(chosen.instance_id, Decision.ROUTE, f"{why}: best utility", scores)
        fastest = min(known, key=lambda s: s.ttft_s)  # type: ignore[arg-type, return-value]
        if self.fallback == "shed" and fastest.ttft_s > self.shed_ratio * request.ttft_slo_s:  # type: ignore[operator]
            return Choice(None, Decision.SHED,
                          f"no instance meets the TTFT target; the lowest estimate exceeds {self.shed_ratio}x the "
                          f"target: shed", scores)
        return Choice(fastest.instance_id, Decision.ROUTE, "no instance meets the TTFT target: lowest estimated TTFT",
                      scores)
