"""Replay speed: the compiled core (production path) vs the Python reference vs stepping vLLM's real scheduler.

Cases come from vLLM itself (tests/conformance/vllm_driver.py --bench, run with the vLLM virtualenv's Python): states
with about R resident requests under budgets B, a new query, and the wall time vLLM's own scheduler took to step from
the snapshot to the query's first token. For each case this script times the estimate through the production path
(`estimate` on a state prepared once, as the estimator service does), the bare compiled call, and the Python
reference, checks that the replay's first-token batch equals vLLM's, and prints one row per (R, B) with ratios
measured in the same run.

    python benchmarks/replay_bench.py --vllm-python .venv-vllm/bin/python [--residents 16,64,128,512]
        [--budgets 2048,8192] [--cases-per-point 5] [--calls 300] [--cases FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bear.core import _native
from bear.core.case import parse_case
from bear.core.replay import DEFAULT_MAX_STEPS, ReplayEngine, estimate, prepare, replay

from arguments import positive_int, positive_int_list

DRIVER = Path(__file__).resolve().parent.parent / "tests" / "conformance" / "vllm_driver.py"


def main() -> int:
    args = parse_args()
    records = _load_cases(args)
    if not records:
        raise SystemExit("no bench cases to measure (an empty --cases file, or the driver skipped every case)")
    rows: dict[tuple[int, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        point = (record["meta"]["bench"]["residents"], record["meta"]["bench"]["budget"])
        for key, values in _measure(record, args.calls).items():
            rows[point][key].extend(values)
    _print_table(rows)
    return 0


def _measure(record: dict, calls: int) -> dict[str, list[float]]:
    case = parse_case(record["case"])
    prepared = prepare(case.state)
    result = estimate(prepared, case.query, case.coefficients)
    if result.first_token_batch != record["expected"]["first_token_batch"]:
        raise SystemExit(f"replay disagrees with vLLM on bench case {record['meta']}: "
                         f"{result.first_token_batch} vs {record['expected']['first_token_batch']}")
    production = _per_call_us(lambda: estimate(prepared, case.query, case.coefficients), calls)
    query = _native.Query(case.query.num_prompt_tokens, case.query.output_tokens)
    coefficients = _native.BatchTimeCoefficients(*(getattr(case.coefficients, b) for b in ("b0", "b1", "b2", "b3")))
    # The bare compiled call as estimate() makes it: no horizon, no recorded batches, shortcuts on, the query at time 0
    # with nothing in flight and no arrivals.
    core_arguments = (prepared.native, query, coefficients, math.inf, False, True, DEFAULT_MAX_STEPS, 0.0, 0.0, [])
    core = _per_call_us(lambda: _native.replay(*core_arguments), calls)
    reference = _per_call_us(
        lambda: replay(case.state, case.query, case.coefficients, engine=ReplayEngine.REFERENCE), 3)
    return {
        "production_us": production,
        "core_us": core,
        "reference_us": [statistics.mean(reference)],
        "vllm_us": [float(sum(record["vllm_step_us"]))],
        "batches": [float(result.num_batches)],
        "steps": [float(result.num_steps)],
    }


def _per_call_us(call, calls: int) -> list[float]:
    """Wall time of each of `calls` calls after a few warm-up calls (every case weighs the same)."""
    for _ in range(min(calls, 5)):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - start) / 1000.0)
    return times


def _print_table(rows: dict[tuple[int, int], dict[str, list[float]]]) -> None:
    """Per (residents, budget): per-estimate times pooled over the cases (each case timed equally often)."""
    header = (f"{'residents':>9} {'budget':>6} {'cases':>5} {'batches':>8} {'stepped':>8} | {'C++ mean':>9} "
              f"{'median':>8} {'p99':>8} {'core':>7} | {'Python':>10} {'vLLM':>11} | {'Py/C++':>7} {'vLLM/C++':>9}")
    print("per-estimate wall time in µs; batches = simulated batches to the first token (median), stepped = batches "
          "simulated one by one (median); ratios from means")
    print(header)
    print("-" * len(header))
    for (residents, budget), m in sorted(rows.items()):
        production = np.array(m["production_us"])
        mean = production.mean()
        print(f"{residents:>9} {budget:>6} {len(m['vllm_us']):>5} {statistics.median(m['batches']):>8.0f} "
              f"{statistics.median(m['steps']):>8.0f} | {mean:>9.2f} {np.median(production):>8.2f} "
              f"{np.percentile(production, 99):>8.2f} {np.mean(m['core_us']):>7.2f} | "
              f"{np.mean(m['reference_us']):>10.0f} {np.mean(m['vllm_us']):>11.0f} | "
              f"{np.mean(m['reference_us']) / mean:>7.0f} {np.mean(m['vllm_us']) / mean:>9.0f}")
    everything = {key: [v for m in rows.values() for v in m[key]] for key in ("production_us", "reference_us", "vllm_us")}
    mean = float(np.mean(everything["production_us"]))
    print(f"all cases: C++ mean {mean:.2f} µs; Python reference {np.mean(everything['reference_us']) / mean:.0f}x "
          f"and vLLM {np.mean(everything['vllm_us']) / mean:.0f}x slower (ratio of means)")


def _load_cases(args: argparse.Namespace) -> list[dict]:
    if args.cases:
        return [json.loads(line) for line in Path(args.cases).read_text().splitlines()]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "bench.jsonl"
        subprocess.run([args.vllm_python, str(DRIVER), "--bench", "--residents", _commas(args.residents),
                        "--budgets", _commas(args.budgets), "--cases-per-point", str(args.cases_per_point),
                        "--seed", str(args.seed), "--mode", "sync", "--out", str(out)], check=True)
        return [json.loads(line) for line in out.read_text().splitlines()]


def _commas(values: list[int]) -> str:
    return ",".join(map(str, values))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--cases", help="reuse a file written by vllm_driver.py --bench instead of generating one")
    parser.add_argument("--residents", type=positive_int_list, default=[16, 64, 128, 512],
                        help="comma-separated numbers of resident requests (default 16,64,128,512)")
    parser.add_argument("--budgets", type=positive_int_list, default=[2048, 8192],
                        help="comma-separated token budgets per step (default 2048,8192)")
    parser.add_argument("--cases-per-point", type=positive_int, default=5, help="cases per (residents, budget)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--calls", type=positive_int, default=300, help="timed estimates per case (compiled core)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
