"""`bear-lagrangian`: the Lagrangian relaxation of eq. 5 (paper eq. 7):

    choose argmax_j  U_j − δ·TTFT_j,   U_j = acc_j − λ·cost_j,   TTFT_j the BEA estimate (seconds)

δ comes with each request (`RouteRequest.delta_per_s`, when not None), else from the policy's `default_delta_per_s`.
δ = 0 is latency-agnostic routing; δ → ∞ minimises TTFT. A candidate without an estimate scores −∞ unless none has one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from bear.routing.contract import Candidate, Choice, Decision, Estimator, RouteRequest, Score, best
from bear.routing.registry import register


@register
@dataclass
class BearLagrangian:
    name: ClassVar[str] = "bear-lagrangian"
    estimator: ClassVar[Estimator | None] = Estimator.BEA

    default_delta_per_s: float = 0.1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.default_delta_per_s) and self.default_delta_per_s >= 0):
            raise ValueError(f"default_delta_per_s must be >= 0, got {self.default_delta_per_s!r}")

    def choose(self, request: RouteRequest, candidates: Sequence[Candidate]) -> Choice:
        delta = self.default_delta_per_s if request.delta_per_s is None else request.delta_per_s
        scores = []
        for c in candidates:
            utility = c.utility(request.lambda_per_micro_usd)
            ttft = c.ttft_s(self.estimator) if self.estimator else None
            score = utility - delta * ttft if ttft is not None else -math.inf
            scores.append(Score(c.instance_id, utility, score, ttft, None if ttft is None else ttft <= request.ttft_slo_s))
        if all(s.score == -math.inf for s in scores):
            chosen = max(scores, key=lambda s: s.utility)
            return Choice(chosen.instance_id, Decision.ROUTE, "no TTFT estimates: best utility", tuple(scores))
        chosen = best(scores)
        return Choice(chosen.instance_id, Decision.ROUTE, f"best utility - {delta:g}/s x estimated TTFT", tuple(scores))
