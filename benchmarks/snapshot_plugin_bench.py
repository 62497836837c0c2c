"""Cost of BEAR's snapshot plugin per engine step, by number of residents (prints a table).

The plugin's work per step is the recorder's: the state before `schedule()` (one row per resident), the step's record
after it, and the step's duration after `update_from_output()`. `tests/integration/vllm_plugin_driver.py --bench`,
run with the vLLM virtualenv's Python, steps vLLM's real Scheduler (fake model runner, every resident decoding) and
times exactly that work; this script runs it per point and prints median, mean and p99 microseconds per step.

    .venv/bin/python benchmarks/snapshot_plugin_bench.py --vllm-python .venv-vllm/bin/python [--residents 16,64,256,512]
        [--steps 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from arguments import positive_int, positive_int_list

DRIVER = Path(__file__).resolve().parent.parent / "tests" / "integration" / "vllm_plugin_driver.py"
TARGET_US = 50.0  # per step at 256 residents (issue 5)


def main() -> int:
    args = parse_args()
    print(f"{'residents':>9} {'median us':>10} {'mean us':>8} {'p99 us':>8} {'us/resident':>12}")
    with tempfile.TemporaryDirectory() as work:
        for residents in args.residents:
            runs = [_run_driver(args, residents, Path(work), repeat) for repeat in range(args.repeats)]
            best = min(runs, key=lambda run: run["median_us"])
            print(f"{residents:>9} {best['median_us']:>10.1f} {best['mean_us']:>8.1f} {best['p99_us']:>8.1f} "
                  f"{best['median_us'] / residents:>12.3f}")
    print(f"(target: {TARGET_US:.0f} us per step at 256 residents)")
    return 0


def _run_driver(args: argparse.Namespace, residents: int, work: Path, repeat: int) -> dict:
    """One run of the driver at `residents`; its summary. A failed run ends the script with the driver's stderr."""
    out = work / f"bench-{residents}-{repeat}.json"
    command = [args.vllm_python, str(DRIVER), "--bench", "--residents", str(residents), "--steps", str(args.steps),
               "--region", str(work / "region"), "--out", str(out)]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit(f"--vllm-python {args.vllm_python}: no such file (make vllm)") from None
    except subprocess.CalledProcessError as error:
        raise SystemExit(f"the plugin driver failed at {residents} residents (exit status {error.returncode}): "
                         f"{' '.join(command)}\n{error.stderr[-4000:]}") from None
    return json.loads(out.read_text())


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--residents", type=positive_int_list, default=[16, 64, 256, 512],
                        help="comma-separated numbers of residents (default 16,64,256,512)")
    parser.add_argument("--steps", type=positive_int, default=2000, help="timed engine steps per run (default 2000)")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="runs per point; the table shows the best median (default 3)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
