"""Route latency: the router with the estimator and the predictor on loopback, three or more instances, an open-loop
load.

Starts a redis-server, publishes --replicas instances (default 1) of each model of the paper's Qwen3 pool with live
snapshots as snapshotters would (registration, snapshot with eq. 12 coefficients, refreshed every 100 ms, from a
process of its own), starts `bear serve predictor` (on a small predictor trained here on the synthetic corpus) and
`bear serve estimator` — or, when their modules are missing or with --fakes, one process of constant-answer fakes
(with the stream twins), and says which — then `bear serve router`, each its own process. With --in-process, the
router runs the real estimator and predictor in its own process (BEAR_ROUTER_IN_PROCESS) and no neighbour starts.
The load generator (this process, asyncio + uvloop, one channel) sends Route calls with Poisson arrivals and measures
each call's latency at the client; the router's own `decision_ms` (its answer's field), the router process's CPU
time per call and that of its neighbours (estimator and predictor together) are reported beside it: CPU time is a
steadier figure than latency on a shared machine.

It prints p50 / p99 at --rate (default 200 requests/s); then one call at a time for 3 s, each sent as the last
returns (the router never idles between calls: on a shared virtual machine, a call that comes after a pause finds
the caches cold and costs several times the CPU time); then the --rate load against this machine's floor — a Route
server that answers every call at once with a decision of the same size, no upstream call, no Redis, in a process of
its own — and the router's figures as multiples of the floor's: the cost of one gRPC hop in Python differs several-fold
between machines, the ratios much less. Then it raises the rate until p99 exceeds --p99-limit-ms (default 10) and
prints the highest rate that stayed within it.

    python benchmarks/route_bench.py [--rate 200] [--seconds 10] [--sweep-seconds 5] [--p99-limit-ms 10]
        [--prompts short|mixed] [--replicas 1] [--fakes | --in-process] [--tracing]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from arguments import non_negative_number, positive_int, positive_number

POOLS = (("small", "Qwen3-0.6B", 0.044, 0.173, 2, 1), ("medium", "Qwen3-8B", 0.072, 0.287, 4, 0),
         ("large", "Qwen3-32B", 0.287, 0.640, 8, 2))  # pool, model, prices, running and waiting per instance


def instances(replicas: int) -> list[tuple[str, str, str, float, float, int, int]]:
    """(id, pool, model, prices, running, waiting) of `replicas` instances per pool."""
    return [(f"{pool}-{r}", pool, model, p_in, p_out, running, waiting)
            for r in range(replicas) for pool, model, p_in, p_out, running, waiting in POOLS]


SHORT_PROMPTS = (
    "Give three tips for staying healthy. Answer in 50 words.",
    "What is the capital of Australia, and why was it chosen over Sydney?",
    "Rewrite this sentence in the passive voice: the committee approved the budget on Monday.",
    "Write a haiku about autumn rain on a tin roof.",
    "Explain the difference between a process and a thread to a new programmer, with one example each.",
    "Translate into French: the meeting has been moved to Thursday afternoon.",
    "List five uses of baking soda around the house.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
)


def main() -> int:
    args = parse_args()
    if args.serve_fakes:
        return _serve_fakes()
    if args.serve_floor:
        return _serve_floor(args.replicas)
    if args.publish_snapshots:
        return _publish_snapshots(args.publish_snapshots, args.replicas)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="route-bench-")))
        redis_url = stack.enter_context(_redis_server())
        stack.enter_context(_snapshotters(redis_url, args.replicas))
        if args.in_process:
            _train_predictor(tmp / "predictor")
            kind, neighbours = "the estimator and the predictor in the router's process (--in-process)", []
            where = ["--in-process=predictor,estimator"]
            settings = {"BEAR_PREDICTOR_MODEL_DIR": str(tmp / "predictor")}
        else:
            estimator, predictor, kind, neighbours = _neighbours(stack, args, tmp, redis_url)
            where = [f"--estimator-address={estimator}", f"--predictor-address={predictor}"]
            settings = {}
        router = stack.enter_context(_process(["serve", "router", "--host=127.0.0.1", "--grpc-port=0",
                                               "--metrics-port=0", f"--call-streams={args.call_streams}", *where,
                                               f"--redis-url={redis_url}"],
                                              tmp / "router.log", tracing=args.tracing, settings=settings))
        prompts = _prompts(args.prompts)
        streamed = args.client_streams == "on"
        print(f"router + {kind} on loopback, {3 * args.replicas} instances, {os.cpu_count()} CPUs; "
              f"prompts: {args.prompts} "
              f"({len(prompts)} distinct); tracing: {'SDK on, spans exported to nowhere' if args.tracing else 'off'}; "
              f"client → router: {'a stream of calls' if streamed else 'unary calls'}; "
              f"router → predictor, estimator: {'streams of calls' if args.call_streams == 'on' else 'unary calls'}")
        asyncio_run(_load(router, neighbours, prompts, rate_rps=args.rate, seconds=2.0,  # warm-up
                          streamed=streamed))
        stages_before = _stage_seconds(router)
        result = asyncio_run(_load(router, neighbours, prompts, rate_rps=args.rate, seconds=args.seconds,
                                   streamed=streamed))
        print(_header())
        print(_row(args.rate, result))
        print("   mean per stage inside the router: " + _stage_means(stages_before, _stage_seconds(router))
              + " (predict and estimate run at once; record is off the path)")
        warm = asyncio_run(_load(router, neighbours, prompts, rate_rps=args.rate, seconds=min(args.seconds, 3.0),
                                 streamed=streamed, back_to_back=True))
        print(_row(len(warm.client_ms) / min(args.seconds, 3.0), warm) + "  one call at a time, back to back")
        floor = stack.enter_context(_process([], tmp / "floor.log",
                                             script=["--serve-floor", f"--replicas={args.replicas}"]))
        asyncio_run(_load(floor, [], prompts, rate_rps=args.rate, seconds=2.0, streamed=streamed))  # warm-up
        baseline = asyncio_run(_load(floor, [], prompts, rate_rps=args.rate, seconds=args.seconds,
                                     streamed=streamed))
        print(_row(args.rate, baseline) + "  floor: a Route server answering at once")
        print("   router / floor: " + _ratios(result, baseline))
        if args.sweep_seconds == 0:
            return 0
        best = None
        for rate in _rates(args.rate):
            for attempt in range(2):  # a step that fails is run once more: one noisy second should not end the sweep
                result = asyncio_run(_load(router, neighbours, prompts, rate_rps=rate, seconds=args.sweep_seconds,
                                           streamed=streamed))
                print(_row(rate, result) + ("  (again)" if attempt else ""))
                within = not result.errors and _percentile(result.client_ms, 99) <= args.p99_limit_ms
                if within:
                    break
            if not within:
                break
            best = rate
        print(f"highest rate sustained with p99 <= {args.p99_limit_ms:g} ms: "
              f"{'below ' + str(_rates(args.rate)[0]) if best is None else best} requests/s")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=positive_number, default=200.0,
                        help="requests per second of the main measurement; the sweep starts at 1.25x it (default 200)")
    parser.add_argument("--seconds", type=positive_number, default=10.0,
                        help="length of the main measurement in seconds (default 10)")
    parser.add_argument("--sweep-seconds", type=non_negative_number, default=5.0,
                        help="length of each step of the rate sweep in seconds (default 5; 0: no sweep)")
    parser.add_argument("--p99-limit-ms", type=positive_number, default=10.0,
                        help="the sweep stops at the first rate whose client p99 exceeds this many ms (default 10)")
    parser.add_argument("--prompts", choices=("short", "mixed"), default="short",
                        help="short chat prompts (10-30 tokens), or the synthetic corpus's four regimes")
    neighbours = parser.add_mutually_exclusive_group()
    neighbours.add_argument("--fakes", action="store_true", help="constant-answer fakes instead of the real services")
    neighbours.add_argument("--in-process", action="store_true", help="the real estimator and predictor inside the "
                        "router's process (BEAR_ROUTER_IN_PROCESS) instead of their own")
    parser.add_argument("--tracing", action="store_true", help="leave OpenTelemetry on (default: OTEL_SDK_DISABLED, "
                                                               "as the chart sets without a collector)")
    parser.add_argument("--call-streams", choices=("on", "off"), default="on",
                        help="the router's calls to the predictor and estimator: over streams of calls (default) or "
                             "unary (off)")
    parser.add_argument("--client-streams", choices=("on", "off"), default="on",
                        help="the load generator's Route calls: over a stream of calls (default, as the asyncio "
                             "client makes them) or unary (off)")
    parser.add_argument("--replicas", type=positive_int, default=1,
                        help="instances per model (of Qwen3-0.6B, 8B and 32B; default 1: three instances)")
    parser.add_argument("--serve-fakes", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--publish-snapshots", metavar="REDIS_URL", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _rates(start: float) -> list[float]:
    return [start * f for f in (1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 8, 10)]


# The load --------------------------------------------------------------------------------------------------------

class Result:
    def __init__(self) -> None:
        self.client_ms: list[float] = []
        self.router_ms: list[float] = []
        self.degraded = 0
        self.errors = 0
        self.late_s = 0.0  # how far the generator fell behind its schedule
        self.router_cpu_ms = 0.0  # the router process's CPU time per call
        self.neighbours_cpu_ms = 0.0  # the estimator's and the predictor's (or the fakes'), together


async def _load(router: Proc, neighbours: list[Proc], prompts: list[str], rate_rps: float, seconds: float,
                streamed: bool, back_to_back: bool = False) -> Result:
    """Poisson arrivals at `rate_rps`; `back_to_back`: one call at a time instead, each sent as the last returns."""
    from bear.router.client import AsyncRouterClient, RouterError

    result = Result()
    cpu_before = router.cpu_s()
    neighbours_before = sum(p.cpu_s() for p in neighbours)
    rng = random.Random(7)

    async def one(prompt: str) -> None:
        started = time.perf_counter()
        try:
            decision = await client.route(prompt, ttft_slo_ms=500.0)
        except RouterError:
            result.errors += 1
            return
        result.client_ms.append((time.perf_counter() - started) * 1000)
        result.router_ms.append(decision.decision_ms)
        result.degraded += decision.degraded

    async with AsyncRouterClient(router.address, timeout_s=5.0, streamed=streamed) as client:
        tasks, due = [], time.perf_counter()
        end = due + seconds
        while back_to_back and time.perf_counter() < end:
            await one(rng.choice(prompts))
        while not back_to_back and due < end:
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                result.late_s = max(result.late_s, -wait)
            tasks.append(asyncio.create_task(one(rng.choice(prompts))))
            due += rng.expovariate(rate_rps)
        await asyncio.gather(*tasks)
    calls = max(1, len(result.client_ms))
    result.router_cpu_ms = (router.cpu_s() - cpu_before) * 1000 / calls
    result.neighbours_cpu_ms = (sum(p.cpu_s() for p in neighbours) - neighbours_before) * 1000 / calls
    return result


def asyncio_run(coro):  # noqa: ANN001, ANN201
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def _header() -> str:
    return (f"{'rate/s':>7} {'calls':>6} | {'client p50':>10} {'p99':>7} {'max':>7} | {'router p50':>10} {'p99':>7} | "
            f"{'CPU/call':>8} {'neighbours':>10} | {'degraded':>8} {'errors':>6}")


def _row(rate: float, r: Result) -> str:
    return (f"{rate:>7.0f} {len(r.client_ms):>6} | {_percentile(r.client_ms, 50):>8.2f}ms "
            f"{_percentile(r.client_ms, 99):>5.2f}ms {max(r.client_ms, default=float('nan')):>5.1f}ms | "
            f"{_percentile(r.router_ms, 50):>8.2f}ms {_percentile(r.router_ms, 99):>5.2f}ms "
            f"{r.router_cpu_ms:>6.2f}ms {r.neighbours_cpu_ms:>8.2f}ms | "
            f"{r.degraded:>8} {r.errors:>6}" + (f"  (generator {r.late_s * 1000:.0f} ms late)" if r.late_s > 0.05
                                                  else ""))


def _ratios(router: Result, floor: Result) -> str:
    def ratio(ours: float, theirs: float) -> str:
        return f"{ours / theirs:.1f}x" if theirs > 0 and ours == ours and theirs == theirs else "n/a"

    return (f"client p50 {ratio(_percentile(router.client_ms, 50), _percentile(floor.client_ms, 50))}, "
            f"p99 {ratio(_percentile(router.client_ms, 99), _percentile(floor.client_ms, 99))}; server CPU per "
            f"call {ratio(router.router_cpu_ms, floor.router_cpu_ms)} (the estimator's and predictor's not counted)")


def _stage_seconds(router: Proc) -> dict[str, tuple[float, float]]:
    """The router's bear_router_stage_seconds: (sum, count) by stage, scraped from its /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    sums: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("bear_router_stage_seconds_sum", "bear_router_stage_seconds_count"):
                slot = sums.setdefault(sample.labels["stage"], [0.0, 0.0])
                slot[sample.name.endswith("_count")] = sample.value
    return {stage: (total, count) for stage, (total, count) in sums.items()}


def _stage_means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> str:
    means = []
    for stage, (total, count) in after.items():
        total_before, count_before = before.get(stage, (0.0, 0.0))
        if count > count_before:
            means.append(f"{stage} {(total - total_before) / (count - count_before) * 1000:.2f} ms")
    return ", ".join(means)


def _prompts(kind: str) -> list[str]:
    if kind == "short":
        return list(SHORT_PROMPTS)
    from bear.predictor.synthetic_corpus import generate

    return list(dict.fromkeys(generate(600, seed=5).table.prompts))


# The neighbours ---------------------------------------------------------------------------------------------------

def _neighbours(stack: ExitStack, args: argparse.Namespace, tmp: Path, redis_url: str
                ) -> tuple[str, str, str, list[Proc]]:
    import importlib.util

    missing = [m for m in ("bear.estimator.main", "bear.predictor.main") if importlib.util.find_spec(m) is None]
    if args.fakes or missing:
        why = "--fakes" if args.fakes else f"{', '.join(missing)} missing"
        fakes = stack.enter_context(_process([], tmp / "fakes.log", script=["--serve-fakes"]))
        estimator, predictor = fakes.address.split(",")
        return estimator, predictor, f"FAKE estimator and predictor ({why})", [fakes]
    model_dir = tmp / "predictor"
    _train_predictor(model_dir)
    predictor = stack.enter_context(_process(["serve", "predictor", "--host=127.0.0.1", "--grpc-port=0",
                                              "--metrics-port=off", f"--model-dir={model_dir}"], tmp / "p.log"))
    estimator = stack.enter_context(_process(["serve", "estimator", "--host=127.0.0.1", "--grpc-port=0",
                                              "--metrics-port=off", f"--redis-url={redis_url}",
                                              f"--predictor-model-dir={model_dir}"], tmp / "e.log"))
    return (estimator.address, predictor.address, "the real estimator and predictor services",
            [estimator, predictor])


def _train_predictor(folder: Path) -> None:
    from bear.predictor.catalog import PAPER_POOL
    from bear.predictor.synthetic_corpus import generate
    from bear.predictor.training import TrainingConfig, train

    train(generate(1500, seed=11).table, PAPER_POOL, TrainingConfig(num_trees=100)).save(folder)


class Proc:
    def __init__(self, address: str, pid: int, metrics_port: int | None = None) -> None:
        self.address, self.pid, self.metrics_port = address, pid, metrics_port

    def cpu_s(self) -> float:
        """CPU time (user + system) the process has used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def _process(arguments: list[str], log: Path, *, script: Sequence[str] = (), tracing: bool = False,
             settings: dict[str, str] | None = None) -> Iterator[Proc]:
    """A BEAR process (or this script with `script`, its options: serving fakes or the floor), with the address it
    announced on its first line; `settings`: its BEAR_* environment (none of this process's goes along)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("BEAR_", "OTEL_"))} | (settings or {})
    if not tracing:
        environ["OTEL_SDK_DISABLED"] = "true"
    command = ([sys.executable, __file__, *script] if script
               else [sys.executable, "-m", "bear.cli.main", *arguments])
    with log.open("w") as err:
        process = subprocess.Popen(command, env=environ, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            if not line:
                raise SystemExit(f"{' '.join(command)} did not start: {log.read_text()[-2000:]}")
            if script:
                yield Proc(line, process.pid)
            else:
                ports = dict(part.split("=") for part in line.split())
                metrics = ports.get("metrics_port", "")
                yield Proc(f"127.0.0.1:{ports['grpc_port']}", process.pid,
                           int(metrics) if metrics.isdigit() else None)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


@contextmanager
def _redis_server() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (make redis)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


@contextmanager
def _snapshotters(redis_url: str, replicas: int) -> Iterator[None]:
    """Registrations and live snapshots of the instances, refreshed every 100 ms by a process of their own (as
    snapshotters are: in this process they would take the load generator's GIL and add to the latencies it measures)."""
    process = subprocess.Popen([sys.executable, __file__, f"--publish-snapshots={redis_url}",
                                f"--replicas={replicas}"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "publishing":
            raise SystemExit("the snapshot publisher did not start")
        yield
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def _publish_snapshots(redis_url: str, replicas: int) -> int:
    """The snapshotters' part: registers the instances (again every second, as a sidecar's heartbeat does)
    and publishes their snapshots every 100 ms until SIGTERM; prints `publishing` once the first ones are in Redis."""
    import redis

    from bear.common import redis_keys
    from bear.common.service import set_on_signals
    from bear.v1 import calibration_pb2, snapshot_pb2

    client = redis.Redis.from_url(redis_url)
    snapshots, registrations = [], []
    for instance_id, pool, model, price_in, price_out, running, waiting in instances(replicas):
        registrations.append(snapshot_pb2.InstanceRegistration(
            instance_id=instance_id, pool=pool, model=model, endpoint=f"http://{instance_id}:8000",
            input_usd_per_million_tokens=price_in, output_usd_per_million_tokens=price_out))
        engine = snapshot_pb2.EngineConfig(max_num_batched_tokens=8192, max_num_seqs=256, block_size=16,
                                           num_gpu_blocks=20_000, max_model_len=32_768, enable_chunked_prefill=True)
        residents = [snapshot_pb2.RequestState(request_id=f"{instance_id}-r{k}", num_prompt_tokens=300,
                                               num_computed_tokens=340, num_output_tokens=41,
                                               num_allocated_blocks=22) for k in range(running)]
        queue = [snapshot_pb2.RequestState(request_id=f"{instance_id}-w{k}", num_prompt_tokens=800)
                 for k in range(waiting)]
        snapshots.append(snapshot_pb2.InstanceSnapshot(
            instance_id=instance_id, pool=pool, model=model, engine=engine, running=residents, waiting=queue,
            num_free_blocks=20_000 - 22 * running, batch_time=calibration_pb2.BatchTimeCoefficients(
                intercept_s=0.004, per_token_s=2e-5, per_decode_context_token_s=1e-8,
                per_prefill_attention_token_s=1e-9, num_samples=500, mape=0.05, prefill_tokens_per_s=40_000)))
    stopped = threading.Event()
    set_on_signals(stopped, (signal.SIGTERM,))

    def register() -> None:  # as a sidecar's heartbeat does: a registration older than the window is dropped
        now = time.time()
        for registration in registrations:
            registration.registered_at_s = now
            client.set(redis_keys.instance_key(registration.instance_id), registration.SerializeToString(),
                       px=10_000)
            client.zadd(redis_keys.INSTANCES, {registration.instance_id: now})

    def publish() -> None:
        now = time.time()
        for sequence, message in enumerate(snapshots):
            message.taken_at_s = message.read_at_s = now
            message.sequence_number = int(now * 1000) + sequence
            payload = message.SerializeToString()
            client.set(redis_keys.snapshot_key(message.instance_id), payload, px=10_000)
            client.publish(redis_keys.SNAPSHOTS_CHANNEL, payload)

    register()
    publish()
    print("publishing", flush=True)
    for tick in itertools.count(1):
        if stopped.wait(0.1):
            break
        publish()
        if tick % 10 == 0:
            register()
    client.close()
    return 0


def _serve_fakes() -> int:
    """Constant-answer Estimator and Predictor servers; prints `estimator_address,predictor_address`."""
    from bear.v1 import estimator_pb2, estimator_pb2_grpc, predictor_pb2, predictor_pb2_grpc

    async def predict(request):  # noqa: ANN001, ANN202
        tokens = max(1, len(request.prompt.split()))
        return predictor_pb2.PredictResponse(predictions=[
            predictor_pb2.ModelPrediction(model=model, accuracy=0.5 + 0.1 * k, output_tokens=200.0,
                                          prompt_tokens=tokens, cost_micro_usd=tokens * p_in + 200 * p_out)
            for k, (_, model, p_in, p_out, _, _) in enumerate(POOLS)])

    async def estimate(request):  # noqa: ANN001, ANN202
        return estimator_pb2.EstimateResponse(estimates=[
            estimator_pb2.InstanceEstimate(instance_id=i, method=estimator_pb2.ESTIMATE_METHOD_REPLAY, known=True,
                                           feasible=True, ttft_ms=50.0 * (k + 1), snapshot_age_ms=20.0,
                                           num_running=k, num_batches=2)
            for k, i in enumerate(request.instance_ids)])

    return _serve_constant([(estimator_pb2_grpc, "Estimator", estimate, estimator_pb2.EstimateResult),
                            (predictor_pb2_grpc, "Predictor", predict, predictor_pb2.PredictResult)])


def _serve_floor(replicas: int) -> int:
    """A Route server that answers each call at once with a constant decision of one candidate per instance (the size
    of the router's); prints its address."""
    from bear.v1 import router_pb2, router_pb2_grpc

    candidates = [router_pb2.CandidateDecision(
        instance_id=instance_id, model=model, endpoint=f"http://{instance_id}:8000", predicted_accuracy=0.5 + 0.1 * k,
        predicted_output_tokens=200.0, prompt_tokens=20, predicted_cost_micro_usd=20 * p_in + 200 * p_out,
        utility=0.4 + 0.1 * k, ttft_known=True, predicted_ttft_ms=50.0 * (k + 1), ttft_method="replay", feasible=True,
        score=0.4 + 0.1 * k, snapshot_age_ms=20.0)
        for k, (instance_id, _, model, p_in, p_out, _, _) in enumerate(instances(replicas))]

    async def route(request):  # noqa: ANN001, ANN202
        chosen = candidates[-1]
        return router_pb2.RouteDecision(
            request_id=request.request_id, decision=router_pb2.DECISION_ROUTE, instance_id=chosen.instance_id,
            endpoint=chosen.endpoint, model=chosen.model, policy="bear", reason="highest utility among feasible",
            candidates=candidates, decision_ms=0.0)

    return _serve_constant([(router_pb2_grpc, "Router", route, router_pb2.RouteResult)])


def _serve_constant(services: list[tuple[Any, str, Any, Any]]) -> int:
    """One server per (generated `*_pb2_grpc` module, service name, answer, stream result type): its hot method,
    unary and as a stream of calls (`<Method>Stream`), answered by `answer`; prints the addresses, comma-separated, and
    serves until SIGTERM."""
    import grpc

    from bear.common.call_streams import CallStreamServer

    def servicer(module: Any, service: str, answer: Any, result_type: Any) -> Any:
        method = {"Estimator": "Estimate", "Predictor": "Predict", "Router": "Route"}[service]
        streams = CallStreamServer(answer, result_type, f"/bear.v1.{service}/{method}Stream")

        async def unary(self, request, context):  # noqa: ANN001, ANN202
            return await answer(request)

        async def stream(self, calls, context):  # noqa: ANN001, ANN202
            await streams.serve(calls, context)

        base = getattr(module, f"{service}Servicer")
        return type(f"Constant{service}", (base,), {method: unary, f"{method}Stream": stream})()

    async def serve() -> None:
        servers = []
        for module, service, answer, result_type in services:
            server = grpc.aio.server()
            getattr(module, f"add_{service}Servicer_to_server")(servicer(module, service, answer, result_type), server)
            servers.append((server, server.add_insecure_port("127.0.0.1:0")))
            await server.start()
        print(",".join(f"127.0.0.1:{port}" for _, port in servers), flush=True)
        stopped = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
        await stopped.wait()
        for server, _ in servers:
            await server.stop(None)  # ends the router's streams of calls too

    asyncio_run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
