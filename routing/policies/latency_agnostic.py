"""`latency-agnostic`: the best accuracy–cost utility (eq. 4), ignoring latency: argmax_j acc_j − λ·cost_j."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from bear.routing.contract import Candidate, Choice, Decision, Estimator, RouteRequest, Score, best
from bear.routing.registry import register


@register
@dataclass
class LatencyAgnostic:
    name: ClassVar[str] = "latency-agnostic"
    estimator: ClassVar[Estimator | None] = None

    def choose(self, request: RouteRequest, candidates: Sequence[Candidate]) -> Choice:
        scores = tuple(
            Score(c.instance_id, c.utility(request.lambda_per_micro_usd), c.utility(request.lambda_per_micro_usd))
            for c in candidates
        )
        return Choice(best(scores).instance_id, Decision.ROUTE, "best utility", scores)
