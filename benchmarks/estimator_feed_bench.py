"""The estimator's snapshot intake: the CPU one `bear serve estimator` spends per published snapshot, and whether it
keeps up, as the number of instances grows.

A snapshotter publishes a snapshot per engine step (a hundred or more a second on a busy engine), and every estimator
replica takes in every instance's snapshots. This starts a redis-server and `bear serve estimator` (remaining
lengths from a predictor artifact trained here, as in a deployment with --predictor-model-dir), and, in a process of
its own, publishes snapshots as that many sidecars would: per instance, --residents decoding requests (their dispatch
records in Redis, as routers write them) that advance one token a step, one snapshot every --step-ms. For each
number of instances it prints the estimator's CPU (share of one core, and microseconds per snapshot published, from
/proc) and the snapshot age its Estimate answers report (an estimator that falls behind answers from older
snapshots).

    python benchmarks/estimator_feed_bench.py [--instances 1,4,16] [--residents 16] [--step-ms 6] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bear.cli.arguments import int_in

from arguments import positive_number, positive_int_list

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.redis_server: the redis-server the integration tests use

MODEL = "Qwen3-8B"  # a model of the predictor's catalogue, so that remaining lengths come from its distribution
# Each published instance runs at most MAX_NUM_SEQS requests (the estimator refuses a snapshot with more running) and
# has NUM_GPU_BLOCKS blocks, BLOCKS_PER_RESIDENT of them held by each resident (the rest is its num_free_blocks, a
# uint32: more residents than fit make the publisher fail). MAX_RESIDENTS is the lower of the two limits.
MAX_NUM_SEQS = 256
NUM_GPU_BLOCKS = 20_000
BLOCKS_PER_RESIDENT = 48
MAX_RESIDENTS = min(MAX_NUM_SEQS, NUM_GPU_BLOCKS // BLOCKS_PER_RESIDENT)


def main() -> int:
    args = parse_args()
    if args.publish:
        url, instances, residents, step_ms = args.publish
        return _publish(url, int(instances), int(residents), float(step_ms) / 1000)

    from bear.demo.assets import predictor_artifact
    from bear.demo.services import ServiceProcess
    from tests.redis_server import RedisServer

    redis_server = RedisServer()
    redis_server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="feed-bench-") as work:
            artifact = predictor_artifact(0)
            environ = {k: v for k, v in os.environ.items() if not k.startswith(("BEAR_", "OTEL_"))}
            environ["OTEL_SDK_DISABLED"] = "true"
            estimator = ServiceProcess("estimator", ["--host=127.0.0.1", "--grpc-port=0", "--metrics-port=off",
                                                     f"--redis-url={redis_server.url}",
                                                     f"--predictor-model-dir={artifact}"], environ, Path(work))
            estimator.start()
            try:
                print(f"bear serve estimator, {args.residents} decoding residents per instance, a snapshot per "
                      f"instance every {args.step_ms:g} ms, {os.cpu_count()} CPUs")
                print(f"{'instances':>9} {'snapshots/s':>11} | {'estimator CPU':>13} {'us/snapshot':>11} | "
                      f"{'age p50':>8} {'age p99':>8} {'replay':>7}")
                for count in args.instances:
                    print(_measure(redis_server.url, estimator, count, args), flush=True)
            finally:
                estimator.stop()
    finally:
        redis_server.stop()
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=positive_int_list, default=[1, 4, 16],
                        help="comma-separated numbers of instances (default 1,4,16)")
    parser.add_argument("--residents", type=int_in(0, MAX_RESIDENTS), default=16,
                        help=f"decoding requests per instance, at most {MAX_RESIDENTS}: the instances' max_num_seqs "
                             "(default 16)")
    parser.add_argument("--step-ms", type=positive_number, default=6.0,
                        help="one snapshot per instance this often, in ms (default 6)")
    parser.add_argument("--seconds", type=positive_number, default=10.0,
                        help="length of each measurement in seconds (default 10)")
    parser.add_argument("--publish", nargs=4, metavar=("REDIS_URL", "INSTANCES", "RESIDENTS", "STEP_MS"),
                        help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _measure(redis_url: str, estimator, count: int, args: argparse.Namespace) -> str:  # noqa: ANN001 - ServiceProcess
    import grpc

    from bear.v1 import estimator_pb2, estimator_pb2_grpc

    publisher = subprocess.Popen([sys.executable, __file__, "--publish", redis_url, str(count), str(args.residents),
                                  str(args.step_ms)], stdout=subprocess.PIPE, text=True)
    try:
        assert publisher.stdout is not None
        if publisher.stdout.readline().strip() != "publishing":
            raise SystemExit("the snapshot publisher did not start")
        ids = [f"bench-{count}-{i}" for i in range(count)]
        with grpc.insecure_channel(estimator.address) as channel:
            stub = estimator_pb2_grpc.EstimatorStub(channel)
            request = estimator_pb2.EstimateRequest(query_id="q", prompt_tokens=500, predicted_output_tokens=100,
                                                    instance_ids=ids)
            deadline = time.monotonic() + 30
            while not all(e.method == estimator_pb2.ESTIMATE_METHOD_REPLAY
                          for e in stub.Estimate(request, timeout=5).estimates):
                if time.monotonic() > deadline:
                    raise SystemExit(f"the estimator did not take in the {count} instances' snapshots in 30 s")
                time.sleep(0.1)
            time.sleep(1.0)  # the feed has settled on this load
            published_before, cpu_before, started = _published(publisher), _cpu_s(estimator.pid), time.monotonic()
            ages, num_replay, num_estimates = [], 0, 0
            while time.monotonic() - started < args.seconds:
                for answer in stub.Estimate(request, timeout=5).estimates:
                    ages.append(answer.snapshot_age_ms)
                    num_replay += answer.method == estimator_pb2.ESTIMATE_METHOD_REPLAY
                    num_estimates += 1
                time.sleep(0.05)
            elapsed = time.monotonic() - started
            cpu_s, published = _cpu_s(estimator.pid) - cpu_before, _published(publisher) - published_before
    finally:
        publisher.send_signal(signal.SIGTERM)
        publisher.wait(10)
    ages.sort()
    rate = published / elapsed
    return (f"{count:>9} {rate:>11.0f} | {100 * cpu_s / elapsed:>12.1f}% {1e6 * cpu_s / max(published, 1):>11.0f} | "
            f"{ages[len(ages) // 2]:>6.1f}ms {ages[int(0.99 * (len(ages) - 1))]:>6.1f}ms "
            f"{100 * num_replay / max(num_estimates, 1):>6.0f}%")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process and its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _published(publisher: subprocess.Popen[str]) -> int:
    """Snapshots the publisher has sent so far (it writes the count to a file named after its pid)."""
    path = Path(tempfile.gettempdir()) / f"feed-bench-published-{publisher.pid}"
    for _ in range(100):
        try:
            return int(path.read_text())
        except (OSError, ValueError):  # not written yet
            time.sleep(0.01)
    raise SystemExit("the snapshot publisher reports no count")


def _publish(redis_url: str, count: int, residents: int, step_s: float) -> int:
    """The sidecars' part: dispatch records of the residents, registrations, then a snapshot per instance per step
    until SIGTERM (each as a sidecar sends it: the latest under its key, and on the channel)."""
    import redis

    from bear.common import redis_keys
    from bear.v1 import calibration_pb2, router_pb2, snapshot_pb2

    client = redis.Redis.from_url(redis_url)
    now = time.time()
    engine = snapshot_pb2.EngineConfig(max_num_batched_tokens=8192, max_num_seqs=MAX_NUM_SEQS, block_size=16,
                                       num_gpu_blocks=NUM_GPU_BLOCKS, max_model_len=32_768, enable_chunked_prefill=True)
    coefficients = calibration_pb2.BatchTimeCoefficients(
        intercept_s=0.004, per_token_s=2e-5, per_decode_context_token_s=1e-8, per_prefill_attention_token_s=1e-9,
        num_samples=500, mape=0.05, prefill_tokens_per_s=40_000)
    snapshots = []
    for i in range(count):
        instance_id = f"bench-{count}-{i}"
        pipe = client.pipeline(transaction=False)
        pipe.set(redis_keys.instance_key(instance_id), snapshot_pb2.InstanceRegistration(
            instance_id=instance_id, pool="bench", model=MODEL, endpoint=f"http://{instance_id}:8000",
            input_usd_per_million_tokens=0.07, output_usd_per_million_tokens=0.29).SerializeToString())
        pipe.zadd(redis_keys.INSTANCES, {instance_id: now})
        requests = []
        for k in range(residents):
            request_id = f"{instance_id}-r{k}"
            record = router_pb2.DispatchRecord(request_id=request_id, instance_id=instance_id, model=MODEL,
                                               dispatched_at_s=now - 5, prompt_tokens=300,
                                               predicted_output_tokens=400.0)
            pipe.set(redis_keys.dispatch_key(request_id), record.SerializeToString(), px=600_000)
            pipe.zadd(redis_keys.dispatches_key(instance_id), {request_id: now - 5})
            requests.append(snapshot_pb2.RequestState(request_id=f"cmpl-{request_id}-0", num_prompt_tokens=300,
                                                      num_computed_tokens=300 + 20 * k, num_output_tokens=1 + 20 * k,
                                                      num_allocated_blocks=BLOCKS_PER_RESIDENT))
        pipe.execute()
        snapshots.append(snapshot_pb2.InstanceSnapshot(
            instance_id=instance_id, pool="bench", model=MODEL, engine=engine, running=requests,
            num_free_blocks=NUM_GPU_BLOCKS - BLOCKS_PER_RESIDENT * residents, batch_time=coefficients))
    counter = Path(tempfile.gettempdir()) / f"feed-bench-published-{os.getpid()}"
    staged = counter.with_suffix(".next")
    stopped = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    published, step, started = 0, 0, time.monotonic()
    print("publishing", flush=True)
    try:
        while not stopped:
            step += 1
            pipe = client.pipeline(transaction=False)
            taken_at = time.time()
            for message in snapshots:
                for request in message.running:  # one token a step; a request that reached 400 starts again
                    tokens = request.num_output_tokens % 400 + 1
                    request.num_output_tokens = tokens
                    request.num_computed_tokens = request.num_prompt_tokens + tokens - 1
                message.taken_at_s = message.read_at_s = taken_at
                message.sequence_number = step
                payload = message.SerializeToString()
                pipe.set(redis_keys.snapshot_key(message.instance_id), payload, px=10_000)
                pipe.publish(redis_keys.SNAPSHOTS_CHANNEL, payload)
            pipe.execute()
            published += len(snapshots)
            staged.write_text(str(published))
            staged.replace(counter)  # atomically: the reader never sees a half-written count
            time.sleep(max(0.0, started + step * step_s - time.monotonic()))
    finally:
        counter.unlink(missing_ok=True)
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
