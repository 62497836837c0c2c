"""`round-robin`: the instances in turn, whatever the query: the k-th query goes to candidate k mod n.

Candidates are ordered by instance id, so the cycle does not depend on the order the caller lists them in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from bear.routing.contract import Candidate, Choice, Decision, Estimator, RouteRequest, Score
from bear.routing.registry import register


@register
@dataclass
class RoundRobin:
    name: ClassVar[str] = "round-robin"
    estimator: ClassVar[Estimator | None] = None

    _count: int = field(default=0, init=False, repr=False)

    def choose(self, request: RouteRequest, candidates: Sequence[Candidate]) -> Choice:
        ordered = sorted(candidates, key=lambda c: c.instance_id)
        chosen = ordered[self._count % len(ordered)]
        self._count += 1
        scores = tuple(
            Score(c.instance_id, c.utility(request.lambda_per_micro_usd), 1.0 if c is chosen else 0.0)
            for c in candidates
        )
        return Choice(chosen.instance_id, Decision.ROUTE, "next instance in turn", scores)
