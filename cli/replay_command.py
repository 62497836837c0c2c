"""`bear replay CASE.json [--repeat N]`: replay one case and print one JSON object (docs/replay-case.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bear.cli.arguments import int_in
from bear.common import strict_json
from bear.core.case import CaseError, parse_case, result_to_json
from bear.core.replay import ReplayEngine, estimate, prepare, replay
from bear.core.result import ReplayResult
from bear.core.state import InvalidState

EXIT_BAD_INPUT = 2
MAX_REPEAT = 10_000_000  # --repeat at most: about a minute of estimates
REPEAT_BUDGET_S = 60.0  # --repeat stops after this long (a case of long replays would take days at the most runs)
# Scheduled (request, tokens) entries printed at most (~30 MB of JSON): a long replay of many residents would hold
# and print gigabytes (a batch per step, every running request in each).
MAX_PRINTED_ENTRIES = 2_000_000


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "replay",
        help="replay one case until the query's first token",
        description="Replays vLLM's batch formation from the case's state until the query's first token and prints "
        "the batches, the first-token batch and the TTFT as JSON. Bad input exits 2.",
    )
    parser.add_argument("case", type=_case_path, help="case file (JSON, see docs/replay-case.md)")
    parser.add_argument("--repeat", type=int_in(1, MAX_REPEAT), metavar="N",
                        help=f"also print mean_estimate_us: mean wall time of one production-path estimate over N "
                        f"runs (at most {MAX_REPEAT}; fewer, as estimate_runs says, if they take over "
                        f"{REPEAT_BUDGET_S:g} s)")
    parser.add_argument("--engine", choices=[e.value for e in ReplayEngine], default=ReplayEngine.NATIVE.value,
                        help="replay engine for the printed result (default: native)")
    parser.set_defaults(handler=run)


def _case_path(text: str) -> Path:
    if not text.strip():  # "" (an unset shell variable) would read the current folder
        raise argparse.ArgumentTypeError("empty: name the case file (JSON)")
    return Path(text)


def run(args: argparse.Namespace) -> int:
    try:
        case = parse_case(_read_json(args.case))
        engine = ReplayEngine(args.engine)

        def run_case(engine: ReplayEngine, record_batches: bool) -> ReplayResult:
            return replay(case.state, case.query, case.coefficients, horizon_s=case.horizon_s,
                          record_batches=record_batches, query_cached_tokens=case.query_cached_tokens, engine=engine)

        # First without the batches (the compiled core holds nothing then): what recording them would hold.
        counted = run_case(ReplayEngine.NATIVE, False)
        entries = counted.num_batches * (len(case.state.running) + len(case.state.waiting) + 1)
        if entries <= MAX_PRINTED_ENTRIES:
            output = result_to_json(run_case(engine, True))
        else:
            size = f"{counted.num_batches} batches of up to {entries // counted.num_batches} requests"
            if engine is ReplayEngine.REFERENCE:  # it holds every batch whatever it prints
                return _bad_input(f"the case replays {size}, more than the reference engine is run on here "
                                  f"({MAX_PRINTED_ENTRIES} scheduled entries): use --engine native")
            output = result_to_json(counted)
            output["num_batches"] = counted.num_batches
            output["batches_omitted"] = f"{size}: more than the {MAX_PRINTED_ENTRIES} scheduled entries printed"
    except (CaseError, InvalidState) as error:
        return _bad_input(str(error))
    except MemoryError:  # the compiled core's std::bad_alloc: a case too large for this machine
        return _bad_input(f"{args.case}: the replay needs more memory than this machine has")
    if args.repeat:
        output["mean_estimate_us"], runs = _mean_estimate_us(case, args.repeat)
        if runs < args.repeat:
            output["estimate_runs"] = runs
    print(json.dumps(output, allow_nan=False))
    return 0


def _read_json(path: Path) -> object:
    """The case file's JSON document; CaseError says what is wrong with the file."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as error:
        raise CaseError(f"case: cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise CaseError(f"case: {path} is not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset "
                        f"{error.start})") from None
    try:
        return strict_json.loads(text)
    except strict_json.JsonError as error:
        raise CaseError(f"case: {error}") from None


def _mean_estimate_us(case, repeat: int) -> tuple[float, int]:  # noqa: ANN001 - bear.core.case.Case
    """The production path: the state prepared once (as the estimator does per snapshot), then estimates only; the
    mean over `repeat` runs, or over those done within REPEAT_BUDGET_S, and their number."""
    prepared = prepare(case.state)
    start = time.perf_counter_ns()
    budget_ns = start + int(REPEAT_BUDGET_S * 1e9)
    runs, stride = 0, 1
    while runs < repeat:
        estimate(prepared, case.query, case.coefficients, horizon_s=case.horizon_s,
                 query_cached_tokens=case.query_cached_tokens)
        runs += 1
        if runs == 1 and time.perf_counter_ns() - start < 1_000_000:
            stride = 64  # a clock read per run would cost ~5% of a run this short
        if runs % stride == 0 and time.perf_counter_ns() > budget_ns:
            break
    return (time.perf_counter_ns() - start) / runs / 1000.0, runs


def _bad_input(message: str) -> int:
    print(f"bear replay: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT
