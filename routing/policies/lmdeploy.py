"""`lmdeploy`: LMDeploy proxy's `min_expected_latency` strategy: the instance with the smallest expected latency

    unfinished_j / speed_j

where unfinished_j is the number of unfinished requests (running + waiting) and speed_j the instance's measured
request throughput (requests per second). Source: lmdeploy/serve/proxy (routing strategy `min_expected_latency`,
"unfinished requests / speed"), as described in the paper's §5.1. An instance with no measured throughput yet
counts as having the slowest measured one (or 1 request/s if none is measured); ties go to the better utility.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from bear.routing.contract import Candidate, Choice, Decision, Estimator, RouteRequest, Score
from bear.routing.registry import register


@register
@dataclass
class LmdeployProxy:
    name: ClassVar[str] = "lmdeploy"
    estimator: ClassVar[Estimator | None] = None

    def choose(self, request: RouteRequest, candidates: Sequence[Candidate]) -> Choice:
        measured = [c.signals.request_throughput_rps for c in candidates
                    if c.signals.request_throughput_rps is not None and c.signals.request_throughput_rps > 0]
        slowest = min(measured) if measured else 1.0
        scores = []
        for c in candidates:
            unfinished = c.signals.num_resident
            speed = c.signals.request_throughput_rps
            speed = speed if speed is not None and speed > 0 else slowest
            expected = math.inf if unfinished is None else unfinished / speed
            scores.append(Score(c.instance_id, c.utility(request.lambda_per_micro_usd), -expected,
                                latency_s=None if math.isinf(expected) else expected))
        chosen = max(scores, key=lambda s: (s.score, s.utility))
        why = "least unfinished requests per measured request/s"
        if not measured:
            why += " (no throughput measured: least unfinished requests)"
        return Choice(chosen.instance_id, Decision.ROUTE, why, tuple(scores))
