"""The estimator's time per Estimate: what `bear serve estimator` spends answering one query for a pool, by number of
instances and of residents per instance, next to the compiled replay alone on the same states.

Every Route call asks the estimator for one TTFT per candidate instance, so this time grows with the pool and with
how busy its engines are. Each instance's snapshot here is what a busy vLLM engine under async scheduling writes:
--residents decoding requests, the step executing over all of them, eq. 12 coefficients and a prefill throughput
(θ, for eq. 8) — and --dispatches requests routed to it since the snapshot, which the replay adds as arrivals
(a router at 200 requests/s over 3 instances with snapshots every 100 ms leaves about 7 per instance). The script
times `Estimator.estimate` (what the service calls per Estimate, in process: no gRPC) and
`estimate_many` on the same prepared states and timing (the compiled core alone), and prints both per call, per
instance, and their ratio: the estimator's own work on top of the replay.

    python benchmarks/estimate_bench.py [--instances 3,10,30] [--residents 8,64,256] [--dispatches 0,8,32]
        [--calls 300]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import numpy as np

from arguments import non_negative_int_list, positive_int, positive_int_list

NOW_S = 1_000_000.0
CONTEXT_TOKENS = 700  # each resident's computed tokens: a 600-token prompt, 100 generated (one in flight)


def main() -> int:
    args = parse_args()
    print(f"Estimator.estimate vs the compiled replay alone, median of {args.calls} calls (µs)")
    print(f"{'instances':>9} {'residents':>9} {'dispatches':>10} | {'estimator':>9} {'per inst.':>9} | {'replay':>7} "
          f"{'per inst.':>9} | {'ratio':>5}")
    for instances in args.instances:
        for residents in args.residents:
            for dispatches in args.dispatches:
                estimator_us, replay_us = _measure(instances, residents, dispatches, args.calls)
                print(f"{instances:>9} {residents:>9} {dispatches:>10} | {estimator_us:>9.1f} "
                      f"{estimator_us / instances:>9.1f} | {replay_us:>7.1f} {replay_us / instances:>9.1f} | "
                      f"{estimator_us / replay_us:>5.2f}")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=positive_int_list, default=[3, 10, 30],
                        help="numbers of instances to estimate for (comma-separated; default 3,10,30)")
    parser.add_argument("--residents", type=positive_int_list, default=[8, 64, 256],
                        help="decoding requests per instance (comma-separated, at most 1024; default 8,64,256)")
    parser.add_argument("--dispatches", type=non_negative_int_list, default=[0, 8, 32],
                        help="requests routed to each instance since its snapshot (comma-separated; default 0,8,32)")
    parser.add_argument("--calls", type=positive_int, default=300, help="timed calls per point (default 300)")
    args = parser.parse_args(argv)
    if max(args.residents) > 1024:
        parser.error(f"argument --residents: at most 1024 per instance (the engine's max_num_seqs), got "
                     f"{max(args.residents)}")
    return args


def _measure(instances: int, residents: int, dispatches: int, calls: int) -> tuple[float, float]:
    from bear.core.replay import estimate_many
    from bear.core.state import Query
    from bear.estimator.estimation import Dispatch, Estimator, Method

    estimator = Estimator(_remaining, {"Qwen3-8B": 200.0})
    ids = [f"instance-{k}" for k in range(instances)]
    for instance_id in ids:
        _add(estimator, instance_id, residents)
        for k in range(dispatches):  # routed since the snapshot, as a router records them
            estimator.record_dispatch(Dispatch(f"{instance_id}-d{k}", instance_id, "Qwen3-8B",
                                               NOW_S + 0.001 * (k + 1) / (dispatches + 1), 300 + 10 * k, 150.0))
    query, now_s = Query("q", 300, 100), NOW_S + 0.002
    answers = estimator.estimate(query, ids, now_s)
    if any(answer.method is not Method.REPLAY for answer in answers):
        raise SystemExit(f"the estimator did not replay: {answers[0].reason}")
    # the replay alone on the very inputs the estimator builds for it
    targets = [estimator._target(estimator._instances[i], estimator.calibration(i),  # noqa: SLF001
                                 estimator.snapshot(i), query, now_s - NOW_S, 0) for i in ids]
    if any(len(target.arrivals) != dispatches for target in targets):
        raise SystemExit(f"the replay did not take the {dispatches} dispatches per instance as arrivals")
    return (_median_us(lambda: estimator.estimate(query, ids, now_s), calls),
            _median_us(lambda: estimate_many(query, targets), calls))


def _add(estimator, instance_id: str, residents: int) -> None:  # noqa: ANN001 - Estimator
    from bear.core.batch_time import BatchTimeCoefficients
    from bear.estimator.estimation import Calibration
    from bear.v1 import snapshot_pb2

    engine = snapshot_pb2.EngineConfig(max_num_batched_tokens=8192, max_num_seqs=1024, block_size=16,
                                       num_gpu_blocks=200_000, max_model_len=32_768, enable_chunked_prefill=True,
                                       async_scheduling=True)
    blocks = -(-CONTEXT_TOKENS // 16)
    message = snapshot_pb2.InstanceSnapshot(
        instance_id=instance_id, pool="pool", model="Qwen3-8B", taken_at_s=NOW_S, read_at_s=NOW_S,
        sequence_number=1, engine=engine, next_step_index=11,
        num_free_blocks=engine.num_gpu_blocks - residents * blocks,
        running=[snapshot_pb2.RequestState(request_id=f"{instance_id}-r{k}", num_prompt_tokens=600,
                                           num_computed_tokens=CONTEXT_TOKENS, num_output_tokens=100,
                                           num_output_placeholders=1, num_allocated_blocks=blocks)
                 for k in range(residents)])
    step = message.step_in_progress
    step.step_index, step.started_at_s, step.execution_started_at_s = 10, NOW_S - 0.002, NOW_S - 0.002
    for k in range(residents):
        step.entries.add(request_id=f"{instance_id}-r{k}", num_decode_tokens=1, num_context_tokens=CONTEXT_TOKENS)
    estimator.add_instance(instance_id, "Qwen3-8B")
    estimator.set_calibration(instance_id, Calibration(BatchTimeCoefficients(0.004, 2e-5, 1e-8, 1e-9),
                                                       prefill_tokens_per_s=40_000.0))
    estimator.update_snapshot(message, NOW_S + 0.001)


def _remaining(model: str, predicted: np.ndarray, generated: np.ndarray, max_tokens: np.ndarray) -> np.ndarray:
    return np.maximum(predicted - generated, 1.0)


def _median_us(call, calls: int) -> float:  # noqa: ANN001 - a callable
    for _ in range(min(50, calls)):
        call()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


if __name__ == "__main__":
    raise SystemExit(main())
