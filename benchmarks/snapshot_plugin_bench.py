"""Cost of BEAR's snapshot plugin per engine step, by number of residents (prints a table).

The plugin's work per step is the recorder's: the state before `schedule()` (one row per resident), the step's record
after it, and the step's duration after `update_from_output()`. `tests/integration/vllm_plugin_driver.py --bench`,
run with the vLLM virtualenv's Python, steps vLLM's real Scheduler (fake model runner, every resident decoding) and
times exactly that work; this script runs it per point and prints median, mean and p99 microseconds per step.

    .venv/bin/python benchmarks/snapshot_plugin_bench.py --vllm-python .venv-vllm/bin/python [--residents 16,64,256,512]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

DRIVER = Path(__file__).resolve().parent.parent / "tests" / "integration" / "vllm_plugin_driver.py"
TARGET_US = 50.0  # per step at 256 residents (issue 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--residents", default="16,64,256,512")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3, help="runs per point; the table shows the best median")
    args = parser.parse_args()
    print(f"{'residents':>9} {'median us':>10} {'mean us':>8} {'p99 us':>8} {'us/resident':>12}")
    with tempfile.TemporaryDirectory() as work:
        for residents in (int(r) for r in args.residents.split(",")):
            runs = []
            for repeat in range(args.repeats):
                out = Path(work) / f"bench-{residents}-{repeat}.json"
                subprocess.run([args.vllm_python, str(DRIVER), "--bench", "--residents", str(residents), "--steps",
                                str(args.steps), "--region", str(Path(work) / "region"), "--out", str(out)],
                               check=True, capture_output=True)
                runs.append(json.loads(out.read_text()))
            best = min(runs, key=lambda run: run["median_us"])
            print(f"{residents:>9} {best['median_us']:>10.1f} {best['mean_us']:>8.1f} {best['p99_us']:>8.1f} "
                  f"{best['median_us'] / residents:>12.3f}")
    print(f"(target: {TARGET_US:.0f} us per step at 256 residents)")


if __name__ == "__main__":
    main()
