"""A router with in-memory neighbours, so that a test states only the predictions, estimates and failures it is
about: `make_router(instances=..., predictions=..., estimates=...)`, then `route(router, prompt=...)`."""

from __future__ import annotations

import asyncio
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from bear.router.decision import DispatchRecord, RouteResult
from bear.router.pool import InstancePool, Registration
from bear.router.query import Limits, RouteQuery
from bear.router.router import Router, RouterSettings
from bear.router.signals import DependencyUnavailable, InstanceEstimate, ModelPrediction, QueueLengths
from bear.router.telemetry import RouterMetrics, Telemetry
from bear.routing.registry import build_policy, policy_names

LIMITS = Limits(max_ttft_slo_ms=600_000, max_prompt_bytes=10_000, max_prompt_tokens=1_000)


def word_keys(text: str) -> np.ndarray:
    """A tokenizer for tests: one token per word, keyed by its CRC-32."""
    return np.array([zlib.crc32(word.encode()) for word in text.split()], dtype=np.int64)
INSTANCES = (
    Registration("small-0", "small", "Qwen3-0.6B", "http://small-0:8000", 0.044, 0.173),
    Registration("medium-0", "medium", "Qwen3-8B", "http://medium-0:8000", 0.072, 0.287),
    Registration("large-0", "large", "Qwen3-32B", "http://large-0:8000", 0.287, 0.640),
)


def prediction(model: str, accuracy: float, output_tokens: float = 100.0, prompt_tokens: int = 10,
               cost: float = 0.0, output_price: float = 0.0) -> ModelPrediction:
    return ModelPrediction(model, accuracy, output_tokens, prompt_tokens, cost, output_price)


def estimate(instance_id: str, ttft_ms: float | None = 100.0, *, method: str = "replay", running: int | None = 0,
             waiting: int | None = 0, age_ms: float | None = 5.0, feasible: bool = True,
             prefill_tps_ms: float | None = None) -> InstanceEstimate:
    return InstanceEstimate(instance_id, method, ttft_ms is not None, feasible, ttft_ms or 0.0,
                            snapshot_age_ms=age_ms, num_running=running, num_waiting=waiting,
                            pending_decode_tokens=0.0 if running is not None else None,
                            prefill_tps_ttft_ms=prefill_tps_ms)


@dataclass
class FakePredictions:
    predictions: dict[str, ModelPrediction] = field(default_factory=dict)
    error: DependencyUnavailable | None = None
    prompts: list[str] = field(default_factory=list)

    async def predict(self, prompt: str) -> Mapping[str, ModelPrediction]:
        self.prompts.append(prompt)
        if self.error is not None:
            raise self.error
        return self.predictions


@dataclass
class FakeEstimates:
    estimates: dict[str, InstanceEstimate] = field(default_factory=dict)
    error: DependencyUnavailable | None = None
    calls: list[tuple[str, int, tuple[str, ...], float]] = field(default_factory=list)
    recent: list[tuple[str, ...]] = field(default_factory=list)  # per call: the request ids sent along
    prefix_hashes: list[bytes] = field(default_factory=list)  # per call: the prompt's prefix blocks
    output_tokens: list[float] = field(default_factory=list)  # per call: the query's output length
    delay_s: float = 0.0  # how long each call takes

    async def estimate(self, query_id: str, prompt_tokens: int, output_tokens: float, instance_ids: Sequence[str],
                       horizon_ms: float, recent: Sequence[DispatchRecord] = (),
                       prefix_hashes: bytes = b"") -> Mapping[str, InstanceEstimate]:
        self.calls.append((query_id, prompt_tokens, tuple(instance_ids), horizon_ms))
        self.prefix_hashes.append(prefix_hashes)
        self.recent.append(tuple(r.request_id for r in recent))
        self.output_tokens.append(output_tokens)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return {i: e for i, e in self.estimates.items() if i in instance_ids}


@dataclass
class FakeStore:
    registrations_: dict[str, Registration] = field(default_factory=dict)
    queues: dict[str, QueueLengths] = field(default_factory=dict)
    records: list[DispatchRecord] = field(default_factory=list)
    stored: dict[str, DispatchRecord] = field(default_factory=dict)
    down: bool = False
    redis_new: bool = False  # the next read finds Redis new or back empty
    delay_s: float = 0.0  # how long each read of the registrations takes

    def _check(self) -> None:
        if self.down:
            raise DependencyUnavailable("redis", "UNAVAILABLE", "ConnectionError: down")

    async def record_dispatches(self, records: Sequence[DispatchRecord], timeout_s: float | None = None) -> None:
        self._check()
        self.records.extend(records)

    async def dispatch(self, request_id: str) -> DispatchRecord | None:
        self._check()
        return self.stored.get(request_id)

    async def queue_lengths(self, instance_ids: Sequence[str], max_age_s: float) -> dict[str, QueueLengths]:
        self._check()
        return {i: q for i, q in self.queues.items() if i in instance_ids and q.snapshot_age_ms <= max_age_s * 1e3}

    async def registrations(self) -> tuple[dict[str, Registration], bool]:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self._check()
        redis_new, self.redis_new = self.redis_new, False
        return dict(self.registrations_), redis_new


@dataclass
class Harness:
    router: Router
    predictor: FakePredictions
    estimator: FakeEstimates
    store: FakeStore
    spans: InMemorySpanExporter
    registry: CollectorRegistry
    clock: list[float]  # the router's clock (Unix seconds): clock[0]

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def make_router(*, instances: Sequence[Registration] = INSTANCES,
                predictions: Mapping[str, ModelPrediction] | None = None,
                estimates: Mapping[str, InstanceEstimate] | None = None, default_policy: str = "bear",
                fallback: str = "shortest-queue", clock_s: float = 1000.0, ttft_feedback_window: int = 64,
                recent_dispatches_s: float = 0.25, refreshed: bool = True) -> Harness:
    if predictions is None:
        predictions = {"Qwen3-0.6B": prediction("Qwen3-0.6B", 0.5), "Qwen3-8B": prediction("Qwen3-8B", 0.7),
                       "Qwen3-32B": prediction("Qwen3-32B", 0.9)}
    if estimates is None:
        estimates = {r.instance_id: estimate(r.instance_id) for r in instances}
    predictor, estimator = FakePredictions(dict(predictions)), FakeEstimates(dict(estimates))
    store = FakeStore({r.instance_id: r for r in instances})
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    clock = [clock_s]
    settings = RouterSettings(default_policy, 5e-4, 4.0, 256.0, LIMITS, 10.0, ttft_feedback_window,
                              recent_dispatches_s)
    policies = {name: build_policy(name) for name in policy_names()}
    router = Router(settings, InstancePool(lambda: {}), predictor, estimator, store, policies,
                    build_policy(fallback), Telemetry(provider.get_tracer("test"), RouterMetrics(registry)),
                    word_keys, clock=lambda: clock[0])
    if refreshed:
        asyncio.run(router.refresh_instances())  # as the refresh loop does at start-up
    return Harness(router, predictor, estimator, store, exporter, registry, clock)


def route(harness: Harness, prompt: str | None = "Summarize the report.", *, slo_ms: float = 500.0,
          prompt_tokens: int | None = None, **fields: object) -> RouteResult:
    query = RouteQuery(  # no request_id: the router makes one up
        str(fields.pop("request_id", "")), prompt, prompt_tokens, slo_ms, **fields)  # type: ignore[arg-type]

    async def route_and_record() -> RouteResult:
        result = await harness.router.route(query)
        await harness.router.flush()
        return result

    return asyncio.run(route_and_record())


def candidate_of(result: RouteResult, instance_id: str):  # noqa: ANN201 - CandidateView
    return next(c for c in result.candidates if c.instance_id == instance_id)


INF = math.inf
