"""`score`: SCORE (Lakha, Yu, Shahout, "Faster, Cheaper, Just as Good: Cost- and Latency-Constrained Routing for LLMs",
ICLR 2025 SLLM workshop): predicted quality against weighted cost and latency penalties, with one tunable coefficient.

    L_j = tpot_j · (W_j + o_j)                                  completion-latency estimate, seconds
    S_j = acc_j − γ · (w_c · cost_j + w_L · L_j)                choose argmax_j S_j

- tpot_j: the instance's measured time per output token, the mean of its recent observations (`recent_tpot_s`);
- W_j: its estimated remaining token workload, the predicted output tokens still to come over its residents
  (`pending_decode_tokens`); W_j · tpot_j is the queueing delay;
- o_j: the query's predicted output length on the instance (`Candidate.output_tokens`);
- acc_j, cost_j: predicted quality in [0, 1] and cost in micro-dollars;
- γ (`tradeoff`): the tunable coefficient; w_c (`cost_weight_per_micro_usd`, default the request's λ, so that γ = 1
  and w_L = 0 is latency-agnostic routing on eq. 4) and w_L (`latency_weight_per_s`) weight the two penalties.

Sources: the BEAR paper (§2: "queueing delay plus the predicted output length multiplied by the per-token processing
time of that model"; §5.1: "a tunable coefficient to balance predicted response quality against weighted cost and
latency penalties"; Appendix F: "a measured time per output token and estimated remaining token workload") and the
SCORE abstract. SCORE's full text and code were not available to us; assumed here: the penalties enter linearly with
weights w_c, w_L scaled by γ; latency is the completion time of the query (SCORE charges the whole remaining workload
at the per-token rate, as if the instance decoded sequentially, not in batches); the measured per-token time is the
mean over the caller's window.

Missing signals: an instance without TPOT observations takes the slowest measured one among the candidates, and one
without a pending-token count the largest known count (0 if none is known); if no candidate has a TPOT, the latency
penalty is dropped for all. Ties go to the first candidate.
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
class ScoreRouter:
    name: ClassVar[str] = "score"
    estimator: ClassVar[Estimator | None] = None

    tradeoff: float = 1.0  # γ: weight of the penalties against quality
    latency_weight_per_s: float = 0.01  # w_L, per second of estimated completion latency
    cost_weight_per_micro_usd: float | None = None  # w_c; None: the request's λ

    def __post_init__(self) -> None:
        for name in ("tradeoff", "latency_weight_per_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        weight = self.cost_weight_per_micro_usd
        if weight is not None and not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"cost_weight_per_micro_usd must be >= 0 or None, got {weight!r}")

    def choose(self, request: RouteRequest, candidates: Sequence[Candidate]) -> Choice:
        cost_weight = request.lambda_per_micro_usd if self.cost_weight_per_micro_usd is None \
            else self.cost_weight_per_micro_usd
        latencies = completion_latencies_s(candidates)
        scores = []
        for c, latency in zip(candidates, latencies, strict=True):
            penalty = cost_weight * c.cost_micro_usd + self.latency_weight_per_s * (latency or 0.0)
            scores.append(Score(c.instance_id, c.utility(request.lambda_per_micro_usd),
                                c.accuracy - self.tradeoff * penalty, latency_s=latency))
        why = "best quality - penalties on cost and on measured TPOT x (pending + own) tokens"
        if all(latency is None for latency in latencies):
            why += " (no TPOT measured: cost only)"
        return Choice(best(scores).instance_id, Decision.ROUTE, why, tuple(scores))


def completion_latencies_s(candidates: Sequence[Candidate]) -> list[float | None]:
    """L_j = tpot_j · (W_j + o_j) per candidate, with the missing-signal rules above; all None if no TPOT is known."""
    tpots = [c.signals.mean_recent_tpot_s for c in candidates]
    measured = [t for t in tpots if t is not None]
    if not measured:
        return [None] * len(candidates)
    pendings = [c.signals.pending_decode_tokens for c in candidates]
    known = [p for p in pendings if p is not None and math.isfinite(p)]
    largest = max(known, default=0.0)
    slowest = max(measured)
    return [(slowest if tpot is None else tpot)
            * ((largest if pending is None or not math.isfinite(pending) else pending) + c.output_tokens)
            for c, tpot, pending in zip(candidates, tpots, pendings, strict=True)]
