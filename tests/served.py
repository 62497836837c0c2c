"""`bear serve <service>` as a child process for a test: started, its ports read from its first line, and reaped
(killed if still running, pipes closed) however the test ends."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BEAR = shutil.which("bear") or str(Path(sys.executable).parent / "bear")


@contextmanager
def serving(service: str, *flags: str) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """Yields (process, gRPC port, metrics port); pass `--grpc-port 0 --metrics-port 0` among `flags`."""
    process = subprocess.Popen([BEAR, "serve", service, *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        assert process.stdout is not None
        ready = re.fullmatch(r"grpc_port=(\d+) metrics_port=(\d+)\n", process.stdout.readline())
        assert ready, process.stderr.read() if process.stderr else ""
        yield process, int(ready.group(1)), int(ready.group(2))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
