"""The router with the predictor and the estimator in its own process (BEAR_ROUTER_IN_PROCESS) and a real
redis-server holding three instances' registrations and live snapshots: Route end to end by replay, the dispatches
reaching the in-process estimator, stale snapshots, Redis restarted under load, settings it cannot use, and
`bear serve router --in-process ...` as a process, stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from bear.common.redis_config import RedisConfig
from bear.router import main
from bear.router.client import RouterClient
from bear.router.config import RouterConfig
from tests.integration.test_router_with_services import (
    Snapshotters,
    a_stale_snapshot_is_estimated_otherwise,
    dispatches_count_ahead,
    routes_end_to_end,
    wait_for_replay,
)
from tests.redis_server import RedisServer
from tests.router_fakes import THREE_INSTANCES, LoopThread, register_instances
from tests.router_stack import Load

BOTH = frozenset({"predictor", "estimator"})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.predictor_builders import trained_artifact

    folder = tmp_path_factory.mktemp("in-process") / "predictor"
    trained_artifact().save(folder)
    return folder


class Deployment:
    def __init__(self, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.redis_server = RedisServer()
        self.redis_server.start()
        self.redis = redis.Redis.from_url(self.redis_server.url)
        register_instances(self.redis, THREE_INSTANCES, ttl_s=600)
        self.snapshotters = Snapshotters(self.redis)
        for name in [n for n in os.environ if n.startswith("BEAR_")]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("BEAR_PREDICTOR_MODEL_DIR", str(model_dir))
        self.loop = LoopThread()
        config = RouterConfig(host="127.0.0.1", grpc_port=0, metrics_port=None, in_process=BOTH,
                              redis=RedisConfig(url=self.redis_server.url), estimator_timeout_s=0.5,
                              predictor_timeout_s=0.5, redis_timeout_s=0.5,
                              # Neither address is called: nothing listens there.
                              estimator_address="127.0.0.1:1", predictor_address="127.0.0.1:1")
        self.router = self.loop.run(main.start(config, CollectorRegistry()))
        self.client = RouterClient(f"127.0.0.1:{self.router.port}", timeout_s=5.0)
        wait_for_replay(self.client)

    def close(self) -> None:
        self.client.close()
        self.loop.run(self.router.stop())
        self.loop.close()
        self.snapshotters.close()
        self.redis.close()
        self.redis_server.stop()


@pytest.fixture
def deployment(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    deployment = Deployment(model_dir, monkeypatch)
    yield deployment
    deployment.close()


def test_route_end_to_end(deployment: Deployment) -> None:
    routes_end_to_end(deployment.client, deployment.redis, "in-process-1")


def test_dispatches_reach_the_estimator(deployment: Deployment) -> None:
    dispatches_count_ahead(deployment.client)


def test_a_stale_snapshot_is_estimated_otherwise(deployment: Deployment) -> None:
    a_stale_snapshot_is_estimated_otherwise(deployment.snapshotters, deployment.client)


def test_redis_restarted_under_load(deployment: Deployment) -> None:
    """Every call answered while Redis is down and after it is back; the in-process feed finds the snapshots again."""
    load = Load(f"127.0.0.1:{deployment.router.port}", count=200, rate_rps=40.0)
    load.wait_until_sent(40)
    deployment.redis_server.stop()
    time.sleep(1.0)
    deployment.redis_server.start()
    register_instances(deployment.redis, THREE_INSTANCES, ttl_s=600)
    result = load.join()
    assert result.errors == [] and len(result.decisions) == 200
    wait_for_replay(deployment.client)


def test_settings_it_cannot_use_name_themselves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("BEAR_")]:
        monkeypatch.delenv(name)
    loop = LoopThread()
    try:
        config = RouterConfig(host="127.0.0.1", grpc_port=0, metrics_port=None, in_process=frozenset({"predictor"}))
        with pytest.raises(ValueError, match=r"BEAR_ROUTER_IN_PROCESS=predictor: BEAR_PREDICTOR_MODEL_DIR"):
            loop.run(main.start(config, CollectorRegistry()))
        monkeypatch.setenv("BEAR_PREDICTOR_MODEL_DIR", str(tmp_path / "missing"))
        with pytest.raises(ValueError, match=r"BEAR_ROUTER_IN_PROCESS=predictor: .*missing"):
            loop.run(main.start(config, CollectorRegistry()))
        monkeypatch.setenv("BEAR_MAX_SNAPSHOT_AGE_S", "-1")
        config = RouterConfig(host="127.0.0.1", grpc_port=0, metrics_port=None, in_process=frozenset({"estimator"}))
        with pytest.raises(ValueError, match=r"BEAR_ROUTER_IN_PROCESS=estimator: BEAR_MAX_SNAPSHOT_AGE_S"):
            loop.run(main.start(config, CollectorRegistry()))
    finally:
        loop.close()


def test_serve_router_in_process_as_a_process(model_dir: Path, tmp_path: Path) -> None:
    server = RedisServer()
    server.start()
    client = redis.Redis.from_url(server.url)
    register_instances(client, THREE_INSTANCES, ttl_s=600)
    snapshotters = Snapshotters(client)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("BEAR_", "OTEL_"))}
    environ.update(OTEL_SDK_DISABLED="true", BEAR_REDIS_URL=server.url, BEAR_PREDICTOR_MODEL_DIR=str(model_dir),
                   BEAR_ROUTER_IN_PROCESS="predictor, estimator")
    log = (tmp_path / "router.log").open("w+")
    process = subprocess.Popen([sys.executable, "-m", "bear.cli.main", "serve", "router", "--host=127.0.0.1",
                                "--grpc-port=0", "--metrics-port=0"], env=environ, stdout=subprocess.PIPE,
                               stderr=log, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        log.seek(0)
        assert line.startswith("grpc_port="), log.read()[-3000:]
        ports = dict(part.split("=") for part in line.split())
        router = RouterClient(f"127.0.0.1:{ports['grpc_port']}", timeout_s=5.0)
        try:
            wait_for_replay(router)
        finally:
            router.close()
        # The in-process services' metrics are on the router's /metrics.
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics_port']}/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
        for name in ('bear_router_decision_seconds_count', 'bear_estimator_snapshot_age_seconds{instance="small-0"}',
                     'bear_estimator_estimates_total{method="replay"}',
                     'bear_predictor_request_seconds_count{method="Predict"}'):
            assert name in metrics, name
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
        log.seek(0)
        text = log.read()
        assert "predictor in-process, estimator in-process" in text and "Traceback" not in text, text[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
        assert process.stdout is not None
        process.stdout.close()
        log.close()
        snapshotters.close()
        client.close()
        server.stop()


def test_an_unknown_service_is_refused_by_name() -> None:
    result = subprocess.run([sys.executable, "-m", "bear.cli.main", "serve", "router", "--in-process=predictor,cache"],
                            capture_output=True, text=True, timeout=60,
                            env={k: v for k, v in os.environ.items() if not k.startswith("BEAR_")})
    assert result.returncode == 2
    assert "BEAR_ROUTER_IN_PROCESS: unknown service 'cache'" in result.stderr
