"""One run of the simulated pool: a workload of queries routed by a policy, served by simulated instances.

A `Workload` is a list of queries with their arrival times, TTFT targets and, per model, the true judge score and
true output length (from a synthetic evaluation table the predictor was not trained on) and the predictor's
predictions (what routing sees). `run` replays it through a `SimulatedRouter` in virtual time and returns one
`Outcome` per query: where it went, its real TTFT, whether it met its target, its realised utility, and the TTFT
estimate the decision used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bear.core.state import Query
from bear.estimator.estimation import Estimator, TtftEstimate
from bear.evaluation.instance import SimulatedInstance
from bear.evaluation.router import Prediction, SimulatedRouter
from bear.routing.contract import (
    DEFAULT_LAMBDA_PER_MICRO_USD,
    Choice,
    Decision,
    Policy,
    RouteRequest,
    weight_problem,
)


@dataclass(frozen=True, slots=True)
class WorkloadQuery:
    query_id: str
    arrival_s: float
    task: str
    prompt_tokens: int
    ttft_slo_s: float
    true_score: Mapping[str, float]  # by model
    true_output_tokens: Mapping[str, int]  # by model
    predictions: Mapping[str, Prediction]  # by model


@dataclass(frozen=True, slots=True)
class Outcome:
    query_id: str
    task: str
    arrival_s: float
    ttft_slo_s: float
    decision: Decision
    instance_id: str | None
    model: str | None
    ttft_s: float | None  # real; None if shed
    on_time: bool
    utility: float  # realised: true score − λ·true cost (0 if shed)
    estimated_ttft_s: float | None  # the BEA estimate for the chosen instance, if the policy used one
    estimate_lower_bound: bool
    estimates: Mapping[str, float | None]  # every instance's BEA estimate (None when not estimated)
    prefill_tps_estimates: Mapping[str, float | None]
    policy_estimate_s: float | None = None  # the latency the policy itself estimated for its choice, if any

    @property
    def on_time_utility(self) -> float:
        return self.utility if self.on_time else 0.0


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per million tokens, by model: a cost in micro-dollars is tokens × these."""

    input_usd_per_mtok: Mapping[str, float]
    output_usd_per_mtok: Mapping[str, float]

    def cost_micro_usd(self, model: str, prompt_tokens: float, output_tokens: float) -> float:
        return prompt_tokens * self.input_usd_per_mtok[model] + output_tokens * self.output_usd_per_mtok[model]


def run(instances: Sequence[SimulatedInstance], estimator: Estimator, policy: Policy, workload: Sequence[WorkloadQuery],
        prices: Prices, *, staleness_s: float = 0.0, lambda_per_micro_usd: float = DEFAULT_LAMBDA_PER_MICRO_USD,
        delta_per_s: float | None = None, oracle_lengths: bool = False,
        on_query: Callable[[int], None] | None = None) -> list[Outcome]:
    """Routes every query of `workload` (in arrival order) and serves it to completion. With `oracle_lengths` the
    estimator learns every dispatched query's true output length (pair it with `oracle_remaining`)."""
    for name, value in (("lambda_per_micro_usd", lambda_per_micro_usd), ("delta_per_s", delta_per_s)):
        problem = weight_problem(name, value)
        if problem is not None:
            raise ValueError(problem)
    router = SimulatedRouter(instances, estimator, policy, staleness_s=staleness_s)
    reporter = _Reporter(router)
    decisions: list[tuple[WorkloadQuery, Decision, str | None, TtftEstimate | None, Mapping[str, TtftEstimate]]] = []
    for index, q in enumerate(workload):
        for instance in instances:
            _advance(instance, q.arrival_s)
        reporter.report_until(q.arrival_s)
        request = RouteRequest(q.query_id, q.ttft_slo_s, lambda_per_micro_usd, delta_per_s)
        query = Query(q.query_id, q.prompt_tokens, max(1, round(np.mean([p.output_tokens
                                                                          for p in q.predictions.values()]))))
        decided = router.route(query, q.predictions, request, q.arrival_s,
                               q.true_output_tokens if oracle_lengths else None)
        chosen = decided.choice.instance_id if decided.choice.decision is Decision.ROUTE else None
        if chosen is not None:
            model = router.instances[chosen].spec.model
            router.instances[chosen].submit(q.query_id, q.arrival_s, q.prompt_tokens, q.true_output_tokens[model])
            reporter.watch(chosen, q.query_id)
        decisions.append((q, decided.choice, chosen, decided.estimates.get(chosen) if chosen else None,
                          decided.estimates))
        if on_query is not None:
            on_query(index)
    for instance in instances:
        _advance(instance, math.inf)
    return [_outcome(q, choice, chosen, estimate, estimates, router, prices, lambda_per_micro_usd)
            for q, choice, chosen, estimate, estimates in decisions]


def _advance(instance: SimulatedInstance, until_s: float) -> None:
    """Runs the instance's schedule calls that happen before `until_s`."""
    while (at := instance.next_schedule_s()) is not None and at < until_s:
        instance.schedule_step()


class _Reporter:
    """Feeds the router first tokens and completions once they have happened (as ReportOutcome would)."""

    def __init__(self, router: SimulatedRouter) -> None:
        self.router = router
        self.active: list[tuple[str, str]] = []  # (instance id, request id)
        self.ttft_reported: set[str] = set()

    def watch(self, instance_id: str, request_id: str) -> None:
        self.active.append((instance_id, request_id))

    def report_until(self, now_s: float) -> None:
        still = []
        for instance_id, request_id in self.active:
            served = self.router.instances[instance_id].served[request_id]
            if served.first_token_s is not None and served.first_token_s <= now_s and request_id not in self.ttft_reported:
                self.router.observe(instance_id, served.ttft_s, None, None, served.first_token_s)
                self.ttft_reported.add(request_id)
            if served.finished_s is not None and served.finished_s <= now_s:
                tpot = None
                if served.output_tokens > 1 and served.first_token_s is not None:
                    tpot = (served.finished_s - served.first_token_s) / (served.output_tokens - 1)
                self.router.observe(instance_id, None, tpot, served.finished_s, served.finished_s)
                self.ttft_reported.discard(request_id)
            else:
                still.append((instance_id, request_id))
        self.active = still


def _outcome(q: WorkloadQuery, choice: Choice, chosen: str | None, estimate: TtftEstimate | None,
             estimates: Mapping[str, TtftEstimate], router: SimulatedRouter, prices: Prices,
             lambda_per_micro_usd: float) -> Outcome:
    decision = choice.decision
    scored = next((s for s in choice.scores if s.instance_id == chosen), None)
    policy_estimate = None if scored is None else (scored.ttft_s if scored.ttft_s is not None else scored.latency_s)
    every = {i: (e.ttft_s if e.ttft_s is not None and math.isfinite(e.ttft_s) else None) for i, e in estimates.items()}
    prefill = {i: e.prefill_tps_ttft_s for i, e in estimates.items()}
    if chosen is None:
        return Outcome(q.query_id, q.task, q.arrival_s, q.ttft_slo_s, decision, None, None, None, False, 0.0, None,
                       False, every, prefill)
    instance = router.instances[chosen]
    model = instance.spec.model
    served = instance.served[q.query_id]
    ttft = served.ttft_s
    cost = prices.cost_micro_usd(model, q.prompt_tokens, q.true_output_tokens[model])
    realised = q.true_score[model] - lambda_per_micro_usd * cost
    estimated = estimate.ttft_s if estimate is not None else None
    return Outcome(q.query_id, q.task, q.arrival_s, q.ttft_slo_s, decision, chosen, model, ttft,
                   ttft is not None and ttft <= q.ttft_slo_s, realised, estimated,
                   bool(estimate is not None and estimate.lower_bound), every, prefill, policy_estimate)


def oracle_remaining(model: str, dispatched_length: np.ndarray, generated: np.ndarray,
                     max_tokens: np.ndarray) -> np.ndarray:
    """Remaining output tokens when the dispatched length is the true one (oracle-length estimates)."""
    return np.maximum(dispatched_length - generated, 1.0)
