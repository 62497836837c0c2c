"""`bear serve router` as a process, configured the way the Helm chart configures it (environment and flags): its
spans reach an OTLP receiver built on opentelemetry-proto's TraceService (a real gRPC server), its /metrics are
scraped over HTTP, OTEL_SDK_DISABLED turns tracing off, and SIGTERM stops it cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import redis
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from bear.router.client import RouterClient
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
from tests.router_stack import wait_until


@dataclass
class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that keeps what it is sent."""

    spans: list[tuple[dict[str, object], trace_pb2.Span]] = field(default_factory=list)  # (resource, span)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,  # noqa: N802 - the proto's name
               context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((resource, span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def named(self, name: str) -> list[tuple[dict[str, object], trace_pb2.Span]]:
        with self.lock:
            return [(r, s) for r, s in self.spans if s.name == name]


def attributes(values) -> dict[str, object]:  # noqa: ANN001 - repeated KeyValue
    out: dict[str, object] = {}
    for kv in values:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


@pytest.fixture
def receiver() -> Iterator[tuple[OtlpReceiver, int]]:
    servicer = OtlpReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(None).wait()


class Neighbours:
    """Redis, the fake predictor and estimator, and three registered instances."""

    def __init__(self) -> None:
        self.redis_server = RedisServer()
        self.redis_server.start()
        self.loop = LoopThread()
        self.predictor, self.estimator = FakePredictor(), FakeEstimator(
            {i.instance_id: InstanceState(ttft_ms=100.0 * (k + 1)) for k, i in enumerate(THREE_INSTANCES)})
        self.predictor_server, self.estimator_server = start_fakes(self.loop, self.predictor, self.estimator)
        with redis.Redis.from_url(self.redis_server.url) as client:
            register_instances(client, THREE_INSTANCES)

    def close(self) -> None:
        self.predictor_server.kill()
        self.estimator_server.kill()
        self.loop.close()
        self.redis_server.stop()


@pytest.fixture
def neighbours() -> Iterator[Neighbours]:
    neighbours = Neighbours()
    yield neighbours
    neighbours.close()


class RouterProcess:
    def __init__(self, neighbours: Neighbours, tmp_path: Path, **otel: str) -> None:
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "BEAR_"))}
        environ.update({
            "BEAR_ESTIMATOR_ADDRESS": neighbours.estimator_server.address,
            "BEAR_PREDICTOR_ADDRESS": neighbours.predictor_server.address,
            "BEAR_DEFAULT_POLICY": "bear",
            "BEAR_REDIS_URL": neighbours.redis_server.url,
            "OTEL_SERVICE_NAME": "bear-router",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            **otel,
        })
        self.log = (tmp_path / "router.log").open("w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bear.cli.main", "serve", "router", "--grpc-port=0", "--metrics-port=0",
             "--host=127.0.0.1"], env=environ, stdout=subprocess.PIPE, stderr=self.log, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("grpc_port="), f"the router did not start: {line!r} {self.logs()}"
        ports = dict(part.split("=") for part in line.split())
        self.grpc_port, self.metrics_port = int(ports["grpc_port"]), int(ports["metrics_port"])
        self.client = RouterClient(f"127.0.0.1:{self.grpc_port}", timeout_s=5.0)

    def logs(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> int:
        self.client.close()
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(15)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(5)
            assert self.process.stdout is not None
            self.process.stdout.close()
            self.log.close()


def test_spans_reach_an_otlp_receiver_and_metrics_are_served(neighbours: Neighbours, tmp_path: Path,
                                                             receiver: tuple[OtlpReceiver, int]) -> None:
    otlp, port = receiver
    router = RouterProcess(neighbours, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                           OTEL_RESOURCE_ATTRIBUTES="k8s.pod.name=router-0")
    try:
        decision = router.client.route("Summarize the audit report in about 200 words.", ttft_slo_ms=250.0,
                                       request_id="otlp-1")
        assert decision.instance_id == "medium-0"
        router.client.report_outcome("otlp-1", observed_ttft_ms=230.0)
        resource, route = wait_until(lambda: next(
            ((r, s) for r, s in otlp.named("bear.route") if attributes(s.attributes)["bear.request_id"] == "otlp-1"),
            None))
        assert resource["service.name"] == "bear-router" and resource["k8s.pod.name"] == "router-0"
        route_attributes = attributes(route.attributes)
        assert route_attributes["bear.instance_id"] == "medium-0" and route_attributes["bear.ttft_slo_ms"] == 250.0
        assert route_attributes["bear.policy"] == "bear" and route_attributes["bear.prompt_tokens"] > 0
        candidates = [attributes(e.attributes) for e in route.events if e.name == "bear.candidate"]
        assert {c["bear.instance_id"] for c in candidates} == {"small-0", "medium-0", "large-0"}
        assert all({"bear.predicted_ttft_ms", "bear.utility", "bear.feasible"} <= set(c) for c in candidates)
        def children() -> set[str]:
            return {s.name for _, s in otlp.spans if s.trace_id == route.trace_id and s.parent_span_id == route.span_id}

        # All four, which may come in more than one export batch (on a loaded machine, bear.record came later)
        expected = {"bear.predict", "bear.estimate", "bear.choose", "bear.record"}
        wait_until(lambda: expected <= children())
        # The trace continued into the neighbours: they received its context.
        assert neighbours.predictor.metadata[-1]["traceparent"].split("-")[1] == route.trace_id.hex()

        with urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        assert 'bear_router_decision_seconds_count{policy="bear"} 1.0' in text
        assert 'bear_router_routes_total{instance="medium-0",model="Qwen3-8B",policy="bear"} 1.0' in text
        assert 'bear_router_ttft_abs_error_seconds_count{instance="medium-0"} 1.0' in text
    finally:
        assert router.stop() == 0, router.logs()


def test_otel_sdk_disabled_turns_tracing_off(neighbours: Neighbours, tmp_path: Path,
                                             receiver: tuple[OtlpReceiver, int]) -> None:
    otlp, port = receiver
    router = RouterProcess(neighbours, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                           OTEL_SDK_DISABLED="true")
    try:
        for _ in range(5):
            assert router.client.route("Summarize.", ttft_slo_ms=250.0).instance_id
        time.sleep(0.5)  # several export intervals
        assert otlp.spans == []
        assert "traceparent" not in neighbours.predictor.metadata[-1]
    finally:
        assert router.stop() == 0, router.logs()


def test_bad_settings_exit_with_status_2(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "bear.cli.main", "serve", "router", "--default-policy=fastest"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "BEAR_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert result.returncode == 2 and "BEAR_DEFAULT_POLICY: unknown policy 'fastest'" in result.stderr


def test_kubernetes_discovery_without_credentials_exits_with_status_2(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("BEAR_", "KUBERNETES_"))}
    result = subprocess.run([sys.executable, "-m", "bear.cli.main", "serve", "router", "--grpc-port=0",
                             "--metrics-port=off"], capture_output=True, text=True, timeout=60,
                            env={**environ, "BEAR_DISCOVERY": "kubernetes", "BEAR_REDIS_URL": "redis://127.0.0.1:1/0",
                                 "KUBECONFIG": str(tmp_path / "no-kubeconfig"), "HOME": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert "BEAR_DISCOVERY=kubernetes: discovery cannot start" in result.stderr and "Traceback" not in result.stderr


def test_a_traces_endpoint_alone_sends_spans_named_by_the_resource_attributes(
        neighbours: Neighbours, tmp_path: Path, receiver: tuple[OtlpReceiver, int]) -> None:
    otlp, port = receiver
    router = RouterProcess(neighbours, tmp_path, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://127.0.0.1:{port}",
                           OTEL_SERVICE_NAME="", OTEL_RESOURCE_ATTRIBUTES="service.name=edge-router")
    try:
        router.client.route("Summarize.", ttft_slo_ms=250.0, request_id="traces-endpoint-1")
        resource, _ = wait_until(lambda: next(iter(otlp.named("bear.route")), None))
        assert resource["service.name"] == "edge-router"
    finally:
        assert router.stop() == 0, router.logs()


def test_a_collector_that_never_answers_holds_the_exit_for_seconds_not_the_exporters_retries(
        neighbours: Neighbours, tmp_path: Path) -> None:
    """The SDK's own exit waits for each queued batch's 10 s export deadline and retries (20–30 s here, the chart's
    whole termination grace period); BEAR gives the queued spans TRACING_FLUSH_S."""
    hole = socket.create_server(("127.0.0.1", 0))  # accepts connections (the kernel's backlog), never answers
    try:
        router = RouterProcess(neighbours, tmp_path,
                               OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{hole.getsockname()[1]}")
        try:
            for k in range(50):
                router.client.route("Summarize.", ttft_slo_ms=250.0, request_id=f"hung-collector-{k}")
            time.sleep(0.5)  # an export under way, more batches queued
            started = time.monotonic()
            assert router.stop() == 0, router.logs()
            assert time.monotonic() - started < 10.0
        finally:
            if router.process.poll() is None:
                router.process.kill()
    finally:
        hole.close()


def test_an_otlp_setting_the_exporter_refuses_leaves_the_router_serving_untraced(neighbours: Neighbours,
                                                                                tmp_path: Path) -> None:
    router = RouterProcess(neighbours, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT="http://[::1")
    try:
        assert router.client.route("Summarize.", ttft_slo_ms=250.0).instance_id
        (line,) = [line for line in router.logs().splitlines() if "the otlp exporter cannot be configured" in line]
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" in line and "Invalid IPv6 URL" in line
    finally:
        assert router.stop() == 0, router.logs()
