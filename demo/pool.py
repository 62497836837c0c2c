"""The demo's simulated pool: live instances, each with the production snapshotter sidecar publishing it to Redis.

`SimulatedPool` runs in the calling process: one `LiveInstance` engine thread and one sidecar
(`bear.snapshotter.main.run`, with its gRPC server on a loopback port) per instance. `PoolProcess` runs the same pool
in a child process, so that the engines' Python work does not share an interpreter lock with the process measuring
routing latency; the parent submits requests and receives their events over a socket.

Each instance registers as `sim://<instance id>`, with its model's catalogue prices.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

from bear.common.redis_config import RedisConfig
from bear.demo.live_instance import LiveInstance, RequestEvent
from bear.evaluation.pool_spec import InstanceSpec
from bear.snapshotter.config import SnapshotterConfig

logger = logging.getLogger("bear.demo")

ENDPOINT_SCHEME = "sim://"
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class PoolConfig:
    specs: tuple[InstanceSpec, ...]
    redis: RedisConfig
    prices_usd_per_mtok: Mapping[str, tuple[float, float]]  # model → (input, output)
    seed: int = 0
    poll_interval_s: float = 0.005  # the sidecars' region polling
    calibration_min_samples: int = 50
    calibration_refit_s: float = 2.0


def endpoint_of(instance_id: str) -> str:
    return ENDPOINT_SCHEME + instance_id


class SimulatedPool:
    """Instances and their sidecars in this process. `start` returns once every sidecar serves."""

    def __init__(self, config: PoolConfig, on_event: Callable[[RequestEvent], None]):
        self.config = config
        tag = uuid.uuid4().hex[:8]
        self.instances = {
            spec.instance_id: LiveInstance(spec, config.seed * 1000 + n, on_event, f"bear-demo-{tag}-{spec.instance_id}")
            for n, spec in enumerate(config.specs)}
        self._stop = threading.Event()
        self._sidecars: list[threading.Thread] = []

    def start(self) -> None:
        ready = threading.Semaphore(0)
        for instance in self.instances.values():
            instance.start()
            thread = threading.Thread(target=self._sidecar, args=(instance, ready), daemon=True,
                                      name=f"bear-demo-sidecar-{instance.instance_id}")
            thread.start()
            self._sidecars.append(thread)
        for _ in self._sidecars:
            if not ready.acquire(timeout=READY_TIMEOUT_S):
                raise RuntimeError("a snapshotter sidecar of the simulated pool did not start")

    def _sidecar(self, instance: LiveInstance, ready: threading.Semaphore) -> None:
        from bear.snapshotter import main  # grpc and redis, only once the pool runs

        config = self.config
        input_price, output_price = config.prices_usd_per_mtok.get(instance.spec.model, (0.0, 0.0))
        sidecar = SnapshotterConfig(
            region=instance.region_path, instance_id=instance.instance_id, pool=instance.spec.model,
            model=instance.spec.model, endpoint=endpoint_of(instance.instance_id),
            input_usd_per_million_tokens=input_price, output_usd_per_million_tokens=output_price,
            poll_interval_s=config.poll_interval_s, grpc_host="127.0.0.1", grpc_port=0, metrics_port=None,
            calibration_min_samples=config.calibration_min_samples, calibration_refit_s=config.calibration_refit_s,
            redis=config.redis)
        try:
            main.run(sidecar, self._stop, on_ready=lambda port, metrics: ready.release())
        except Exception:  # noqa: BLE001 - reported; the pool's start times out if it never served
            logger.exception("snapshotter sidecar of %s failed", instance.instance_id)

    def submit(self, instance_id: str, request_id: str, prompt_tokens: int, output_tokens: int) -> float:
        instance = self.instances.get(instance_id)
        if instance is None:
            raise KeyError(f"no simulated instance {instance_id!r}")
        return instance.submit(request_id, prompt_tokens, output_tokens)

    @property
    def num_unfinished(self) -> int:
        return sum(instance.num_unfinished for instance in self.instances.values())

    def stop(self) -> None:
        for instance in self.instances.values():
            instance.stop()
        self._stop.set()
        for thread in self._sidecars:
            thread.join(5.0)


# The pool in a child process ---------------------------------------------------------------------------------------

class PoolProcess:
    """`SimulatedPool` in a child process. `on_event` is called from a reader thread of this process.

    The child runs in a session of its own (`python -m bear.demo.pool FD`, the pool's settings its first message over
    a socket pair): Ctrl-C, a closed terminal (SIGHUP) and `kill -TERM -<group>` reach the demo, which stops the pool
    (`stop`), and not the child. As a multiprocessing child in the demo's process group, a Ctrl-C during its second of
    imports ended it with a KeyboardInterrupt traceback on the terminal (QA). Should the demo die, the child reads
    the end of the socket and stops its pool."""

    def __init__(self, config: PoolConfig, on_event: Callable[[RequestEvent], None]):
        self._on_event = on_event
        self._config = config
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: str | None = None
        self.instance_ids: Sequence[str] = [spec.instance_id for spec in config.specs]

    def start(self) -> None:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            self._process = subprocess.Popen([sys.executable, "-m", "bear.demo.pool", str(theirs.fileno())],
                                             stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()],
                                             start_new_session=True)
            self._conn = Connection(os.dup(ours.fileno()))
        try:
            self._conn.send(self._config)
        except OSError:  # it ended already: the reader says how
            pass
        self._reader = threading.Thread(target=self._read, args=(self._conn,), name="bear-demo-pool-reader",
                                        daemon=True)
        self._reader.start()
        if not self._ready.wait(READY_TIMEOUT_S) or self._failure is not None:
            self.stop()
            raise RuntimeError(f"the simulated pool did not start: {self._failure or 'timed out'}")

    @property
    def exit_code(self) -> int | None:
        """None while the pool's process runs (or before it started)."""
        return None if self._process is None else self._process.poll()

    def submit(self, instance_id: str, request_id: str, prompt_tokens: int, output_tokens: int) -> None:
        if instance_id not in self.instance_ids:
            raise KeyError(f"no simulated instance {instance_id!r}")
        if self._conn is None:
            raise RuntimeError("the simulated pool has not been started")
        with self._send_lock:
            self._conn.send(("submit", instance_id, request_id, prompt_tokens, output_tokens))

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            try:
                with self._send_lock:
                    if self._conn is not None:
                        self._conn.send(("stop",))
            except OSError:
                pass
            try:
                self._process.wait(10.0)
            except subprocess.TimeoutExpired:  # SIGKILL: it ignores SIGTERM (`_serve`)
                self._process.kill()
                self._process.wait(5.0)
        if self._conn is not None:
            self._conn.close()

    def _read(self, conn: Connection) -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                if not self._ready.is_set() and self._process is not None:  # `start` need not wait its time out
                    self._failure = f"its process ended (exit status {self._process.wait()})"
                    self._ready.set()
                return
            kind = message[0]
            if kind == "event":
                self._on_event(RequestEvent(*message[1:]))
            elif kind == "ready":
                self._ready.set()
            elif kind == "failed":
                self._failure = message[1]
                self._ready.set()
            elif kind == "error":
                logger.warning("simulated pool: %s", message[1])


def main(argv: Sequence[str] | None = None) -> int:
    """The pool's process: `python -m bear.demo.pool FD`, FD its end of the socket pair (PoolProcess)."""
    args = sys.argv[1:] if argv is None else argv
    conn = Connection(int(args[0]))
    try:
        config = conn.recv()
    except (EOFError, OSError):
        return 1
    _serve(conn, config)
    return 0


def _serve(conn: Connection, config: PoolConfig) -> None:
    """The child process: runs the pool until told to stop (or until the parent goes away). Signals are the demo's to
    handle: it stops the child, which ignores them (killed by one, it would leave its instances' /dev/shm regions
    behind)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    logging.basicConfig(level=os.environ.get("BEAR_DEMO_POOL_LOG", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        with send_lock:
            try:
                conn.send(message)
            except OSError:
                pass  # the parent is gone; the recv loop ends too

    pool = SimulatedPool(config, lambda e: send(("event", e.kind, e.instance_id, e.request_id, e.at_s, e.arrival_s)))
    try:
        pool.start()
    except Exception as error:  # noqa: BLE001 - reported to the parent
        send(("failed", repr(error)))
        pool.stop()
        return
    send(("ready",))
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "stop":
                break
            if message[0] == "submit":
                try:
                    pool.submit(*message[1:])
                except (KeyError, ValueError) as error:
                    send(("error", str(error)))
    finally:
        pool.stop()


if __name__ == "__main__":
    sys.exit(main())
