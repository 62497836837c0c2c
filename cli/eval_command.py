"""`bear eval quick|full --out DIR`: the paper's experiments on a simulated H100 pool (synthetic workload)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "eval",
        help="run the evaluation on a simulated pool",
        description="Simulates the paper's pool (Qwen3-0.6B, 8B, 32B on H100s; step times from measured kernel "
        "tables) in virtual time, trains the predictor on a synthetic evaluation table, calibrates each instance, "
        "and routes fresh synthetic queries with every policy. `quick` (a few minutes) writes summary.json and the "
        "rate-sweep figures; `full` adds every experiment.",
    )
    parser.add_argument("mode", choices=("quick", "full"))
    parser.add_argument("--out", type=Path, required=True, help="output folder (created)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from bear.evaluation import runs  # heavy: only when the command runs

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        summary = (runs.quick if args.mode == "quick" else runs.full)(args.out, _progress, say)
    except OSError as error:
        print(f"bear eval: --out {args.out}: {error.strerror or error}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ("saturation_qps", "ttft_mape", "batch_time_mape", "bear_gain")}))
    return 0


def _progress(items: Iterable[T], description: str, total: int) -> Iterable[T]:
    from tqdm import tqdm

    return tqdm(items, desc=description, total=total, disable=not sys.stderr.isatty(), leave=False, file=sys.stderr)
