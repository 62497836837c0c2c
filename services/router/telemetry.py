"""The router's observability: Prometheus metrics, a span and a histogram around every stage, and the decision as a
span (schema in README.md beside this file).

Metrics live in the registry given (the process's default one in production, a fresh one per router in tests).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bear.router.decision import RouteResult
from bear.router.query import InvalidQuery, RouteQuery
from bear.router.signals import SKIPPED

STAGES = ("predict", "estimate", "snapshots", "choose", "record")
_LATENCY_BUCKETS_S = (0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1,
                      0.25, 0.5, 1.0)
_ERROR_BUCKETS_S = (-5.0, -2.0, -1.0, -0.5, -0.25, -0.1, -0.05, -0.025, -0.01, 0.0, 0.01, 0.025, 0.05, 0.1, 0.25,
                    0.5, 1.0, 2.0, 5.0)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def histogram(name: str, text: str, labels: list[str], buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, text, labels, buckets=buckets, registry=registry)

        self.decision_seconds = histogram("bear_router_decision_seconds", "Route latency inside the router, by the "
                                          "policy that decided", ["policy"], _LATENCY_BUCKETS_S)
        self.stage_seconds = histogram("bear_router_stage_seconds", "Latency of each stage of a decision",
                                       ["stage"], _LATENCY_BUCKETS_S)
        # Signed errors: Prometheus keeps no _sum for a histogram with negative buckets, so the absolute error has
        # its own histogram (its _sum / _count is the mean absolute error).
        self.ttft_error_seconds = histogram("bear_router_ttft_error_seconds", "Predicted minus observed TTFT of "
                                            "reported outcomes, by instance", ["instance"], _ERROR_BUCKETS_S)
        self.ttft_abs_error_seconds = histogram("bear_router_ttft_abs_error_seconds", "Absolute difference of "
                                                "predicted and observed TTFT, by instance", ["instance"],
                                                tuple(b for b in _ERROR_BUCKETS_S if b > 0))
        self.fallbacks = Counter("bear_router_fallbacks_total", "Degraded decisions, by reason and fallback policy",
                                 ["reason", "policy"], registry=registry)
        self.routes = Counter("bear_router_routes_total", "Queries routed, by instance, model and deciding policy",
                              ["instance", "model", "policy"], registry=registry)
        self.sheds = Counter("bear_router_sheds_total", "Queries shed, by policy", ["policy"], registry=registry)
        self.invalid_requests = Counter("bear_router_invalid_requests_total", "Route calls refused as invalid "
                                        "(INVALID_ARGUMENT), by field", ["field"], registry=registry)
        self.refusals = Counter("bear_router_refusals_total", "Calls refused, by method and status code "
                                "(INVALID_ARGUMENT, ALREADY_EXISTS, UNAVAILABLE: no ready instance)",
                                ["method", "code"], registry=registry)
        self.errors = Counter("bear_router_errors_total", "Calls answered with an error status, by method (Route: "
                              "unary or over RouteStream) and status code: the refusals, and the stream's own (a bad "
                              "deadline, a call id in flight), deadlines met and cancels", ["method", "code"],
                              registry=registry)
        self.dependency_errors = Counter("bear_router_dependency_errors_total", "Failed calls to the predictor, the "
                                         "estimator and Redis, by service and status code", ["service", "code"],
                                         registry=registry)
        self.unpredicted_instances = Counter("bear_router_unpredicted_instances_total", "Candidates left out because "
                                             "the predictor had no prediction for their model", ["model"],
                                             registry=registry)
        self.unrecorded_dispatches = Counter("bear_router_unrecorded_dispatches_total", "Dispatches not recorded in "
                                             "Redis (the estimator misses them), by reason", ["reason"],
                                             registry=registry)
        self.outcomes = Counter("bear_router_outcomes_total", "Reported outcomes, by whether their decision was "
                                "found", ["known"], registry=registry)
        self.snapshot_age_seconds = Gauge("bear_router_snapshot_age_seconds", "Age of the snapshot behind the latest "
                                          "estimate, by instance", ["instance"], registry=registry)
        self.ttft_offset_seconds = Gauge("bear_router_ttft_offset_seconds", "Learnt offset added to the estimator's "
                                         "TTFTs (median observed − estimated), by instance and by whether the query "
                                         "found the engine busy or idle", ["instance", "engine"], registry=registry)
        self.instances = Gauge("bear_router_instances", "Routable instances", registry=registry)
        self._stages = {stage: self.stage_seconds.labels(stage) for stage in STAGES}
        self._aged: set[str] = set()
        self._offset: set[str] = set()
        self._errored: set[str] = set()  # instances with TTFT error series
        self._routed: set[tuple[str, str, str]] = set()  # label values of routes_total

    def stage(self, name: str) -> Histogram:
        return self._stages[name]

    def dependency_failed(self, service: str, code: str) -> None:
        """A failed call to a neighbour. SKIPPED (the Redis store's back-off after a failure) made no call: not
        counted, the failure that started the back-off was."""
        if code != SKIPPED:
            self.dependency_errors.labels(service, code).inc()

    def count_route(self, instance_id: str, model: str, policy: str) -> None:
        self.routes.labels(instance_id, model, policy).inc()
        self._routed.add((instance_id, model, policy))

    def observe_ttft_error(self, instance_id: str, error_s: float) -> None:
        self.ttft_error_seconds.labels(instance_id).observe(error_s)
        self.ttft_abs_error_seconds.labels(instance_id).observe(abs(error_s))
        self._errored.add(instance_id)

    def set_snapshot_age(self, instance_id: str, age_s: float) -> None:
        self.snapshot_age_seconds.labels(instance_id).set(age_s)
        self._aged.add(instance_id)

    def set_ttft_offset(self, instance_id: str, engine_idle: bool, offset_s: float) -> None:
        self.ttft_offset_seconds.labels(instance_id, "idle" if engine_idle else "busy").set(offset_s)
        self._offset.add(instance_id)

    def forget_instances_except(self, instance_ids: set[str]) -> None:
        """Drops every per-instance series of the instances that are gone (pod names: each rollout brings new ones,
        and a router's series must not grow with them)."""
        for instance_id in self._aged - instance_ids:
            self.snapshot_age_seconds.remove(instance_id)
        for instance_id in self._offset - instance_ids:
            for engine in ("busy", "idle"):
                try:
                    self.ttft_offset_seconds.remove(instance_id, engine)
                except KeyError:  # never set for that engine state
                    pass
        for instance_id in self._errored - instance_ids:
            self.ttft_error_seconds.remove(instance_id)
            self.ttft_abs_error_seconds.remove(instance_id)
        for labels in {labels for labels in self._routed if labels[0] not in instance_ids}:
            self.routes.remove(*labels)
            self._routed.discard(labels)
        self._aged &= instance_ids
        self._offset &= instance_ids
        self._errored &= instance_ids


class Telemetry:
    """Spans (through `tracer`) and metrics around the stages of a decision."""

    def __init__(self, tracer: trace.Tracer, metrics: RouterMetrics) -> None:
        self.tracer = tracer
        self.metrics = metrics
        # OTEL_SDK_DISABLED gives a no-op tracer: then no span is even started (a few µs each on the Route path).
        self.tracing = not isinstance(tracer, trace.NoOpTracer)

    @contextmanager
    def stage(self, name: str) -> Iterator[trace.Span]:
        """A child span `bear.<name>` and the stage's histogram around the block."""
        started = time.perf_counter()
        try:
            if not self.tracing:
                yield trace.INVALID_SPAN
                return
            with self.tracer.start_as_current_span(f"bear.{name}") as span:
                yield span
        finally:
            self.metrics.stage(name).observe(time.perf_counter() - started)

    @contextmanager
    def route_span(self, query: RouteQuery, policy: str) -> Iterator[trace.Span]:
        if not self.tracing:
            yield trace.INVALID_SPAN
            return
        # An exception is recorded here, not by the SDK: a query refused while deciding (an unknown allowed model, a
        # prompt over the token limit once counted) is the caller's mistake, not an error of the router's.
        with self.tracer.start_as_current_span("bear.route", record_exception=False,
                                               set_status_on_exception=False) as span:
            if span.is_recording():
                span.set_attributes({
                    "bear.request_id": query.request_id,
                    "bear.ttft_slo_ms": query.ttft_slo_ms,
                    "bear.policy": policy,
                    "bear.prompt_tokens_given": query.prompt_tokens or 0,
                    "bear.prompt_bytes": len(query.prompt.encode()) if query.prompt else 0,
                    "bear.allowed_models": list(query.allowed_models),
                })
                if query.lambda_per_micro_usd is not None:
                    span.set_attribute("bear.lambda_per_micro_usd", query.lambda_per_micro_usd)
                if query.delta_per_s is not None:
                    span.set_attribute("bear.delta_per_s", query.delta_per_s)
                if query.max_tokens is not None:
                    span.set_attribute("bear.max_tokens", query.max_tokens)
            try:
                yield span
            except InvalidQuery as error:
                span.set_attribute("bear.refused", str(error))
                raise
            except asyncio.CancelledError:  # the caller gave up (its deadline, a cancellation) before the decision
                span.set_attribute("bear.cancelled", True)
                raise
            except Exception as error:
                span.record_exception(error)
                span.set_status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}")
                raise


def record_decision(span: trace.Span, result: RouteResult, prompt_tokens: int) -> None:
    """The decision on its span: attributes for the outcome, one `bear.candidate` event per candidate."""
    if not span.is_recording():
        return
    span.set_attributes({
        "bear.prompt_tokens": prompt_tokens,
        "bear.decision": str(result.decision),
        "bear.instance_id": result.instance_id,
        "bear.model": result.model,
        "bear.endpoint": result.endpoint,
        "bear.decided_by": result.policy,
        "bear.reason": result.reason,
        "bear.degraded": result.degraded,
        "bear.degraded_reason": result.degraded_reason,
        "bear.num_candidates": len(result.candidates),
        "bear.ttft_budget_ms": result.ttft_budget_ms,
    })
    for c in result.candidates:
        span.add_event("bear.candidate", {
            "bear.instance_id": c.instance_id,
            "bear.model": c.model,
            "bear.predicted_accuracy": c.predicted_accuracy,
            "bear.predicted_output_tokens": c.predicted_output_tokens,
            "bear.prompt_tokens": c.prompt_tokens,
            "bear.predicted_cost_micro_usd": c.predicted_cost_micro_usd,
            "bear.utility": c.utility,
            "bear.ttft_known": c.ttft_known,
            "bear.predicted_ttft_ms": c.predicted_ttft_ms,
            "bear.ttft_method": c.ttft_method,
            "bear.feasible": c.feasible,
            "bear.score": c.score,
            "bear.snapshot_age_ms": c.snapshot_age_ms,
            "bear.cached_prompt_tokens": c.cached_prompt_tokens,
            **({} if c.idle_ms is None else {"bear.idle_ms": c.idle_ms}),
            "bear.chosen": c.instance_id == result.instance_id,
        })
