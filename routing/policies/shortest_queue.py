"""`shortest-queue`: the instance with the fewest resident requests (running + waiting); ties go to the better utility.
Instances that report no queue count as the longest."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from bear.routing.contract import Candidate, Choice, Decision, Estimator, RouteRequest, Score
from bear.routing.registry import register


@register
@dataclass
class ShortestQueue:
    name: ClassVar[str] = "shortest-queue"
    estimator: ClassVar[Estimator | None] = None

    def choose(self, request: RouteRequest, candidates: Sequence[Candidate]) -> Choice:
        scores = []
        for c in candidates:
            resident = c.signals.num_resident
            scores.append(Score(c.instance_id, c.utility(request.lambda_per_micro_usd),
                                -math.inf if resident is None else -float(resident)))
        chosen = max(scores, key=lambda s: (s.score, s.utility))
        return Choice(chosen.instance_id, Decision.ROUTE, "fewest resident requests", tuple(scores))
