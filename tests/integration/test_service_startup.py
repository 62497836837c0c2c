"""A service that cannot listen (`bear.common.service`): a host that is not local, a gRPC port in use (even by another
BEAR server: gRPC's SO_REUSEPORT is off, so the two never share its calls), a /metrics port in use. In process,
ServiceStartError names the flag and the address; from `bear serve`, exit status 2 with that message, no traceback,
and no second server answering on the port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bear.common.service import RunningServer, ServerSettings, ServiceStartError, start_server
from bear.predictor.catalog import PAPER_POOL
from bear.predictor.synthetic_corpus import generate
from bear.predictor.training import TrainingConfig, train
from tests.served import BEAR
from tests.service_loop import LoopThread

UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"  # the services must fail at their port, before Redis matters


def _nothing(server: grpc.aio.Server) -> list[str]:
    return []


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def running(loop: LoopThread) -> Iterator[RunningServer]:
    """A BEAR server holding a loopback port."""
    server = loop.run(start_server(ServerSettings("bear-test", "127.0.0.1", 0, None, 0.5), _nothing))
    yield server
    loop.run(server.stop())


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port a plain socket listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("predictor") / "artifact"
    train(generate(450, seed=1).table, PAPER_POOL, TrainingConfig(num_trees=10)).save(folder)
    return folder


def test_a_host_that_is_not_known_names_host(loop: LoopThread) -> None:
    with pytest.raises(ServiceStartError, match="bear serve test: --host bad_host: cannot listen on bad_host:0"):
        loop.run(start_server(ServerSettings("bear-test", "bad_host", 0, None), _nothing))


def test_a_host_with_an_undecodable_byte_names_host(loop: LoopThread) -> None:
    # a byte of the command line that is not UTF-8 (a lone surrogate in Python); gRPC's error named no flag
    with pytest.raises(ServiceStartError, match=r"bear serve test: --host 'h\\udcff' is not UTF-8 text"):
        loop.run(start_server(ServerSettings("bear-test", "h\udcff", 0, None), _nothing))


def test_an_ipv6_host_without_brackets_is_told_to_use_them(loop: LoopThread) -> None:
    with pytest.raises(ServiceStartError, match=r"--host ::1: cannot listen on ::1:0: write an IPv6 address in "
                                                r"brackets, e\.g\. \[::1\]"):
        loop.run(start_server(ServerSettings("bear-test", "::1", 0, None), _nothing))


def test_metrics_listen_on_the_services_host_only() -> None:
    from bear.common.service import start_metrics

    port = start_metrics(0, "127.0.0.1")
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    with socket.socket() as other:  # another loopback address: free, as /metrics is not on every address
        other.bind(("127.0.0.2", port))


def test_a_second_server_on_the_port_of_a_running_one_is_refused(loop: LoopThread, running: RunningServer) -> None:
    with pytest.raises(ServiceStartError, match=f"--grpc-port {running.port}: cannot listen on "
                                                f"127.0.0.1:{running.port}: Address already in use"):
        loop.run(start_server(ServerSettings("bear-test", "127.0.0.1", running.port, None), _nothing))
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:  # the first one still serves
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _serve(service: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BEAR, "serve", service, *flags], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "BEAR_REDIS_URL": UNREACHABLE_REDIS})


def _service_flags(service: str, artifact_dir: Path) -> list[str]:
    return ["--model-dir", str(artifact_dir)] if service == "predictor" else []


def _assert_refused(completed: subprocess.CompletedProcess[str], service: str, message: str) -> None:
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert f"bear serve {service}: {message}" in completed.stderr, completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr and "Event loop is closed" not in completed.stderr
    assert "grpc_port=" not in completed.stdout


@pytest.mark.parametrize("service", ["predictor", "estimator", "router"])
def test_bear_serve_refuses_a_bad_host(service: str, artifact_dir: Path) -> None:
    completed = _serve(service, *_service_flags(service, artifact_dir), "--host", "bad_host", "--grpc-port", "0",
                       "--metrics-port", "off")
    # named by flag and variable: the value may have come from either, or the config file (QA)
    _assert_refused(completed, service, f"--host (BEAR_{service.upper()}_HOST) bad_host: cannot listen on bad_host:0")


@pytest.mark.parametrize("service", ["predictor", "estimator", "router"])
def test_bear_serve_refuses_a_metrics_port_in_use(service: str, artifact_dir: Path, taken_port: int) -> None:
    completed = _serve(service, *_service_flags(service, artifact_dir), "--host", "127.0.0.1", "--grpc-port", "0",
                       "--metrics-port", str(taken_port))
    _assert_refused(completed, service, f"--metrics-port (BEAR_{service.upper()}_METRICS_PORT) {taken_port}: cannot "
                                        f"serve /metrics on port {taken_port}")


@pytest.mark.parametrize("service", ["predictor", "estimator"])
def test_bear_serve_refuses_the_port_of_a_running_bear_server(service: str, artifact_dir: Path,
                                                              running: RunningServer) -> None:
    completed = _serve(service, *_service_flags(service, artifact_dir), "--host", "127.0.0.1", "--grpc-port",
                       str(running.port), "--metrics-port", "off")
    _assert_refused(completed, service, f"--grpc-port (BEAR_{service.upper()}_GRPC_PORT) {running.port}: cannot "
                                        f"listen on 127.0.0.1:{running.port}")


@pytest.mark.parametrize("service", ["estimator", "router"])
@pytest.mark.parametrize(("content", "message"), [("pools: [", "is not YAML"), (None, "pools file"),
                                                  (b"\xff\xfe\x00bad", "is not UTF-8 text")],
                         ids=["not-yaml", "missing", "not-utf8"])
def test_bear_serve_refuses_a_bad_pools_file(service: str, content: str | bytes | None, message: str,
                                             tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    if isinstance(content, bytes):
        pools.write_bytes(content)
    elif content is not None:
        pools.write_text(content)
    completed = _serve(service, "--pools-file", str(pools), "--host", "127.0.0.1", "--grpc-port", "0",
                       "--metrics-port", "off")
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert completed.stderr.count(f"bear serve {service}: ") == 1 and message in completed.stderr
    assert "Traceback" not in completed.stderr


@pytest.mark.parametrize("service", ["estimator", "router"])
def test_bear_serve_refuses_kubernetes_discovery_without_credentials(service: str, tmp_path: Path) -> None:
    """As the router, the estimator does not serve on without the discovery its settings ask for."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("BEAR_", "KUBERNETES_"))}
    completed = subprocess.run([BEAR, "serve", service, "--grpc-port", "0", "--metrics-port", "off"],
                               capture_output=True, text=True, timeout=120,
                               env={**environ, "BEAR_DISCOVERY": "kubernetes", "BEAR_REDIS_URL": UNREACHABLE_REDIS,
                                    "KUBECONFIG": str(tmp_path / "no-kubeconfig"), "HOME": str(tmp_path)})
    _assert_refused(completed, service, "BEAR_DISCOVERY=kubernetes: discovery cannot start (ConfigException")


@pytest.mark.parametrize("url", ["redis://localhost:99999/0", "redis://:::bad"])
@pytest.mark.parametrize("service", ["estimator", "router", "snapshotter"])
def test_bear_serve_refuses_a_redis_url_with_a_bad_port_naming_the_setting(service: str, url: str,
                                                                          tmp_path: Path) -> None:
    flags = ["--region", str(tmp_path / "r"), "--instance-id", "i-0"] if service == "snapshotter" else []
    completed = _serve(service, *flags, "--redis-url", url, "--grpc-port", "0", "--metrics-port", "off")
    prefix = "bear snapshotter" if service == "snapshotter" else f"bear serve {service}"
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert f"{prefix}: BEAR_REDIS_URL (--redis-url): the port must be a number in 1-65535" in completed.stderr
    assert "Traceback" not in completed.stderr and "grpc_port=" not in completed.stdout


def test_the_snapshotter_refuses_an_infinite_poll_interval_before_it_starts(tmp_path: Path) -> None:
    completed = _serve("snapshotter", "--region", str(tmp_path / "r"), "--instance-id", "i-0", "--grpc-port", "0",
                       "--metrics-port", "off", "--poll-interval-ms", "inf")
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert "bear snapshotter: BEAR_SNAPSHOTTER_POLL_INTERVAL_MS (--poll-interval-ms) must be" in completed.stderr
    assert "Traceback" not in completed.stderr and "grpc_port=" not in completed.stdout


def test_bear_serve_estimator_refuses_a_directory_that_is_no_predictor_artifact(tmp_path: Path) -> None:
    completed = _serve("estimator", "--predictor-model-dir", str(tmp_path), "--grpc-port", "0", "--metrics-port", "off")
    _assert_refused(completed, "estimator", f"--predictor-model-dir: {tmp_path}: not a predictor artifact")


def test_the_snapshotter_refuses_a_taken_grpc_or_metrics_port(running: RunningServer, taken_port: int,
                                                              tmp_path: Path) -> None:
    region = ["--region", str(tmp_path / "no-engine-yet"), "--instance-id", "i-0"]  # the sidecar waits for it
    for flags, message in ((["--grpc-port", str(running.port), "--metrics-port", "off"],
                            f"--grpc-port {running.port}: cannot listen on "),
                           (["--grpc-port", "0", "--metrics-port", str(taken_port)],
                            f"--metrics-port {taken_port}: cannot serve /metrics on port {taken_port}")):
        completed = _serve("snapshotter", *region, *flags)
        assert completed.returncode == 2, completed.stderr[-3000:]
        assert f"bear snapshotter: {message}" in completed.stderr and "Traceback" not in completed.stderr


def test_the_snapshotter_refuses_a_folder_as_its_region_and_an_endpoint_that_is_no_url(tmp_path: Path) -> None:
    folder = _serve("snapshotter", "--region", str(tmp_path), "--instance-id", "i-0", "--grpc-port", "0",
                    "--metrics-port", "off")
    assert folder.returncode == 2 and f"--region {tmp_path}: {tmp_path} is a folder" in folder.stderr
    endpoint = _serve("snapshotter", "--region", str(tmp_path / "r"), "--instance-id", "i-0", "--endpoint", "not a url")
    assert endpoint.returncode == 2 and "BEAR_INSTANCE_ENDPOINT (--endpoint) must be" in endpoint.stderr
    assert "Traceback" not in folder.stderr + endpoint.stderr


@pytest.mark.parametrize("service", ["predictor", "estimator", "router", "snapshotter"])
def test_otel_settings_the_sdk_would_fail_on_are_ignored_and_the_service_serves(service: str, artifact_dir: Path,
                                                                               tmp_path: Path) -> None:
    """(QA: OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT=abc stopped every service at start with a traceback, OTEL_SDK_DISABLED or
    not, as did a negative limit or a propagator not installed.)"""
    if service == "snapshotter":
        command = [BEAR, "snapshotter", "--instance-id", "otel-probe", "--region", str(tmp_path / "region")]
    else:
        command = [BEAR, "serve", service, *_service_flags(service, artifact_dir), "--host", "127.0.0.1"]
    environ = {**os.environ, "BEAR_REDIS_URL": UNREACHABLE_REDIS, "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "abc",
               "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "-1", "OTEL_PROPAGATORS": "b3,no-such-propagator"}
    process = subprocess.Popen([*command, "--grpc-port", "0", "--metrics-port", "off"], env=environ,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
    finally:
        process.terminate()
        _, errors = process.communicate(timeout=30)
    assert first.startswith("grpc_port="), errors[-3000:]
    assert "Traceback" not in errors
    assert "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT='abc' is not a non-negative integer" in errors
    assert "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT='-1' is not a non-negative integer" in errors
    assert "OTEL_PROPAGATORS names 'no-such-propagator', not an installed propagator" in errors
    assert "propagating with b3" in errors


@pytest.mark.parametrize("service", ["router", "estimator"])
def test_sigterm_while_a_service_starts_its_embedded_redis_stops_both(service: str, tmp_path: Path) -> None:
    """SIGTERM as soon as the embedded Redis's server runs, while the service is still starting (before it serves and
    its own handler takes SIGTERM over): the service exits 0 and the Redis is gone. With the signal's default action
    the service died there and left the Redis running for good."""
    env = {name: value for name, value in os.environ.items() if name != "BEAR_REDIS_URL"}
    env["BEAR_REDIS_EMBEDDED_PATH"] = str(tmp_path / "redis.db")
    process = subprocess.Popen([BEAR, "serve", service, "--host", "127.0.0.1", "--grpc-port", "0",
                               "--metrics-port", "off"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
    redis_servers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not redis_servers and process.poll() is None and time.monotonic() < deadline:
            redis_servers = [p for p in psutil.process_iter(["name"])
                             if "redis-server" in (p.info["name"] or "") and _cwd(p) == str(tmp_path)]
            time.sleep(0.002)
        assert redis_servers, "the embedded Redis never started"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
        _, alive = psutil.wait_procs(redis_servers, timeout=15)
        assert not alive, f"the embedded Redis outlived the {service}"
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        for server in redis_servers:
            with contextlib.suppress(psutil.Error):
                server.kill()


def _cwd(process: psutil.Process) -> str | None:
    try:
        return process.cwd()
    except psutil.Error:
        return None
