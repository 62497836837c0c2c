"""`routebalance`: RouteBalance (Da and Kalyvianaki, "RouteBalance: Fused Model Routing and Load Balancing for
Heterogeneous LLM Serving", 2026): predicted quality plus cost and latency scores normalised across the candidates.

    L_j = tpot_j · (max(1, o_j) + Q_j),   Q_j = 0 if the instance has a free slot (no waiting request),
                                          else W_j / max(1, n_j)           completion-latency estimate, seconds
    S_j = w_q · acc_j + w_c · (1 − cost_j / max_k cost_k) + w_l · (1 − L_j / max_k L_k)     choose argmax_j S_j

- tpot_j: the instance's time per output token, the mean of its recent observations (`recent_tpot_s`);
- W_j: the predicted output tokens still to come over all its queries (`pending_decode_tokens`), n_j its active decode
  batch size (`num_running`): W_j / n_j is the number of decode iterations before the batch has room (time to
  completion in iterations); o_j the query's predicted output length;
- acc_j raw predicted quality in [0, 1]; cost_j predicted cost (micro-dollars); both maxima over the candidates, a
  maximum of 0 giving every candidate a sub-score of 1.

Sources: the BEAR paper (§5.1 "predicted quality with cost and latency scores normalized across candidate
instances"; Appendix F "the ratio of pending decode tokens across all queries and active decode batch size to
estimate time to completion along with time per output token predictions") and RouteBalance's public code
(github.com/AKafakA/route-balance, `route_balance_serve.py`: the Little's-law latency above with its open-slot case,
max-divide normalisation, argmax with a shortest-queue tie-break), reimplemented. Assumed / simplified:
- weights: RouteBalance's "uniform" preset, 1/3 each; its optional fourth term (KV-cache balance, w_balance) is
  left out, as in that preset: the paper's description has no such term and the contract carries no KV utilisation;
- TPOT: RouteBalance predicts it per (query, instance) with a learned model; here the measured mean stands in;
- a free slot is "no waiting request" (the source also checks `num_running < max_num_seqs`, which the contract does
  not carry; vLLM queues requests only once the running batch is full);
- no SLO filter (RouteBalance's is off in its published configurations) and no least-recently-used tie-break (state).

Missing signals: an instance without TPOT observations takes the slowest measured TPOT among the candidates, one
without a pending-token count the largest known (0 if none), one without `num_running` a batch of 1, one without
`num_waiting` no free slot; if no candidate has a TPOT, the latency score is 1 for all. Ties go to the fewer resident
requests (unknown counts last), then to the first candidate.
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
class RouteBalance:
    name: ClassVar[str] = "routebalance"
    estimator: ClassVar[Estimator | None] = None

    quality_weight: float = 1 / 3  # w_q
    cost_weight: float = 1 / 3  # w_c
    latency_weight: float = 1 / 3  # w_l

    def __post_init__(self) -> None:
        for name in ("quality_weight", "cost_weight", "latency_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be >= 0, got {value!r}")

    def choose(self, request: RouteRequest, candidates: Sequence[Candidate]) -> Choice:
        latencies = completion_latencies_s(candidates)
        max_cost = max(c.cost_micro_usd for c in candidates)
        max_latency = max((latency for latency in latencies if latency is not None), default=0.0)
        scores = []
        for c, latency in zip(candidates, latencies, strict=True):
            score = (self.quality_weight * c.accuracy
                     + self.cost_weight * _headroom(c.cost_micro_usd, max_cost)
                     + self.latency_weight * _headroom(latency or 0.0, max_latency))
            scores.append(Score(c.instance_id, c.utility(request.lambda_per_micro_usd), score, latency_s=latency))
        queue = [c.signals.num_resident for c in candidates]
        chosen = min(range(len(scores)),
                     key=lambda i: (-scores[i].score, math.inf if queue[i] is None else queue[i]))
        return Choice(scores[chosen].instance_id, Decision.ROUTE,
                      "best weighted quality + normalised cost and latency scores", tuple(scores))


def _headroom(value: float, maximum: float) -> float:
    """1 − value / maximum: 0 for the largest value, 1 for zero (and for all when the maximum is 0)."""
    return 1.0 if maximum <= 0 else 1.0 - value / maximum


def completion_latencies_s(candidates: Sequence[Candidate]) -> list[float | None]:
    """L_j per candidate, with the missing-signal rules above; all None if no candidate has a TPOT."""
    tpots = [c.signals.mean_recent_tpot_s for c in candidates]
    measured = [t for t in tpots if t is not None]
    if not measured:
        return [None] * len(candidates)
    slowest = max(measured)
    known_pending = [c.signals.pending_decode_tokens for c in candidates
                     if c.signals.pending_decode_tokens is not None and math.isfinite(c.signals.pending_decode_tokens)]
    largest_pending = max(known_pending, default=0.0)
    latencies: list[float | None] = []
    for c, tpot in zip(candidates, tpots, strict=True):
        signals = c.signals
        queued_iterations = 0.0
        if signals.num_waiting != 0:  # no free slot (or unknown): wait for the batch to drain
            pending = signals.pending_decode_tokens
            pending = largest_pending if pending is None or not math.isfinite(pending) else pending
            queued_iterations = pending / max(1, signals.num_running or 0)
        latencies.append((slowest if tpot is None else tpot) * (max(1.0, c.output_tokens) + queued_iterations))
    return latencies
