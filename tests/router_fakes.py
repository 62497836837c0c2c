"""Stand-ins for the router's neighbours in integration tests: small Estimator and Predictor gRPC servicers (real
gRPC, on port 0, that can be told to fail, hang or die), an event loop in a thread to host servers, and writers of
what snapshotters put in Redis (registrations, snapshots)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import redis
import yaml

from bear.common import redis_keys
from bear.common.call_streams import CallFailed, CallStreamServer, answer_unary
from bear.v1 import (
    estimator_pb2,
    estimator_pb2_grpc,
    predictor_pb2,
    predictor_pb2_grpc,
    snapshot_pb2,
)

T = TypeVar("T")


class LoopThread:
    """An asyncio loop running in a daemon thread: `run(coro)` waits for the coroutine's result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass
class ModelSpec:
    accuracy: float
    output_tokens: float
    input_usd_per_mtok: float = 0.1
    output_usd_per_mtok: float = 0.2


PAPER_MODELS = {
    "Qwen3-0.6B": ModelSpec(0.55, 300, 0.044, 0.173),
    "Qwen3-8B": ModelSpec(0.75, 350, 0.072, 0.287),
    "Qwen3-32B": ModelSpec(0.85, 400, 0.287, 0.640),
}


@dataclass
class Behaviour:
    """How a fake answers: normally, with an error, or after a delay."""

    fail: grpc.StatusCode | None = None
    delay_s: float = 0.0


@dataclass
class FakePredictor(predictor_pb2_grpc.PredictorServicer):
    models: dict[str, ModelSpec] = field(default_factory=lambda: dict(PAPER_MODELS))
    behaviour: Behaviour = field(default_factory=Behaviour)
    requests: list[predictor_pb2.PredictRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)

    async def Predict(self, request: predictor_pb2.PredictRequest,  # noqa: N802 - the proto's name
                      context: grpc.aio.ServicerContext) -> predictor_pb2.PredictResponse:
        self.metadata.append({k: v for k, v in context.invocation_metadata() or ()})
        return await answer_unary(self._answer(request), context)

    async def PredictStream(self, calls: Any, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        streams = CallStreamServer(self._answer, predictor_pb2.PredictResult, "/bear.v1.Predictor/PredictStream")
        await streams.serve(_noting_context(calls, self.metadata), context)

    async def _answer(self, request: predictor_pb2.PredictRequest) -> predictor_pb2.PredictResponse:
        self.requests.append(request)
        await _behave(self.behaviour)
        tokens = max(1, len(request.prompt.split()))
        return predictor_pb2.PredictResponse(predictions=[
            predictor_pb2.ModelPrediction(
                model=name, accuracy=spec.accuracy, output_tokens=spec.output_tokens, prompt_tokens=tokens,
                cost_micro_usd=tokens * spec.input_usd_per_mtok + spec.output_tokens * spec.output_usd_per_mtok,
                input_usd_per_mtok=spec.input_usd_per_mtok, output_usd_per_mtok=spec.output_usd_per_mtok)
            for name, spec in self.models.items() if not request.models or name in request.models])


@dataclass
class InstanceState:
    """What the fake estimator says of one instance."""

    ttft_ms: float = 100.0
    method: int = estimator_pb2.ESTIMATE_METHOD_REPLAY
    feasible: bool = True
    known: bool = True
    num_running: int = 0
    num_waiting: int = 0
    snapshot_age_ms: float = 5.0
    pending_decode_tokens: float = 0.0
    reason: str = ""


@dataclass
class FakeEstimator(estimator_pb2_grpc.EstimatorServicer):
    instances: dict[str, InstanceState] = field(default_factory=dict)
    behaviour: Behaviour = field(default_factory=Behaviour)
    requests: list[estimator_pb2.EstimateRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)

    async def Estimate(self, request: estimator_pb2.EstimateRequest,  # noqa: N802 - the proto's name
                       context: grpc.aio.ServicerContext) -> estimator_pb2.EstimateResponse:
        self.metadata.append({k: v for k, v in context.invocation_metadata() or ()})
        return await answer_unary(self._answer(request), context)

    async def EstimateStream(self, calls: Any, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        streams = CallStreamServer(self._answer, estimator_pb2.EstimateResult, "/bear.v1.Estimator/EstimateStream")
        await streams.serve(_noting_context(calls, self.metadata), context)

    async def _answer(self, request: estimator_pb2.EstimateRequest) -> estimator_pb2.EstimateResponse:
        self.requests.append(request)
        await _behave(self.behaviour)
        out = []
        for instance_id in request.instance_ids:
            state = self.instances.get(instance_id)
            if state is None:
                out.append(estimator_pb2.InstanceEstimate(instance_id=instance_id,
                                                          method=estimator_pb2.ESTIMATE_METHOD_NONE,
                                                          reason="no snapshot"))
                continue
            out.append(estimator_pb2.InstanceEstimate(
                instance_id=instance_id, method=state.method, known=state.known, feasible=state.feasible,
                ttft_ms=state.ttft_ms, snapshot_age_ms=state.snapshot_age_ms, num_batches=3, reason=state.reason,
                num_running=state.num_running, num_waiting=state.num_waiting,
                pending_decode_tokens=state.pending_decode_tokens))
        return estimator_pb2.EstimateResponse(estimates=out)


async def _behave(behaviour: Behaviour) -> None:
    if behaviour.delay_s:
        await asyncio.sleep(behaviour.delay_s)
    if behaviour.fail is not None:
        raise CallFailed(behaviour.fail, "told to fail")


async def _noting_context(calls: Any, metadata: list[dict[str, str]]) -> Any:
    """The calls of a stream, each call's trace context noted as a unary call's metadata would be."""
    async for call in calls:
        metadata.append(dict(call.trace_context))
        yield call


class FakeServer:
    """One fake servicer on a real gRPC server; `kill()` stops it and `revive()` brings it back on the same port."""

    def __init__(self, loop: LoopThread, add: Callable[[grpc.aio.Server], None]) -> None:
        self._loop, self._add = loop, add
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self.revive()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def revive(self) -> None:
        async def start() -> tuple[grpc.aio.Server, int]:
            server = grpc.aio.server()
            self._add(server)
            port = server.add_insecure_port(f"127.0.0.1:{self.port}")
            await server.start()
            return server, port

        self._server, self.port = self._loop.run(start())

    def kill(self) -> None:
        if self._server is not None:
            self._loop.run(self._server.stop(None))
            self._server = None


def start_fakes(loop: LoopThread, predictor: FakePredictor, estimator: FakeEstimator) -> tuple[FakeServer,
                                                                                               FakeServer]:
    return (FakeServer(loop, lambda s: predictor_pb2_grpc.add_PredictorServicer_to_server(predictor, s)),
            FakeServer(loop, lambda s: estimator_pb2_grpc.add_EstimatorServicer_to_server(estimator, s)))


# What snapshotters put in Redis -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PoolInstance:
    instance_id: str
    pool: str
    model: str
    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0

    @property
    def endpoint(self) -> str:
        return f"http://{self.instance_id}.test:8000"


THREE_INSTANCES = (
    PoolInstance("small-0", "small", "Qwen3-0.6B", 0.044, 0.173),
    PoolInstance("medium-0", "medium", "Qwen3-8B", 0.072, 0.287),
    PoolInstance("large-0", "large", "Qwen3-32B", 0.287, 0.640),
)


def register_instances(client: redis.Redis, instances: Iterable[PoolInstance], ttl_s: float = 60.0) -> None:
    now = time.time()
    for i in instances:
        registration = snapshot_pb2.InstanceRegistration(
            instance_id=i.instance_id, pool=i.pool, model=i.model, endpoint=i.endpoint,
            input_usd_per_million_tokens=i.input_usd_per_mtok, output_usd_per_million_tokens=i.output_usd_per_mtok,
            registered_at_s=now)
        client.set(redis_keys.instance_key(i.instance_id), registration.SerializeToString(), px=int(ttl_s * 1000))
        client.zadd(redis_keys.INSTANCES, {i.instance_id: now})


def put_snapshot(client: redis.Redis, instance_id: str, *, running: int = 0, waiting: int = 0,
                 taken_at_s: float | None = None, model: str = "") -> None:
    taken = time.time() if taken_at_s is None else taken_at_s
    snapshot = snapshot_pb2.InstanceSnapshot(
        instance_id=instance_id, model=model, taken_at_s=taken, read_at_s=taken,
        running=[snapshot_pb2.RequestState(request_id=f"r{k}", num_prompt_tokens=10) for k in range(running)],
        waiting=[snapshot_pb2.RequestState(request_id=f"w{k}", num_prompt_tokens=10) for k in range(waiting)])
    client.set(redis_keys.snapshot_key(instance_id), snapshot.SerializeToString())


def write_pools_file(path: Path, instances: Iterable[PoolInstance], prices: Mapping[str, tuple[float, float]] = {}
                     ) -> Path:  # noqa: B006 - read only
    pools: dict[str, dict[str, Any]] = {}
    for i in instances:
        pool = pools.setdefault(i.pool, {"name": i.pool, "model": i.model, "instances": []})
        if i.pool in prices:
            pool["input_usd_per_mtok"], pool["output_usd_per_mtok"] = prices[i.pool]
        pool["instances"].append({"id": i.instance_id, "endpoint": i.endpoint})
    path.write_text(yaml.safe_dump({"pools": list(pools.values())}))
    return path
