"""`bear demo`: BEAR on this machine, no GPU: embedded Redis, the services, a simulated pool in real time, a
Poisson workload through the Router API, and OnTimeUtility per policy."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bear.cli.arguments import MAX_SEED, positive_number, seed

EXIT_BAD_INPUT = 2


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo", help="run BEAR end to end on a simulated pool (one machine, no GPU)",
        description="Starts an embedded Redis, the predictor, estimator and router services and a simulated pool of "
        "Qwen3-0.6B, 8B and 32B on H100s running in real time (each instance publishing snapshots through the "
        "snapshotter), sends the same Poisson workload through the Router gRPC API once per policy, and prints "
        "OnTimeUtility, SLO attainment, routing mix and Route latency. The first run also trains the predictor on "
        "the synthetic evaluation table (cached).")
    parser.add_argument("--duration", type=_seconds, default=60.0, metavar="SECONDS",
                        help="seconds of traffic, warm-up included, shared equally by the policies (default 60; "
                             "at least 10, at most a day)")
    parser.add_argument("--rate", type=_rate, default=20.0, metavar="QPS",
                        help="Poisson arrival rate, queries per second (default 20; the pool saturates near 40)")
    parser.add_argument("--policies", default="bear,score,routebalance",
                        help="comma-separated policy names, the first compared with the others "
                             "(default bear,score,routebalance)")
    parser.add_argument("--seed", type=seed, default=0, help=f"an integer in [0, {MAX_SEED}] (default 0)")
    parser.add_argument("--looseness", type=positive_number, default=1.0, help="TTFT targets × this (default 1)")
    parser.add_argument("--json", type=_path, metavar="FILE",
                        help="also write the results as JSON (its folder is created if missing)")
    parser.add_argument("--redis-url", default="", help="use this Redis instead of the embedded one")
    parser.add_argument("--run-folder", type=_path, help="where service logs go (default: a new temporary folder)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from bear.demo.runner import DemoConfig, DemoInterrupted, check_policies, run_demo

    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    try:
        config = DemoConfig(duration_s=args.duration, rate_qps=args.rate, policies=policies, seed=args.seed,
                            looseness=args.looseness, redis_url=args.redis_url, run_folder=args.run_folder)
        check_policies(config.policies)  # before any folder is made (QA: a refused run left the --json folder)
    except ValueError as error:
        print(f"bear demo: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    problem = _run_folder_problem(args.run_folder) or _json_problem(args.json) or _cache_problem()
    if problem:
        print(f"bear demo: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        report = run_demo(config)
    except ValueError as error:
        print(f"bear demo: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RuntimeError as error:
        print(f"bear demo: {error}", file=sys.stderr)
        return 1
    except DemoInterrupted as interrupted:  # its services and pool are stopped
        print(f"bear demo: {interrupted}", file=sys.stderr)
        if interrupted.report is not None:  # the turns that finished
            _write(interrupted.report, args.json)
        return 128 + interrupted.signum
    except KeyboardInterrupt:
        print("bear demo: interrupted", file=sys.stderr)
        return 128 + 2
    return 0 if _write(report, args.json) else EXIT_BAD_INPUT


def _write(report: dict[str, object], path: Path | None) -> bool:
    """Writes --json FILE, if given; False (said on stderr) if it could not."""
    from bear.demo.runner import write_json

    if path is None:
        return True
    try:
        write_json(report, path)
    except OSError as error:
        print(f"bear demo: --json {path}: {error.strerror or error}", file=sys.stderr)
        return False
    return True


def _run_folder_problem(folder: Path | None) -> str | None:
    """Why --run-folder cannot be used, found before anything starts (None: it can; it exists from here on)."""
    if folder is None:
        return None
    try:
        if folder.exists() and not folder.is_dir():
            return f"--run-folder {folder}: exists and is not a folder"
    except OSError as error:  # a name the file system refuses (too long)
        return f"--run-folder {folder}: {error.strerror or error}"
    return _folder_problem("--run-folder", folder, folder)


def _cache_problem() -> str | None:
    """Why the folder the demo's predictor is cached in cannot be used, found before anything starts."""
    from bear.demo.assets import cache_folder

    folder = cache_folder()
    name = "BEAR_CACHE_DIR" if os.environ.get("BEAR_CACHE_DIR") else "the cache folder"
    try:
        if folder.exists() and not folder.is_dir():
            return f"{name} {folder}: exists and is not a folder"
    except OSError as error:
        return f"{name} {folder}: {error.strerror or error}"
    return _folder_problem(name, folder, folder)


def _json_problem(path: Path | None) -> str | None:
    """Why --json FILE could not be written at the end of the run, found before the run (None: it can be; its
    folder exists from here on)."""
    if path is None:
        return None
    try:
        if path.is_dir():
            return f"--json {path}: is a folder"
        if path.exists() and not os.access(path, os.W_OK):
            return f"--json {path}: not writable"
    except OSError as error:
        return f"--json {path}: {error.strerror or error}"
    return _folder_problem("--json", path, path.parent)


def _folder_problem(flag: str, given: Path, folder: Path) -> str | None:
    """Creates `folder` (and its parents) if missing; why it cannot be created or written in, or None."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # (QA: "/etc/passwd: File exists")
        return f"{flag} {given}: cannot create the folder {folder}: a file is in the way"
    except OSError as error:
        return f"{flag} {given}: cannot create the folder {folder}: {error.strerror or error}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{flag} {given}: cannot write in the folder {folder}"
    return None


def _path(text: str) -> Path:
    """A path given to a flag: not empty (QA: `--run-folder "$DIR"` with DIR unset wrote the run into the current
    folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: name a path")
    return Path(text)


def _seconds(text: str) -> float:
    from bear.demo.runner import MAX_DURATION_S  # the run's own limit (imported when the demo runs anyway)

    value = positive_number(text)
    if value < 10:
        raise argparse.ArgumentTypeError(f"must be at least 10 seconds (warm-up and one turn per policy), got {text}")
    if value > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DURATION_S:g} seconds (a day), got {text}")
    return value


def _rate(text: str) -> float:
    value = positive_number(text)
    if value > 1000:
        raise argparse.ArgumentTypeError(f"must be at most 1000 queries per second, got {text}")
    return value
