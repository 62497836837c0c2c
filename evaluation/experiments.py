"""The paper's experiments on the simulated pool (§5, Appendix F), each a function that writes CSV, PNG and Markdown.

A policy is named as in the registry, optionally with parameters: `bear`, `bear:fallback=shed,shed_ratio=3`.
Arrival rates are fractions of the pool's saturation rate (`saturation_qps`): its highest sustainable throughput on
the workload mix: the sum of its instances' throughputs when each is kept full (max_num_seqs requests in flight, as
many admitted as its KV cache holds) — what the pool sustains if routing splits the load in proportion to capacity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bear.evaluation.metrics import RunSummary, mape_of, summarise
from bear.evaluation.scenario import Scenario, ScenarioConfig, capacity_qps
from bear.evaluation.simulation import Outcome, run
from bear.routing.registry import build_policy

BASELINES = ("latency-agnostic", "round-robin", "shortest-queue", "lmdeploy", "score", "routebalance", "vllm-sr")
POLICIES = ("bear", *BASELINES, "bear-prefill-tps")
_FRACTION_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class EvalPlan:
    scenario: ScenarioConfig
    queries_per_run: int
    warmup_queries: int
    rate_fractions: tuple[float, ...]  # of the saturation rate
    policies: tuple[str, ...] = POLICIES
    seeds: tuple[int, ...] = (1,)
    saturation_queries: int = 600  # completions measured per instance (after as many, and max_num_seqs, to warm up)

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_queries < self.queries_per_run:
            raise ValueError(f"warmup_queries must be in [0, queries_per_run = {self.queries_per_run}), "
                             f"got {self.warmup_queries!r}")


QUICK = EvalPlan(ScenarioConfig(train_rows=3000, test_prompts=600, profile_queries=200), queries_per_run=350,
                 warmup_queries=30, rate_fractions=(0.2, 0.5, 0.8, 1.0, 1.25, 1.5),
                 saturation_queries=400)
FULL = EvalPlan(ScenarioConfig(train_rows=7500, test_prompts=2500, profile_queries=600), queries_per_run=1500,
                warmup_queries=100, rate_fractions=(0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.15, 1.3, 1.5),
                seeds=(1, 2, 3), saturation_queries=1500)


def parse_policy(spec: str):  # noqa: ANN201 - a routing Policy
    """`name` or `name:key=value,key=value` (true and false as such, numbers where they parse as numbers: integers,
    then floats, `inf` and `nan` included, for the policy to judge); ValueError naming the policy and the parameter
    when the values do not make one (build_policy)."""
    name, _, args = spec.partition(":")
    params: dict[str, Any] = {}
    for pair in filter(None, args.split(",")):
        key, _, value = pair.partition("=")
        params[key] = _value(value)
    return build_policy(name, params)


def _value(value: str) -> bool | int | float | str:
    if value in ("true", "false"):
        return value == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def run_policy(scenario: Scenario, policy: str, rate_qps: float, plan: EvalPlan, seed: int, *,
               staleness_s: float = 0.0, mmpp_ratio: float | None = None, oracle_lengths: bool = False,
               delta_per_s: float | None = None) -> tuple[RunSummary, list[Outcome]]:
    workload = scenario.workload(rate_qps, plan.queries_per_run, seed, mmpp_ratio=mmpp_ratio)
    outcomes = run(scenario.instances(seed), scenario.estimator(oracle_lengths=oracle_lengths), parse_policy(policy),
                   workload, scenario.prices, staleness_s=staleness_s, oracle_lengths=oracle_lengths,
                   delta_per_s=delta_per_s)
    return summarise(policy, rate_qps, outcomes, plan.warmup_queries), outcomes


def saturation_qps(scenario: Scenario, plan: EvalPlan, seed: int = 0,
                   on_instance: Callable[[str, float], None] | None = None) -> float:
    """The pool's highest sustainable throughput on the workload mix: the sum of its instances' (each kept full, as
    if routing split the load in proportion to capacity)."""
    total = 0.0
    for spec in scenario.specs:
        capacity = capacity_qps(scenario, spec, seed, completions=plan.saturation_queries)
        total += capacity
        if on_instance is not None:
            on_instance(spec.instance_id, capacity)
    return total


@dataclass
class RateSweep:
    """One summary per (policy, rate), averaged over seeds."""

    saturation_qps: float
    rates_qps: list[float]
    summaries: dict[str, list[RunSummary]]  # policy -> per rate (first seed's; metrics averaged over seeds)
    outcomes: dict[tuple[str, float], list[Outcome]]
    # Each rate as a fraction of saturation, as planned: which side of saturation a rate is on is read here, not
    # from rates_qps, which are rounded (1.0x rounded down counted as below saturation, rounded up as above).
    rate_fractions: list[float]

    def metric(self, policy: str, name: str) -> list[float]:
        return [getattr(s, name) for s in self.summaries[policy]]

    def fraction(self, rate_qps: float) -> float:
        """The planned fraction of saturation of one of `rates_qps`."""
        return self.rate_fractions[self.rates_qps.index(rate_qps)]

    def up_to_saturation(self, rate_qps: float) -> bool:
        return self.fraction(rate_qps) <= 1.0 + _FRACTION_TOLERANCE

    def from_saturation(self, rate_qps: float) -> bool:
        return self.fraction(rate_qps) >= 1.0 - _FRACTION_TOLERANCE


def sweep_rates(scenario: Scenario, plan: EvalPlan, saturation: float, policies: Sequence[str],
                on_run: Callable[[str, float], None] | None = None, **options: Any) -> RateSweep:
    rates = [round(f * saturation, 3) for f in plan.rate_fractions]
    summaries: dict[str, list[RunSummary]] = {p: [] for p in policies}
    outcomes: dict[tuple[str, float], list[Outcome]] = {}
    for policy in policies:
        for rate in rates:
            runs = [run_policy(scenario, policy, rate, plan, seed, **options) for seed in plan.seeds]
            summaries[policy].append(_average([s for s, _ in runs]))
            outcomes[(policy, rate)] = [o for _, out in runs for o in out[plan.warmup_queries:]]
            if on_run is not None:
                on_run(policy, rate)
    return RateSweep(saturation, rates, summaries, outcomes, list(plan.rate_fractions))


def _average(summaries: Sequence[RunSummary]) -> RunSummary:
    if len(summaries) == 1:
        return summaries[0]
    first = summaries[0]
    mean = {name: float(np.mean([getattr(s, name) for s in summaries]))
            for name in ("on_time_utility", "slo_attainment", "mean_utility", "mean_ttft_s", "shed_fraction")}
    routes: dict[str, dict[str, int]] = {}
    for s in summaries:
        for model, counts in s.routes.items():
            entry = routes.setdefault(model, {"met": 0, "missed": 0})
            for key, value in counts.items():
                entry[key] += value
    return replace(first, num_queries=sum(s.num_queries for s in summaries), routes=routes,
                   ttft_pairs=tuple(p for s in summaries for p in s.ttft_pairs),
                   prefill_tps_pairs=tuple(p for s in summaries for p in s.prefill_tps_pairs), **mean)


def ttft_mapes(sweep: RateSweep, oracle: RateSweep | None) -> dict[str, float | None]:
    """TTFT MAPEs over the queries routed by BEAR at rates up to saturation."""
    def pooled(s: RateSweep | None, attribute: str) -> float | None:
        if s is None or "bear" not in s.summaries:
            return None
        pairs = [p for summary, rate in zip(s.summaries["bear"], s.rates_qps, strict=True)
                 if s.up_to_saturation(rate) for p in getattr(summary, attribute)]
        value = mape_of(pairs)
        return None if math.isnan(value) else value

    return {"bea": pooled(sweep, "ttft_pairs"), "bea-oracle-lengths": pooled(oracle, "ttft_pairs"),
            "prefill-tps": pooled(sweep, "prefill_tps_pairs")}


def batch_time_mape(scenario: Scenario) -> float:
    """Eq. 12's MAPE on the profiled steps, averaged over instances."""
    return float(np.mean([p["batch_time_mape"] for p in scenario.profiles.values()]))
