"""`bear eval quick|full --out DIR`: the paper's experiments on a simulated H100 pool (synthetic workload)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from bear.cli.writable import make_folder, remove_made, write_problem

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
    parser.add_argument("--out", required=True, help="output folder (created; checked before the run)")
    parser.add_argument("--force", action="store_true",
                        help="write into --out even if it holds an earlier run's results (they are replaced)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    made: list[Path] = []
    problem = _out_problem(args.out, args.force, made)
    if problem:
        remove_made(made)
        print(f"bear eval: --out {args.out!r}: {problem}", file=sys.stderr)
        return 2
    from bear.evaluation import runs  # heavy: only when the command runs

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        summary = (runs.quick if args.mode == "quick" else runs.full)(Path(args.out), _progress, say)
    except OSError as error:
        remove_made(made)
        print(f"bear eval: --out {args.out}: {error.strerror or error}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ("saturation_qps", "ttft_mape", "batch_time_mape", "bear_gain")}))
    return 0


_RESULT_SUFFIXES = (".json", ".md", ".csv", ".png")
SUMMARY = "summary.json"  # a run's, written at its end (bear.evaluation.runs)


def _out_problem(out: str, force: bool, made: list[Path]) -> str | None:
    """Why the results could not be written into `out` at the end of a run (minutes to an hour away), or None; the
    folder exists from here on (those of its folders that were made are added to `made`). A folder that holds an
    earlier run's results is refused unless `force` (QA: a second run wrote over the first's without a word)."""
    if not out.strip():
        return "empty: name the output folder"
    folder = Path(out)
    try:
        if folder.exists() and not folder.is_dir():
            return "exists and is not a folder"
        if not force and (folder / SUMMARY).is_file():
            return (f"holds the results of an earlier run ({SUMMARY}): pass --force to write over them, or name "
                    "another folder")
        made += make_folder(folder)
    except OSError as error:
        return f"cannot write there: {error.strerror or error}"
    problem = write_problem(folder)  # permissions alone do not tell (root; a read-only or special file system)
    if problem is not None:
        return f"cannot write there: {problem}"
    blocked = sorted(entry.name for entry in folder.iterdir()
                     if entry.suffix in _RESULT_SUFFIXES and entry.is_dir())  # a link to a folder too
    if blocked:  # a result file goes there (summary.json, figN.csv, ...)
        return f"{blocked[0]} in it is a folder, where a result file is written: remove or rename it"
    return None


def _progress(items: Iterable[T], description: str, total: int) -> Iterable[T]:
    from tqdm import tqdm

    return tqdm(items, desc=description, total=total, disable=not sys.stderr.isatty(), leave=False, file=sys.stderr)
