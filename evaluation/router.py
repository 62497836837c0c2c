"""The router as the simulated pool runs it: the same domain code the router service uses (predictions → estimator →
policy), fed by simulated instances instead of Redis.

At each query's arrival the router reads every instance's latest snapshot as it was `staleness_s` earlier, updates
the estimator with it, estimates the query's TTFT on each instance (the replay; eq. 8 for the prefill-throughput
ablation), gathers the signals the baselines use (queue lengths, observed TTFT/TPOT windows, measured throughput,
pending decode tokens), and lets the policy choose. Observations (first tokens, completions) reach it when they
happen, as `ReportOutcome` calls would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bear.core.state import Query
from bear.estimator.estimation import Dispatch, Estimator, Method, TtftEstimate
from bear.evaluation.instance import SNAPSHOT_HISTORY_S, SimulatedInstance
from bear.routing.contract import Candidate, Choice, Decision, InstanceSignals, Policy, RouteRequest
from bear.routing.observations import InstanceObservations, ttft_estimates_s


@dataclass(frozen=True, slots=True)
class Prediction:
    """The predictor's view of one query on one model."""

    accuracy: float
    output_tokens: float
    cost_micro_usd: float


@dataclass(frozen=True, slots=True)
class Decided:
    """A routing decision and what it was based on."""

    choice: Choice
    estimates: Mapping[str, TtftEstimate]  # by instance id


class SimulatedRouter:
    def __init__(self, instances: Sequence[SimulatedInstance], estimator: Estimator, policy: Policy, *,
                 staleness_s: float = 0.0, horizon_factor: float = 4.0) -> None:
        if not 0 <= staleness_s <= SNAPSHOT_HISTORY_S:
            raise ValueError(f"staleness_s must be in [0, {SNAPSHOT_HISTORY_S:g}] (the snapshot history instances "
                             f"keep), got {staleness_s!r}")
        self.instances = {i.spec.instance_id: i for i in instances}
        self.estimator = estimator
        self.policy = policy
        self.staleness_s = staleness_s
        self.horizon_factor = horizon_factor  # replays stop at horizon_factor × the query's TTFT target
        self._observed = {i: InstanceObservations() for i in self.instances}  # virtual time starts at 0

    def route(self, query: Query, predictions: Mapping[str, Prediction], request: RouteRequest,
              now_s: float, dispatched_lengths: Mapping[str, float] | None = None) -> Decided:
        """Chooses an instance for `query` arriving at `now_s` (predictions by model). The dispatch is recorded with
        the predicted output length, or `dispatched_lengths[model]` when given (oracle-length experiments)."""
        ids = list(self.instances)
        for instance in self.instances.values():
            self.estimator.update_snapshot(instance.snapshot(now_s - self.staleness_s), now_s)
        estimates: dict[str, TtftEstimate] = {}
        if self.policy.estimator is not None:
            horizon = self.horizon_factor * request.ttft_slo_s + 1.0
            estimates = {e.instance_id: e for e in self.estimator.estimate(query, ids, now_s, horizon)}
        candidates = [self._candidate(i, query, predictions, estimates.get(i), now_s) for i in ids]
        choice = self.policy.choose(request, candidates)
        if choice.decision is Decision.ROUTE and choice.instance_id is not None:
            chosen = self.instances[choice.instance_id]
            model = chosen.spec.model
            length = (dispatched_lengths or {}).get(model, predictions[model].output_tokens)
            self.estimator.record_dispatch(Dispatch(query.id, choice.instance_id, model, now_s,
                                                    query.num_prompt_tokens, length))
        return Decided(choice, estimates)

    def observe(self, instance_id: str, ttft_s: float | None, tpot_s: float | None, completed_at_s: float | None,
                at_s: float) -> None:
        """What `ReportOutcome` tells the router service; `at_s` is when it is told."""
        self._observed[instance_id].observe(ttft_s, tpot_s, completed_at_s)

    def _candidate(self, instance_id: str, query: Query, predictions: Mapping[str, Prediction],
                   estimate: TtftEstimate | None, now_s: float) -> Candidate:
        instance = self.instances[instance_id]
        prediction = predictions[instance.spec.model]
        snapshot = self.estimator.snapshot(instance_id)
        estimates: dict[str, float] = {}
        if estimate is not None and estimate.ttft_s is not None:
            estimates = ttft_estimates_s(estimate.ttft_s, lps=estimate.method is Method.LPS,
                                         prefill_tps_ttft_s=estimate.prefill_tps_ttft_s)
        observed = self._observed[instance_id]
        signals = InstanceSignals(
            num_running=None if snapshot is None else len(snapshot.running),
            num_waiting=None if snapshot is None else len(snapshot.waiting),
            request_throughput_rps=observed.request_throughput_rps(now_s),
            ttft_estimates_s=estimates,
            recent_ttft_s=observed.recent_ttft_s,
            recent_tpot_s=observed.recent_tpot_s,
            pending_decode_tokens=self.estimator.pending_decode_tokens(instance_id),
        )
        return Candidate(instance_id, instance.spec.model, prediction.accuracy, query.num_prompt_tokens,
                         prediction.output_tokens, prediction.cost_micro_usd, signals)
