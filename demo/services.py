"""BEAR's services as the demo runs them: each `bear serve <service>` in a process of its own, on loopback ports.

A service prints `grpc_port=N metrics_port=M` once it listens; its log goes to a file in the run's folder (shown when
it fails). `stop` sends SIGTERM (graceful shutdown) and kills what has not exited after a grace period. On Linux a
service also gets SIGTERM when the demo dies without stopping it (SIGKILL, the OOM killer): it runs in a session of its
own, out of reach of signals to the demo's process group, and would otherwise serve on for good.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from bear.common.processes import CAN_DIE_WITH_PARENT, die_with_parent

READY_TIMEOUT_S = 120.0  # the first start of a service imports grpc, numpy, LightGBM …
_READY = re.compile(r"grpc_port=(\d+)(?: metrics_port=(\d*))?")


class ServiceFailed(RuntimeError):
    pass


class ServiceProcess:
    def __init__(self, service: str, flags: Sequence[str], environ: Mapping[str, str], log_folder: Path):
        self.service = service
        self.log_path = log_folder / f"{service}.log"
        self._command = [sys.executable, "-m", "bear.cli.main", "serve", service, *flags]
        self._environ = dict(environ)
        self._process: subprocess.Popen[str] | None = None
        self._drain: threading.Thread | None = None
        self.grpc_port = 0
        self.metrics_port: int | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        log = self.log_path.open("w")
        self._process = subprocess.Popen(self._command, stdout=subprocess.PIPE, stderr=log, text=True,
                                         env=self._environ, start_new_session=True,
                                         preexec_fn=_terminate_with_parent if CAN_DIE_WITH_PARENT else None)
        log.close()
        found: list[re.Match[str]] = []
        reader = threading.Thread(target=self._await_ready, args=(found,), daemon=True)
        reader.start()
        try:
            reader.join(READY_TIMEOUT_S)
        except BaseException:  # e.g. a signal ends the caller while it waits: the process does not outlive it
            self.stop()
            raise
        if not found:
            self.stop()
            raise ServiceFailed(f"bear serve {self.service} did not start; its log ({self.log_path}):\n"
                                f"{self.log_tail()}")
        self.grpc_port = int(found[0].group(1))
        self.metrics_port = int(found[0].group(2)) if found[0].group(2) else None

    def _await_ready(self, found: list[re.Match[str]]) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            match = _READY.search(line)
            if match:
                found.append(match)
                break
        # Keep draining stdout so that the service never blocks on a full pipe; closed at its end.
        drain = threading.Thread(target=self._drain_stdout, daemon=True)
        drain.start()
        self._drain = drain  # started: `stop` (a Ctrl-C in the main thread meanwhile) joins it (QA: "cannot join
        # thread before it is started" ended an interrupted demo with status 1)

    def _drain_stdout(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        try:
            self._process.stdout.read()
        except (OSError, ValueError):
            pass

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"bear serve {self.service} has not been started")
        return self._process.pid

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 5.0) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(grace_s)
            except ProcessLookupError:
                pass
        if self._drain is not None:
            self._drain.join(grace_s)  # the pipe's end follows the process's
        if process.stdout is not None and not (self._drain is not None and self._drain.is_alive()):
            process.stdout.close()


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM when the thread that started it ends (the demo's main thread, which starts
    every service and outlives them unless the demo dies)."""
    die_with_parent(signal.SIGTERM)
