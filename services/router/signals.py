"""What the router learns about a query before choosing — the predictor's per-model predictions, the estimator's
per-instance estimates, queue lengths from snapshots in Redis — and how it turns them into the policies' `Candidate`s.

A candidate is one routable instance with, for this query:

    accuracy, output_tokens     the predictor's, for the instance's model; none (length-only query, predictor down):
                                accuracy 0 and the configured default length, the same for every instance
    prompt_tokens               the predictor's count under the model's tokenizer, else the router's own count
    cost_micro_usd              prompt_tokens × input price + output_tokens × output price with the instance's prices
                                (pools file or registration), else the predictor's cost (its catalogue prices)
    signals                     queue lengths and pending decode tokens from the estimate (or, when the estimator is
                                down, from the latest snapshot in Redis); TTFT estimates (`bear.routing.observations.
                                ttft_estimates_s`); recent TTFT/TPOT windows and request throughput from ReportOutcome
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from bear.core.result import Infeasibility, explain_refused_prompt, refused_prompt
from bear.core.state import EngineConfig
from bear.router.pool import InstanceInfo, same_model
from bear.routing.contract import Candidate, InstanceSignals
from bear.routing.observations import RESIDUAL_WINDOW, InstanceObservations, ttft_estimates_s


SKIPPED = "SKIPPED"  # DependencyUnavailable's code for a call not made (the Redis store's back-off after a failure)
# Codes with which a dependency that answered refused the call (a bug of the router's or the service's, not the
# network): the reason says it "failed". Any other is "unavailable", transport errors included (a process killed
# mid-stream ends its calls UNKNOWN or INTERNAL as well as UNAVAILABLE).
_REFUSED = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE", "NOT_FOUND", "ALREADY_EXISTS",
                      "PERMISSION_DENIED", "UNAUTHENTICATED", "UNIMPLEMENTED"})


class DependencyUnavailable(Exception):
    """The predictor, the estimator or Redis did not answer usefully in time. `code`: a gRPC status name (Redis
    failures too: DEADLINE_EXCEEDED, UNAVAILABLE, UNAUTHENTICATED, INTERNAL), NO_PREDICTION, or SKIPPED."""

    def __init__(self, service: str, code: str, detail: str = "") -> None:
        verb = "failed" if code in _REFUSED else "unavailable"
        super().__init__(f"{service} {verb} ({code}{': ' + detail if detail else ''})")
        self.service, self.code, self.detail = service, code, detail


@dataclass(frozen=True, slots=True)
class ModelPrediction:
    """The predictor's view of the query on one model (bear.v1.ModelPrediction)."""

    model: str
    accuracy: float
    output_tokens: float
    prompt_tokens: int
    cost_micro_usd: float
    output_usd_per_mtok: float = 0.0  # the price in cost_micro_usd (for a cost capped at max_tokens)


@dataclass(frozen=True, slots=True)
class InstanceEstimate:
    """The estimator's view of the query on one instance (bear.v1.InstanceEstimate)."""

    instance_id: str
    method: str  # replay, lps, none
    known: bool  # False: no estimate
    feasible: bool  # False: the query can never be served there
    ttft_ms: float
    lower_bound: bool = False
    snapshot_age_ms: float | None = None  # None: no snapshot
    num_batches: int = 0
    reason: str = ""
    prefill_tps_ttft_ms: float | None = None
    num_running: int | None = None  # None: no snapshot to count from
    num_waiting: int | None = None
    pending_decode_tokens: float | None = None
    ttft_offset_ms: float = 0.0  # added to the estimator's TTFT by the router (see with_offset)
    cached_prompt_tokens: int = 0  # the query's prompt tokens the instance's prefix cache likely holds
    idle_ms: float | None = None  # the instance had no work for this long at the query's arrival (None: it had some)

    def with_offset(self, offset_ms: float) -> InstanceEstimate:
        """The estimate plus the instance's learnt TTFT offset (bear.routing.observations), never below 0; unknown
        and infeasible estimates stay as they are."""
        if not self.known or not self.feasible or offset_ms == 0.0:
            return self
        return replace(self, ttft_ms=max(0.0, self.ttft_ms + offset_ms), ttft_offset_ms=offset_ms)

    @property
    def raw_ttft_ms(self) -> float:
        """The estimator's own TTFT, without the offset."""
        return self.ttft_ms - self.ttft_offset_ms

    @property
    def ttft_s(self) -> float | None:
        """None: unknown; math.inf: never served there."""
        if not self.known:
            return None
        return self.ttft_ms / 1000 if self.feasible else math.inf


@dataclass(frozen=True, slots=True)
class QueueLengths:
    """An instance's queue as its latest snapshot in Redis shows it (the fallback's signal)."""

    num_running: int
    num_waiting: int
    snapshot_age_ms: float
    engine: EngineConfig | None = None  # the engine's settings the snapshot records (None: none usable)

    def refusal(self, num_prompt_tokens: int) -> str:
        """Why the engine can never serve a prompt this long, whatever its load ("": it can, or unknown)."""
        if self.engine is None:
            return ""
        kind = refused_prompt(self.engine, num_prompt_tokens)
        return "" if kind is Infeasibility.NONE else explain_refused_prompt(kind, self.engine, num_prompt_tokens)


class ObservationBook:
    """Observed outcomes per instance (fed by ReportOutcome)."""

    def __init__(self, window: int, throughput_window_s: float, started_at_s: float,
                 residual_window: int = RESIDUAL_WINDOW) -> None:
        self._window, self._throughput_window_s, self._started_at_s = window, throughput_window_s, started_at_s
        self._residual_window = residual_window
        self._by_instance: dict[str, InstanceObservations] = {}

    def forget_except(self, instance_ids: set[str]) -> None:
        """Drops the observations of instances that are gone."""
        for instance_id in self._by_instance.keys() - instance_ids:
            del self._by_instance[instance_id]

    def of(self, instance_id: str) -> InstanceObservations:
        observations = self._by_instance.get(instance_id)
        if observations is None:
            observations = InstanceObservations(self._window, self._throughput_window_s, self._started_at_s,
                                                self._residual_window)
            self._by_instance[instance_id] = observations
        return observations


def prediction_for(model: str, predictions: Mapping[str, ModelPrediction]) -> ModelPrediction | None:
    """The prediction of `model`, matched exactly or by its short name (see bear.router.pool)."""
    found = predictions.get(model)
    if found is not None:
        return found
    return next((p for name, p in predictions.items() if same_model(name, model)), None)


def build_candidates(instances: Sequence[InstanceInfo], prompt_tokens: int,
                     predictions: Mapping[str, ModelPrediction] | None,
                     estimates: Mapping[str, InstanceEstimate] | None, queues: Mapping[str, QueueLengths] | None,
                     observations: ObservationBook, now_s: float, default_output_tokens: float,
                     max_tokens: int | None = None) -> list[Candidate]:
    """One candidate per instance, in order. With `predictions`, every instance must have one (see
    `prediction_for`); without, all get the same neutral prediction. Output lengths are at most `max_tokens`."""
    out = []
    cap = math.inf if max_tokens is None else float(max_tokens)
    for instance in instances:
        prediction = prediction_for(instance.model, predictions) if predictions is not None else None
        if prediction is not None:
            accuracy, output, tokens = prediction.accuracy, min(prediction.output_tokens, cap), prediction.prompt_tokens
        else:
            accuracy, output, tokens = 0.0, min(default_output_tokens, cap), prompt_tokens
        if instance.has_prices or prediction is None:
            cost = instance.cost_micro_usd(tokens, output)
        else:  # the predictor's catalogue prices: less the output tokens max_tokens cuts
            cost = prediction.cost_micro_usd - (prediction.output_tokens - output) * prediction.output_usd_per_mtok
        signals = _signals((estimates or {}).get(instance.instance_id),
                           (queues or {}).get(instance.instance_id), observations.of(instance.instance_id), now_s)
        out.append(Candidate(instance.instance_id, instance.model, accuracy, tokens, output, cost, signals))
    return out


def _signals(estimate: InstanceEstimate | None, queue: QueueLengths | None,
             observed: InstanceObservations, now_s: float) -> InstanceSignals:
    running = waiting = pending = None
    estimates: dict[str, float] = {}
    if estimate is not None:
        running, waiting, pending = estimate.num_running, estimate.num_waiting, estimate.pending_decode_tokens
        prefill_tps = estimate.prefill_tps_ttft_ms / 1000 if estimate.prefill_tps_ttft_ms else None
        estimates = ttft_estimates_s(estimate.ttft_s, lps=estimate.method == "lps", prefill_tps_ttft_s=prefill_tps)
    elif queue is not None:
        running, waiting = queue.num_running, queue.num_waiting
    return InstanceSignals(
        num_running=running, num_waiting=waiting,
        request_throughput_rps=observed.request_throughput_rps(now_s),
        ttft_estimates_s=estimates,
        recent_ttft_s=observed.recent_ttft_s, recent_tpot_s=observed.recent_tpot_s,
        pending_decode_tokens=pending,
    )
