"""`bear demo`: BEAR on this machine, no GPU: embedded Redis, the services, a simulated pool in real time, a
Poisson workload through the Router API, and OnTimeUtility per policy."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bear.cli.arguments import MAX_SEED, positive_number, seed
from bear.cli.writable import make_folder, remove_made, write_problem

if TYPE_CHECKING:
    from bear.demo.runner import DemoConfig

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
    parser.add_argument("--redis-url", type=_redis_url, metavar="URL",
                        help="use this Redis (redis://, rediss:// or unix://) instead of the embedded one")
    parser.add_argument("--run-folder", type=_path, help="where service logs go (default: a new temporary folder)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from bear.demo.runner import DemoConfig, check_policies

    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    try:
        config = DemoConfig(duration_s=args.duration, rate_qps=args.rate, policies=policies, seed=args.seed,
                            looseness=args.looseness, redis_url=args.redis_url or "", run_folder=args.run_folder)
        check_policies(config.policies)  # before any folder is made (QA: a refused run left the --json folder)
    except ValueError as error:
        print(f"bear demo: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    made: list[Path] = []  # the folders the checks made: removed again, if still empty, should the run fail
    code = EXIT_BAD_INPUT
    try:
        problem = _run_folder_problem(args.run_folder, made) or _json_problem(args.json, made) or _cache_problem(made)
        if problem:
            print(f"bear demo: {problem}", file=sys.stderr)
            return code
        code = _run(config, args.json)
        return code
    finally:
        if code != 0:
            _remove_made(made, args.run_folder)


def _run(config: DemoConfig, json_path: Path | None) -> int:
    """Runs the demo and writes --json; the exit status."""
    from bear.demo.runner import DemoInterrupted, run_demo

    try:
        report = run_demo(config)
    except ValueError as error:
        print(f"bear demo: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as error:  # a folder that could not be written after all (QA: a traceback)
        where = f"{error.filename}: " if error.filename else ""
        print(f"bear demo: {where}{error.strerror or error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RuntimeError as error:
        print(f"bear demo: {error}", file=sys.stderr)
        return 1
    except DemoInterrupted as interrupted:  # its services and pool are stopped
        print(f"bear demo: {interrupted}", file=sys.stderr)
        if interrupted.report is not None:  # the turns that finished
            _write(interrupted.report, json_path)
        return 128 + interrupted.signum
    except KeyboardInterrupt:
        print("bear demo: interrupted", file=sys.stderr)
        return 128 + 2
    return 0 if _write(report, json_path) else EXIT_BAD_INPUT


def _remove_made(made: list[Path], run_folder: Path | None) -> None:
    """Removes the folders the checks made that a failed or refused run left empty (a --run-folder made for it, too,
    if it holds nothing but its lock)."""
    from bear.demo.runner import remove_unused_run_folder

    if run_folder is not None and run_folder in made:
        remove_unused_run_folder(run_folder)
    remove_made(made)


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


def _run_folder_problem(folder: Path | None, made: list[Path]) -> str | None:
    """Why --run-folder cannot be used, found before anything starts (None: it can; it exists from here on)."""
    if folder is None:
        return None
    try:
        if folder.exists() and not folder.is_dir():
            return f"--run-folder {folder}: exists and is not a folder"
    except OSError as error:  # a name the file system refuses (too long)
        return f"--run-folder {folder}: {error.strerror or error}"
    return _folder_problem("--run-folder", folder, folder, made)


def _cache_problem(made: list[Path]) -> str | None:
    """Why the folder the demo's predictor is cached in cannot be used, found before anything starts."""
    from bear.demo.assets import cache_folder

    folder = cache_folder()
    name = "BEAR_CACHE_DIR" if os.environ.get("BEAR_CACHE_DIR") else "the cache folder"
    try:
        if folder.exists() and not folder.is_dir():
            return f"{name} {folder}: exists and is not a folder"
    except OSError as error:
        return f"{name} {folder}: {error.strerror or error}"
    return _folder_problem(name, folder, folder, made)


def _json_problem(path: Path | None, made: list[Path]) -> str | None:
    """Why --json FILE could not be written at the end of the run, found before the run (None: it can be; its
    folder exists from here on). A file that exists is opened to append to (nothing is written); else a file is
    written and removed in its folder."""
    if path is None:
        return None
    try:
        if path.is_dir():
            return f"--json {path}: is a folder"
        if path.exists():
            if path.is_file():  # (not a FIFO: opening one to write waits for a reader)
                os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
            elif not os.access(path, os.W_OK):
                return f"--json {path}: not writable"
            return None
    except OSError as error:
        return f"--json {path}: {error.strerror or error}"
    return _folder_problem("--json", path, path.parent, made)


def _folder_problem(flag: str, given: Path, folder: Path, made: list[Path]) -> str | None:
    """Creates `folder` (and its parents, added to `made`) if missing; why it cannot be created or written in, or
    None."""
    try:
        made += make_folder(folder)
    except (FileExistsError, NotADirectoryError):  # (QA: "/etc/passwd: File exists")
        return f"{flag} {given}: cannot create the folder {folder}: a file is in the way"
    except OSError as error:
        return f"{flag} {given}: cannot create the folder {folder}: {error.strerror or error}"
    problem = write_problem(folder)  # (QA: root passed os.access on /proc, and the run failed with a traceback)
    if problem is not None:
        return f"{flag} {given}: cannot write in the folder {folder}: {problem}"
    return None


def _redis_url(text: str) -> str:
    """An argparse type: a Redis URL the client would use as written, checked before anything starts (QA: one it
    could not use was refused only once the run had begun, its --json folder left behind)."""
    from bear.common.redis_config import RedisConfig

    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: name a Redis URL, or leave the flag out for the embedded Redis")
    url = text.strip()
    try:
        RedisConfig(url=url)
    except ValueError as error:  # its message names the variable the services read; this is the flag
        raise argparse.ArgumentTypeError(str(error).removeprefix("BEAR_REDIS_URL (--redis-url): ")) from None
    return url


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
