"""The decision: a query in, an instance (or a shed) out, with every candidate's predictions and the reason.

    validate → instances (ready, allowed models) → predict ∥ estimate → candidates → choose → record → answer

Invariant: once a query is valid and an instance is ready, Route answers. A dependency that fails (the predictor, the
estimator, Redis, even the policy) is counted and worked around, never passed on to the caller:

- predictor or estimator unavailable (or a policy that raises): the fallback policy (configured, default
  `shortest-queue`) decides, over the queue lengths of the estimator's answer or, when the estimator is down, of the
  latest snapshots in Redis; with no queue lengths at all, `round-robin`. The decision says `degraded` and why.
- Redis unavailable: the dispatch is not recorded (the estimator then misses it), registrations stay as last read.
  Records are written off the Route path (bear.router.recorder).

Every stage runs in a span `bear.<stage>` with its histogram (bear.router.telemetry), inside one `bear.route` span.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from opentelemetry import trace

from bear.common.messages import shown
from bear.common.prefix_blocks import prefix_block_hashes
from bear.common.redis_keys import DISPATCH_TTL_S
from bear.common.redis_config import honour_cancellation
from bear.router.decision import DispatchRecord, Outcome, RouteResult, describe
from bear.router.pool import InstanceInfo, InstancePool, Registration
from bear.router.query import (
    DuplicateRequest,
    InvalidQuery,
    Limits,
    RouteQuery,
    check_prompt_tokens,
    check_request_id,
    validate,
)
from bear.router.recent import RecentDispatches, ReportedIds
from bear.router.recorder import DispatchRecorder
from bear.router.signals import (
    SKIPPED,
    DependencyUnavailable,
    InstanceEstimate,
    ModelPrediction,
    ObservationBook,
    QueueLengths,
    build_candidates,
    prediction_for,
)
from bear.router.telemetry import Telemetry, record_decision
from bear.routing.contract import Candidate, Choice, Decision, Policy, RouteRequest
from bear.routing.observations import OBSERVATION_WINDOW, THROUGHPUT_WINDOW_S
from bear.routing.registry import build_policy

logger = logging.getLogger("bear.router")
LONG_PROMPT_CHARS = 20_000  # longer prompts are tokenised off the event loop
MAX_RECENT_DISPATCHES = 32  # at most this many of the router's latest dispatches go along with an Estimate call
MAX_RECORDED_AGAIN = 5_000  # the latest dispatches written again after Redis came back empty (half the queue)
MAX_OBSERVED_MS = 86_400_000.0  # a reported TTFT or end-to-end time beyond a day is an error, not an observation


class Predictions(Protocol):
    async def predict(self, prompt: str) -> Mapping[str, ModelPrediction]: ...


class Estimates(Protocol):
    async def estimate(self, query_id: str, prompt_tokens: int, output_tokens: float, instance_ids: Sequence[str],
                       horizon_ms: float, recent: Sequence[DispatchRecord] = (),
                       prefix_hashes: bytes = b"") -> Mapping[str, InstanceEstimate]:
        """`recent`: this router's latest dispatches, for the estimator to count before Redis tells it;
        `prefix_hashes`: the prompt's prefix blocks (bear.common.prefix_blocks), for its prefix-cache hits."""


class Store(Protocol):
    async def record_dispatches(self, records: Sequence[DispatchRecord], timeout_s: float | None = None) -> None: ...

    async def dispatch(self, request_id: str) -> DispatchRecord | None: ...

    async def queue_lengths(self, instance_ids: Sequence[str], max_age_s: float) -> dict[str, QueueLengths]: ...

    async def registrations(self) -> tuple[dict[str, Registration], bool]: ...


class NoInstances(Exception):
    """No ready instance serves the query's models (UNAVAILABLE: it may pass)."""


class DecisionUnreachable(Exception):
    """ReportOutcome: the decision is not in this replica's memory and Redis, which holds every replica's, did not
    answer (UNAVAILABLE: report again later; `known: false` would say there was no such decision)."""


@dataclass(frozen=True, slots=True)
class RouterSettings:
    default_policy: str
    lambda_per_micro_usd: float
    horizon_factor: float  # replays stop at horizon_factor × the TTFT target + 1 s
    default_output_tokens: float
    limits: Limits
    fallback_snapshot_max_age_s: float
    ttft_feedback_window: int = 0  # 0: estimates are used as the estimator gives them
    recent_dispatches_s: float = 0.0  # dispatches this young go along with Estimate calls (0: none)


@dataclass(frozen=True, slots=True)
class _Inputs:
    """What the predict and estimate stages brought back."""

    instances: tuple[InstanceInfo, ...]
    predictions: Mapping[str, ModelPrediction] | None
    estimates: Mapping[str, InstanceEstimate] | None
    queues: Mapping[str, QueueLengths] | None
    errors: tuple[DependencyUnavailable, ...]


class Router:
    def __init__(self, settings: RouterSettings, pool: InstancePool, predictor: Predictions, estimator: Estimates,
                 store: Store, policies: Mapping[str, Policy], fallback: Policy, telemetry: Telemetry,
                 tokenize: Callable[[str], np.ndarray], clock: Callable[[], float] = time.time) -> None:
        """`tokenize`: a prompt's token keys (bear.predictor.tokenizers), counted and named by prefix blocks."""
        if settings.default_policy not in policies:
            raise ValueError(f"the default policy {settings.default_policy!r} is not among the policies")
        self._settings, self._pool, self._predictor, self._estimator = settings, pool, predictor, estimator
        self._store, self._policies, self._fallback = store, dict(policies), fallback
        self._last_resort = build_policy("round-robin")
        self._telemetry, self._metrics = telemetry, telemetry.metrics
        self._tokenize, self._clock = tokenize, clock
        self._policy_names = frozenset(policies)
        self._observations = ObservationBook(OBSERVATION_WINDOW, THROUGHPUT_WINDOW_S, clock(),
                                             settings.ttft_feedback_window)
        self._recent = RecentDispatches()
        self._deciding: set[str] = set()  # request ids of the Route calls in progress
        self._reported = ReportedIds()
        self._recorder = DispatchRecorder(store, telemetry.tracer, telemetry.metrics)
        self._loaded = False
        self._refresh_failures = 0  # refreshes in a row that Redis failed (logged at the first and every 20th)
        self._first_load: asyncio.Future[None] | None = None
        self._routable: frozenset[str] = frozenset()  # as of the last refresh, for the log of its changes
        self._unpredicted: set[str] = set()  # models left out for want of a prediction, logged once each

    # Route ----------------------------------------------------------------------------------------------------------

    async def route(self, query: RouteQuery) -> RouteResult:
        started = time.perf_counter()
        try:
            query = validate(query, self._settings.limits, self._policy_names)
            policy = self._policies[query.policy or self._settings.default_policy]
            self._claim(query.request_id)
            try:
                with self._telemetry.route_span(query, policy.name) as span:
                    result, prompt_tokens = await self._decide(query, policy, started)
                    record_decision(span, result, prompt_tokens)
            finally:
                self._deciding.discard(query.request_id)
        except DuplicateRequest:
            self._metrics.refusals.labels("Route", "ALREADY_EXISTS").inc()
            raise
        except InvalidQuery as error:
            self._metrics.invalid_requests.labels(error.field).inc()
            self._metrics.refusals.labels("Route", "INVALID_ARGUMENT").inc()
            raise
        except NoInstances:
            self._metrics.refusals.labels("Route", "UNAVAILABLE").inc()
            raise
        self._count(result)
        return result

    def _claim(self, request_id: str) -> None:
        """A request id is routed once: a Route call with the id of one being decided or routed (in the last
        RecentDispatches TTL) is refused. Per replica: another replica's dispatches are not seen here."""
        if request_id in self._deciding or self._recent.get(request_id, self._clock()) is not None:
            raise DuplicateRequest("request_id", f"{shown(request_id)} was already routed: each query needs its own id")
        self._deciding.add(request_id)

    async def _decide(self, query: RouteQuery, policy: Policy, started: float) -> tuple[RouteResult, int]:
        instances = await self._instances(query)
        prompt_tokens, prefix_hashes = await self._prompt_tokens(query)
        inputs = await self._gather(query, prompt_tokens, prefix_hashes, instances)
        candidates = build_candidates(inputs.instances, prompt_tokens, inputs.predictions, inputs.estimates,
                                      inputs.queues, self._observations, self._clock(),
                                      self._settings.default_output_tokens, query.max_tokens)
        # The target counts from the Route call: what the router has spent on it is no longer the instance's to use
        # (a slow decision, a busy host). Estimates are from the dispatch on, so they are judged against the rest.
        budget_ms = query.ttft_slo_ms - (time.perf_counter() - started) * 1000
        request = RouteRequest(query.request_id, budget_ms / 1000,
                               _or(query.lambda_per_micro_usd, self._settings.lambda_per_micro_usd),
                               query.delta_per_s)
        servable, never = _servable(candidates, inputs.estimates, inputs.queues, prompt_tokens)
        if servable:
            choice, decided_by, degraded_reason = self._choose(policy, request, servable, inputs)
        else:  # no policy could do better than to send the query where it can never be served
            choice, decided_by, degraded_reason = Choice(None, Decision.SHED, never, ()), policy, ""
        views = describe(inputs.instances, candidates, choice, inputs.estimates, inputs.queues, budget_ms,
                         decided_by.estimator)
        chosen = next((i for i, c in enumerate(candidates) if c.instance_id == choice.instance_id), None)
        if choice.decision is Decision.ROUTE and chosen is not None:
            self._record(query, candidates[chosen], (inputs.estimates or {}).get(candidates[chosen].instance_id),
                         inputs.predictions, prefix_hashes)
        instance = inputs.instances[chosen] if chosen is not None else None
        result = RouteResult(
            request_id=query.request_id, decision=choice.decision,
            instance_id=instance.instance_id if instance else "", endpoint=instance.endpoint if instance else "",
            model=instance.model if instance else "", policy=decided_by.name, reason=choice.reason,
            candidates=views, degraded=bool(degraded_reason), degraded_reason=degraded_reason,
            decision_ms=(time.perf_counter() - started) * 1000, ttft_budget_ms=budget_ms)
        return result, prompt_tokens

    async def _instances(self, query: RouteQuery) -> tuple[InstanceInfo, ...]:
        if not self._loaded:  # the first queries wait for the first read of the registrations
            if self._first_load is None:
                self._first_load = asyncio.ensure_future(self.refresh_instances())
            await asyncio.shield(self._first_load)
        instances = self._pool.select(query.allowed_models)
        if not instances:
            models = f" serves {', '.join(query.allowed_models)}" if query.allowed_models else " is known"
            raise NoInstances(f"no ready instance{models}")
        return instances

    async def _prompt_tokens(self, query: RouteQuery) -> tuple[int, bytes]:
        """The prompt's length in tokens and its prefix blocks (none for a length-only query)."""
        if query.prompt is None:
            assert query.prompt_tokens is not None
            return query.prompt_tokens, b""
        if len(query.prompt) > LONG_PROMPT_CHARS:
            tokens, hashes = await asyncio.to_thread(self._tokens_and_prefixes, query.prompt)
        else:
            tokens, hashes = self._tokens_and_prefixes(query.prompt)
        check_prompt_tokens(tokens, self._settings.limits)
        return max(1, tokens), hashes

    def _tokens_and_prefixes(self, prompt: str) -> tuple[int, bytes]:
        keys = self._tokenize(prompt)
        return len(keys), prefix_block_hashes(keys)

    async def _gather(self, query: RouteQuery, prompt_tokens: int, prefix_hashes: bytes,
                      instances: tuple[InstanceInfo, ...]) -> _Inputs:
        """Predictions and estimates in parallel; queue lengths from Redis when the estimator failed."""
        ids = [i.instance_id for i in instances]
        (predictions, predict_error), (estimates, estimate_error) = await asyncio.gather(
            self._predict(query), self._estimate(query, prompt_tokens, prefix_hashes, ids))
        instances, predictions, predict_error = self._covered(instances, predictions, predict_error)
        queues = await self._snapshot_queues(ids) if estimate_error is not None else None
        for instance_id, queue in (queues or {}).items():  # the fallback's snapshots are the ones behind it now
            self._metrics.set_snapshot_age(instance_id, queue.snapshot_age_ms / 1000)
        errors = tuple(e for e in (predict_error, estimate_error) if e is not None)
        return _Inputs(instances, predictions, estimates, queues, errors)

    async def _predict(self, query: RouteQuery) -> tuple[Mapping[str, ModelPrediction] | None,
                                                          DependencyUnavailable | None]:
        if query.prompt is None:
            return None, None  # a length-only query: no text to predict from
        with self._telemetry.stage("predict") as span:
            try:
                return await self._predictor.predict(query.prompt), None
            except DependencyUnavailable as error:
                self._metrics.dependency_failed("predictor", error.code)
                _failed(span, error)
                return None, error

    async def _estimate(self, query: RouteQuery, prompt_tokens: int, prefix_hashes: bytes, instance_ids: list[str]
                        ) -> tuple[Mapping[str, InstanceEstimate] | None, DependencyUnavailable | None]:
        horizon_ms = (self._settings.horizon_factor * query.ttft_slo_ms / 1000 + 1.0) * 1000
        with self._telemetry.stage("estimate") as span:
            try:
                output_tokens = min(self._settings.default_output_tokens, query.max_tokens or math.inf)
                estimates = await self._estimator.estimate(query.request_id, prompt_tokens, output_tokens,
                                                           instance_ids, horizon_ms, self._latest_dispatches(),
                                                           prefix_hashes)
            except DependencyUnavailable as error:
                self._metrics.dependency_failed("estimator", error.code)
                _failed(span, error)
                return None, error
        corrected = {}
        for instance_id, estimate in estimates.items():
            if estimate.snapshot_age_ms is not None:
                self._metrics.set_snapshot_age(instance_id, estimate.snapshot_age_ms / 1000)
            offset_s = self._observations.of(instance_id).ttft_offset_s(estimate.idle_ms is not None)
            corrected[instance_id] = estimate.with_offset(offset_s * 1000)
        return corrected, None

    def _latest_dispatches(self) -> list[DispatchRecord]:
        """This router's dispatches of the last `recent_dispatches_s`: the estimator reads every router's from Redis,
        but only tens of milliseconds later, and a query routed meanwhile must count them ahead of it."""
        window_s = self._settings.recent_dispatches_s
        if window_s <= 0:
            return []
        return self._recent.latest(self._clock() - window_s, MAX_RECENT_DISPATCHES)

    def _covered(self, instances: tuple[InstanceInfo, ...], predictions: Mapping[str, ModelPrediction] | None,
                 error: DependencyUnavailable | None) -> tuple[tuple[InstanceInfo, ...],
                                                               Mapping[str, ModelPrediction] | None,
                                                               DependencyUnavailable | None]:
        """The instances whose model the predictor answered for; none of them: as if the predictor were down."""
        if predictions is None:
            return instances, None, error
        covered = tuple(i for i in instances if prediction_for(i.model, predictions) is not None)
        missing = sorted({i.model for i in instances} - {i.model for i in covered})
        for model in missing:
            self._metrics.unpredicted_instances.labels(model).inc()
            if model not in self._unpredicted:  # once per model: the metric counts every query (QA: no log line)
                self._unpredicted.add(model)
                left_out = [i.instance_id for i in instances if i.model == model]
                logger.warning("instances of model %r (%s) are left out of routing: the predictor has no prediction "
                               "for it (its models: %s); a model the predictor's catalogue names, or a Hugging Face "
                               "id of one, is routed", model, _listed(left_out), ", ".join(sorted(predictions)))
        if covered:
            return covered, predictions, None
        return instances, None, DependencyUnavailable("predictor", "NO_PREDICTION",
                                                      f"no prediction for model(s) {', '.join(missing)}")

    async def _snapshot_queues(self, instance_ids: list[str]) -> dict[str, QueueLengths]:
        with self._telemetry.stage("snapshots") as span:
            try:
                return await self._store.queue_lengths(instance_ids, self._settings.fallback_snapshot_max_age_s)
            except DependencyUnavailable as error:
                self._metrics.dependency_failed("redis", error.code)
                _failed(span, error)
                return {}

    def _choose(self, policy: Policy, request: RouteRequest, candidates: Sequence[Candidate],
                inputs: _Inputs) -> tuple[Choice, Policy, str]:
        """The policy's choice, or the fallback's (with the reason) when an input it reads is missing or the policy
        fails. A policy that reads no TTFT estimate decides without the estimator, over the latest snapshots' queue
        lengths (the fallback's own signal then)."""
        missing = any(e.service != "estimator" or policy.estimator is not None for e in inputs.errors)
        errors = inputs.errors if missing else ()
        problems = [str(e) for e in errors]
        with self._telemetry.stage("choose") as span:  # one stage, whoever decides: its count is the decisions'
            if not problems:
                try:
                    return policy.choose(request, candidates), policy, ""
                except Exception as error:  # noqa: BLE001 - a policy's failure must not fail the call
                    logger.exception("policy %s failed; deciding with the fallback", policy.name)
                    problems = [f"policy {policy.name} failed ({type(error).__name__}: {error})"]
                    span.set_attribute("bear.error", problems[0])
                    span.set_status(trace.StatusCode.ERROR, problems[0])
            has_queues = any(c.signals.num_resident is not None for c in candidates)
            fallback = self._fallback if has_queues else self._last_resort
            source = ("no queue lengths" if not has_queues else "queue lengths from the latest snapshots in Redis"
                      if inputs.estimates is None else "queue lengths from the estimator")
            try:
                choice = fallback.choose(request, candidates)
            except Exception:  # noqa: BLE001 - the configured fallback failed too: the last resort never does
                logger.exception("fallback policy %s failed; deciding with round-robin", fallback.name)
                fallback, choice = self._last_resort, self._last_resort.choose(request, candidates)
        label = "-and-".join(e.service for e in errors) + "-unavailable" if errors else "policy-error"
        self._metrics.fallbacks.labels(label, fallback.name).inc()
        return choice, fallback, f"{'; '.join(problems)}: {fallback.name} ({source})"

    def _record(self, query: RouteQuery, chosen: Candidate, estimate: InstanceEstimate | None,
                predictions: Mapping[str, ModelPrediction] | None, prefix_hashes: bytes) -> None:
        """The dispatch, in memory and (soon, see bear.router.recorder) in Redis, with the estimator's TTFT (0: none)
        to measure outcomes against. Its length is the predictor's mean, not capped at max_tokens (which goes
        along): the estimator's remaining lengths are drawn about that mean and capped at max_tokens, as for the
        requests in a snapshot."""
        prediction = prediction_for(chosen.model, predictions) if predictions is not None else None
        length = prediction.output_tokens if prediction is not None else self._settings.default_output_tokens
        ttft = estimate.ttft_s if estimate is not None else None
        known = ttft is not None and math.isfinite(ttft)
        predicted_ttft_ms = ttft * 1000 if known else 0.0
        offset_ms = estimate.ttft_offset_ms if known and estimate is not None else 0.0
        exact = known and estimate is not None and estimate.method == "replay" and not estimate.lower_bound
        idle = exact and estimate is not None and estimate.idle_ms is not None
        record = DispatchRecord(query.request_id, chosen.instance_id, chosen.model, self._clock(),
                                chosen.prompt_tokens, length, predicted_ttft_ms, query.ttft_slo_ms, offset_ms, exact,
                                query.max_tokens or 0, prefix_hashes, idle)
        self._recent.add(record)
        self._recorder.submit(record)

    def _record_again(self) -> None:
        """Redis came back empty: this router's latest dispatches are written again, so that the estimator finds
        the predicted lengths of the requests still running, and another replica the decisions it is told of."""
        records = self._recent.latest(self._clock() - DISPATCH_TTL_S, MAX_RECORDED_AGAIN)
        if records:
            logger.info("Redis came back empty: writing this router's %d latest dispatch records again", len(records))
        for record in records:
            self._recorder.submit(record, traced=False)

    def _count(self, result: RouteResult) -> None:
        self._metrics.decision_seconds.labels(result.policy).observe(result.decision_ms / 1000)
        if result.decision is Decision.ROUTE:
            self._metrics.count_route(result.instance_id, result.model, result.policy)
        else:
            self._metrics.sheds.labels(result.policy).inc()

    def count_refusal(self, method: str, code: str) -> None:
        """A call refused before it reached the router (a request that did not decode)."""
        self._metrics.refusals.labels(method, code).inc()

    def count_error(self, method: str, code: str) -> None:
        """A call the gRPC face answered with an error status (`code`: its name)."""
        self._metrics.errors.labels(method, code).inc()

    # ReportOutcome --------------------------------------------------------------------------------------------------

    async def report_outcome(self, outcome: Outcome) -> tuple[bool, float]:
        """Records the observation at the instance the query went to; returns (decision found, predicted TTFT ms)."""
        try:
            _validate_outcome(outcome)
        except InvalidQuery:
            self._metrics.refusals.labels("ReportOutcome", "INVALID_ARGUMENT").inc()
            raise
        now_s = self._clock()
        ttft_known = outcome.observed_ttft_ms > 0
        with self._telemetry.tracer.start_as_current_span(
                "bear.outcome", attributes={"bear.request_id": outcome.request_id}) as span:
            record = self._recent.get(outcome.request_id, now_s)
            if record is None:
                try:
                    record = await self._store.dispatch(outcome.request_id)
                except DependencyUnavailable as error:
                    self._metrics.dependency_failed("redis", error.code)
                    raise DecisionUnreachable(
                        f"request {outcome.request_id!r}: its decision is not in this router's memory, and Redis, "
                        f"which keeps every replica's, did not answer ({error}): report it again later") from None
            span.set_attribute("bear.dispatch_found", record is not None)
            if record is None:
                self._metrics.outcomes.labels("false").inc()
                return False, 0.0
            if not self._reported.first(outcome.request_id):  # a retried report: answered, counted once
                span.set_attribute("bear.repeated_report", True)
                return True, record.predicted_ttft_ms
            self._metrics.outcomes.labels("true").inc()
            estimated_ttft_s = ((record.predicted_ttft_ms - record.ttft_offset_ms) / 1000
                                if record.ttft_exact and ttft_known else None)
            self._observations.of(record.instance_id).observe(
                ttft_s=outcome.observed_ttft_ms / 1000 if ttft_known else None, tpot_s=outcome.tpot_s,
                completed_at_s=now_s if outcome.observed_e2e_ms > 0 else None, estimated_ttft_s=estimated_ttft_s,
                engine_idle=record.engine_idle)
            if span.is_recording():
                span.set_attributes({"bear.instance_id": record.instance_id,
                                     "bear.observed_ttft_ms": outcome.observed_ttft_ms,
                                     "bear.predicted_ttft_ms": record.predicted_ttft_ms})
            if self._settings.ttft_feedback_window > 0:  # else the offset is always 0: not exported
                offset_s = self._observations.of(record.instance_id).ttft_offset_s(record.engine_idle)
                self._metrics.set_ttft_offset(record.instance_id, record.engine_idle, offset_s)
            if record.predicted_ttft_ms > 0 and ttft_known:
                error_s = (record.predicted_ttft_ms - outcome.observed_ttft_ms) / 1000
                self._metrics.observe_ttft_error(record.instance_id, error_s)
            return True, record.predicted_ttft_ms

    # Instances ------------------------------------------------------------------------------------------------------

    async def refresh_instances(self) -> None:
        """Re-reads the registrations from Redis (kept as they were when Redis fails). Never raises: the first Route
        calls wait for the first refresh, and the refresh loop must outlive anything Redis holds."""
        try:
            found, redis_new = await self._store.registrations()
            self._pool.update_registrations(found, self._clock(), redis_new)
            if redis_new:
                self._record_again()
            if self._refresh_failures:
                logger.info("Redis answered again: instance registrations read (after %d failed refreshes)",
                            self._refresh_failures)
                self._refresh_failures = 0
        except DependencyUnavailable as error:
            self._metrics.dependency_failed("redis", error.code)
            if error.code != SKIPPED:
                self._refresh_failures += 1
                if self._refresh_failures == 1 or self._refresh_failures % 20 == 0:
                    logger.warning("reading the instance registrations from Redis failed (%d in a row; the "
                                   "instances stay as they were): %s", self._refresh_failures, error)
        except Exception:  # noqa: BLE001 - a bug or a value no check foresaw: the registrations stay as they were
            logger.exception("refreshing the instance registrations failed; kept as they were")
            self._metrics.dependency_failed("redis", "INTERNAL")
        self._loaded = True
        ids = {i.instance_id for i in self._pool.instances()}
        self._log_changes(frozenset(ids))
        self._metrics.instances.set(len(ids))
        self._metrics.forget_instances_except(ids)
        self._observations.forget_except(ids)

    def _log_changes(self, ids: frozenset[str]) -> None:
        """Says which instances joined or left the routable set (and when none is left, what that means)."""
        joined, left = sorted(ids - self._routable), sorted(self._routable - ids)
        self._routable = ids
        if joined:
            logger.info("routing to %d more instance(s): %s", len(joined), _listed(joined))
        if left:
            logger.warning("no longer routing to %d instance(s): %s (not ready in discovery, or the registration "
                           "in Redis withdrawn by its sidecar or not refreshed)", len(left), _listed(left))
        if left and not ids:
            logger.warning("no instance left to route to: Route calls are refused (UNAVAILABLE) until one is ready")

    async def flush(self) -> None:
        """Waits until the dispatches decided so far are written to Redis (or failed)."""
        await self._recorder.flush()

    async def close(self) -> None:
        if self._first_load is not None and not self._first_load.done():  # a task of its own, not the server's
            self._first_load.cancel()
            await asyncio.gather(self._first_load, return_exceptions=True)
        await self._recorder.close()

    async def refresh_forever(self, interval_s: float) -> None:
        while True:
            await self.refresh_instances()
            honour_cancellation()
            await asyncio.sleep(interval_s)


def _validate_outcome(outcome: Outcome) -> None:
    """observed_ttft_ms and observed_e2e_ms: 0 when unknown (a query that failed before its first token)."""
    if not outcome.request_id:
        raise InvalidQuery("request_id", "required")
    check_request_id(outcome.request_id)
    for name in ("observed_ttft_ms", "observed_e2e_ms"):
        value = getattr(outcome, name)
        if not (math.isfinite(value) and 0 <= value <= MAX_OBSERVED_MS):
            raise InvalidQuery(name, f"must be a number of milliseconds in [0, {MAX_OBSERVED_MS:g}] (0: unknown), "
                                     f"got {value!r}")
    if 0 < outcome.observed_e2e_ms < outcome.observed_ttft_ms:  # both from the dispatch: the end comes after the first
        raise InvalidQuery("observed_e2e_ms", f"{outcome.observed_e2e_ms!r} ms is before the first token "
                                              f"(observed_ttft_ms {outcome.observed_ttft_ms!r} ms)")


def _failed(span: trace.Span, error: DependencyUnavailable) -> None:
    """A stage whose neighbour failed (the decision goes on, degraded): its span says so, as bear.record's does."""
    span.set_attribute("bear.error", str(error))
    span.set_status(trace.StatusCode.ERROR, str(error))


def _servable(candidates: Sequence[Candidate], estimates: Mapping[str, InstanceEstimate] | None,
              queues: Mapping[str, QueueLengths] | None, prompt_tokens: int) -> tuple[list[Candidate], str]:
    """The candidates the estimator did not find unable ever to serve the query (a prompt longer than the instance's
    max_model_len or KV cache, a resident that can never finish ahead of it), and, when none is left, why. Without
    the estimator, the engine settings of the latest snapshots in Redis still tell which prompts are too long."""
    servable, reasons = [], []
    for candidate in candidates:
        estimate = (estimates or {}).get(candidate.instance_id)
        queue = (queues or {}).get(candidate.instance_id)
        if estimate is not None and estimate.known and not estimate.feasible:
            reasons.append(f"{candidate.instance_id}: {estimate.reason or 'infeasible'}")
        elif estimates is None and queue is not None and (refusal := queue.refusal(prompt_tokens)):
            reasons.append(f"{candidate.instance_id}: {refusal}")
        else:
            servable.append(candidate)
    more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
    return servable, f"no instance can ever serve this query ({'; '.join(reasons[:3])}{more})"


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _listed(ids: Sequence[str], most: int = 10) -> str:
    return ", ".join(ids[:most]) + (f" and {len(ids) - most} more" if len(ids) > most else "")
