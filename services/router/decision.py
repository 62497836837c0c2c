"""What the router answers (bear.v1.RouteDecision as domain objects), what it records per dispatch and per outcome."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bear.router.pool import InstanceInfo
from bear.router.signals import InstanceEstimate, QueueLengths
from bear.routing.contract import Candidate, Choice, Decision, Estimator, Score


@dataclass(frozen=True, slots=True)
class CandidateView:
    """One candidate as the decision reports it (bear.v1.CandidateDecision)."""

    instance_id: str
    model: str
    endpoint: str
    predicted_accuracy: float
    predicted_output_tokens: float
    prompt_tokens: int
    predicted_cost_micro_usd: float
    utility: float
    ttft_known: bool
    predicted_ttft_ms: float
    ttft_method: str  # replay, lps, prefill-tps, none
    feasible: bool
    score: float
    snapshot_age_ms: float
    cached_prompt_tokens: int = 0  # the estimator's: prompt tokens the instance's prefix cache likely holds
    idle_ms: float | None = None  # the estimator's: the instance had no work for this long (None: it had some)


@dataclass(frozen=True, slots=True)
class RouteResult:
    request_id: str
    decision: Decision
    instance_id: str  # "" when shed
    endpoint: str
    model: str
    policy: str  # the policy that decided (the fallback's name when degraded)
    reason: str
    candidates: tuple[CandidateView, ...]
    degraded: bool = False
    degraded_reason: str = ""
    decision_ms: float = 0.0
    ttft_budget_ms: float = 0.0  # the target less the router's time on the call when it chose: feasibility's bound


@dataclass(frozen=True, slots=True)
class DispatchRecord:
    """A routed query as Redis keeps it for the estimator (bear.v1.DispatchRecord)."""

    request_id: str
    instance_id: str
    model: str
    dispatched_at_s: float
    prompt_tokens: int
    predicted_output_tokens: float
    predicted_ttft_ms: float  # 0: no estimate; includes ttft_offset_ms
    ttft_slo_ms: float
    ttft_offset_ms: float = 0.0  # the instance's learnt offset, added to the estimator's TTFT
    ttft_exact: bool = False  # the replay's own TTFT (not a lower bound at the horizon, not LPS): teaches the offset
    max_tokens: int = 0  # the request's max_tokens given to Route (0: none); predicted_output_tokens is not capped
    prompt_prefix_hashes: bytes = b""  # the prompt's prefix blocks (bear.common.prefix_blocks; b"": unknown)
    engine_idle: bool = False  # the estimator found the instance without work: the offset it teaches is the idle one


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to a routed query (bear.v1.OutcomeReport)."""

    request_id: str
    observed_ttft_ms: float
    output_tokens: int = 0
    observed_e2e_ms: float = 0.0  # 0: unknown

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, when the end-to-end time, the TTFT and the length say it (without the
        TTFT, the end-to-end time is no measure of the decode)."""
        if (self.observed_e2e_ms <= 0 or self.observed_ttft_ms <= 0 or self.output_tokens < 2
                or self.observed_e2e_ms < self.observed_ttft_ms):
            return None
        return (self.observed_e2e_ms - self.observed_ttft_ms) / 1000 / (self.output_tokens - 1)


def describe(instances: Sequence[InstanceInfo], candidates: Sequence[Candidate], choice: Choice,
             estimates: Mapping[str, InstanceEstimate] | None, queues: Mapping[str, QueueLengths] | None,
             ttft_slo_ms: float, estimator: Estimator | None) -> tuple[CandidateView, ...]:
    """Every candidate with its predictions and the policy's score, in the candidates' order. The TTFT shown is the
    estimator's (eq. 8's for a policy that reads prefill-throughput estimates); feasibility is the policy's verdict
    when it gives one, else whether the TTFT shown meets the target."""
    scores: dict[str, Score] = {s.instance_id: s for s in choice.scores}
    views = []
    for instance, candidate in zip(instances, candidates, strict=True):
        score = scores.get(candidate.instance_id)
        estimate = (estimates or {}).get(candidate.instance_id)
        queue = (queues or {}).get(candidate.instance_id)
        known, ttft_ms, method = _ttft(estimate, estimator)
        feasible = score.feasible if score is not None and score.feasible is not None else known and (
            ttft_ms <= ttft_slo_ms)
        age = (estimate.snapshot_age_ms if estimate is not None else queue.snapshot_age_ms if queue is not None
               else None)
        views.append(CandidateView(
            candidate.instance_id, candidate.model, instance.endpoint, candidate.accuracy, candidate.output_tokens,
            candidate.prompt_tokens, candidate.cost_micro_usd,
            score.utility if score is not None else math.nan, known, ttft_ms, method, bool(feasible),
            score.score if score is not None else math.nan, -1.0 if age is None else age,
            estimate.cached_prompt_tokens if estimate is not None else 0,
            estimate.idle_ms if estimate is not None else None))
    return tuple(views)


def _ttft(estimate: InstanceEstimate | None, estimator: Estimator | None) -> tuple[bool, float, str]:
    if estimate is None:
        return False, 0.0, "none"
    if estimator is Estimator.PREFILL_TPS and estimate.prefill_tps_ttft_ms:
        return True, estimate.prefill_tps_ttft_ms, "prefill-tps"
    if not estimate.known:
        return False, 0.0, estimate.method
    return True, estimate.ttft_ms if estimate.feasible else math.inf, estimate.method
