"""A router on a real gRPC server (port 0) with a real redis-server and fake (or real) neighbours, for integration
tests: `RouterStack(tmp_path)` starts it all; `stack.client` calls it; `stack.close()` ends it. Also an open-loop load
generator and the process-wide in-memory span exporter."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from bear.common.redis_config import RedisConfig
from bear.router import main
from bear.router.client import AsyncRouterClient, RouterClient, RouterError
from bear.router.config import RouterConfig
from bear.v1 import router_pb2
from tests.redis_server import RedisServer
from tests.router_fakes import (
    THREE_INSTANCES,
    FakeEstimator,
    FakePredictor,
    InstanceState,
    LoopThread,
    register_instances,
    start_fakes,
)


@functools.cache
def span_exporter() -> InMemorySpanExporter:
    """Spans of every tracer of this process (the router's and the gRPC instrumentation's), from now on."""
    from bear.common.service import configure_tracing

    exporter = InMemorySpanExporter()
    configure_tracing("bear-tests", environ={}, extra_processors=[SimpleSpanProcessor(exporter)])
    return exporter


class RouterStack:
    def __init__(self, tmp_path: Path, *, register: bool = True, **settings: object) -> None:
        self.tmp_path = tmp_path
        self.loop = LoopThread()  # the router's
        self.neighbours_loop = LoopThread()  # the fakes', as if in processes of their own
        self.redis_server = RedisServer()
        self.redis_server.start()
        self.redis = redis.Redis.from_url(self.redis_server.url)
        self.predictor = FakePredictor()
        self.estimator = FakeEstimator({i.instance_id: InstanceState(ttft_ms=100.0 * (k + 1), num_running=k)
                                        for k, i in enumerate(THREE_INSTANCES)})
        self.predictor_server, self.estimator_server = start_fakes(self.neighbours_loop, self.predictor,
                                                                         self.estimator)
        if register:
            register_instances(self.redis, THREE_INSTANCES)
        self.registry = CollectorRegistry()
        self.config = dataclasses.replace(RouterConfig(
            host="127.0.0.1", grpc_port=0, metrics_port=None, predictor_address=self.predictor_server.address,
            estimator_address=self.estimator_server.address, redis=RedisConfig(url=self.redis_server.url),
            tokenizer="pretokens", refresh_interval_s=0.2,
            # 500 ms, not the defaults (100, Redis 50): a loaded CI machine can stall a test process that long, and
            # these tests are about what fails, not about the deadline (those that are read it from stack.config).
            # A Redis call past its deadline leaves Redis alone for 0.5 s: the estimator-killed test once had its
            # fallback's snapshot queues lost that way and decided round-robin.
            predictor_timeout_s=0.5, estimator_timeout_s=0.5, redis_timeout_s=0.5), **settings)
        self.running = self.loop.run(main.start(self.config, self.registry))
        self.address = f"127.0.0.1:{self.running.port}"
        self.client = RouterClient(self.address, timeout_s=5.0)

    def route(self, prompt: str = "Summarize the audit report in about 200 words.", ttft_slo_ms: float = 250.0,
              **fields: object) -> router_pb2.RouteDecision:
        return self.client.route(prompt, ttft_slo_ms=ttft_slo_ms, **fields)  # type: ignore[arg-type]

    def flush(self) -> None:
        """Waits until the dispatches routed so far are in Redis."""
        self.loop.run(self.running.router.flush())

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def close(self) -> None:
        self.client.close()
        self.loop.run(self.running.stop())
        for server in (self.predictor_server, self.estimator_server):
            server.kill()
        self.loop.close()
        self.neighbours_loop.close()
        self.redis.close()
        self.redis_server.stop()


@dataclass
class LoadResult:
    decisions: list[router_pb2.RouteDecision] = field(default_factory=list)
    sent_at_s: list[float] = field(default_factory=list)  # each decision's call, when it started (perf_counter)
    errors: list[RouterError] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)


class Load:
    """`count` Route calls at `rate_rps` (open loop) from a thread of its own; `sent` tells how far it is."""

    def __init__(self, address: str, count: int, rate_rps: float,
                 make_prompt: Callable[[int], str] = lambda k: f"question {k}: summarize the report") -> None:
        self.result = LoadResult()
        self.sent = 0
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run(address, count, rate_rps, make_prompt)),
                                        daemon=True)
        self._thread.start()

    async def _run(self, address: str, count: int, rate_rps: float, make_prompt: Callable[[int], str]) -> None:
        async with AsyncRouterClient(address, timeout_s=5.0) as client:
            started = time.perf_counter()
            tasks = []
            for k in range(count):
                await asyncio.sleep(max(0.0, started + k / rate_rps - time.perf_counter()))
                tasks.append(asyncio.create_task(self._one(client, make_prompt(k))))
                self.sent = k + 1
            await asyncio.gather(*tasks)

    async def _one(self, client: AsyncRouterClient, prompt: str) -> None:
        started = time.perf_counter()
        try:
            decision = await client.route(prompt, ttft_slo_ms=500.0)
            self.result.decisions.append(decision)
            self.result.sent_at_s.append(started)
        except RouterError as error:
            self.result.errors.append(error)
        self.result.latencies_ms.append((time.perf_counter() - started) * 1000)

    def wait_until_sent(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.sent < count:
            assert time.monotonic() < deadline, "the load generator fell behind"
            time.sleep(0.005)

    def join(self, timeout_s: float = 60.0) -> LoadResult:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the load did not finish"
        return self.result


def wait_until(condition: Callable[[], object], timeout_s: float = 10.0) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
