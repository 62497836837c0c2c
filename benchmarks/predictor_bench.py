"""Predictor speed: features + accuracy and output-length predictions for all models of the pool, one prompt a call.

Trains the predictor on the synthetic corpus (or loads --model-dir), then times `Predictor.predict(prompt)` — the whole
routing-path call: tokenisation, features, projection, both LightGBM models for the three Qwen3 models, cost — on
held-out synthetic prompts of each regime. It also times the parts on the same prompts: features alone, and the six
model evaluations through the C API (the production path) and through lightgbm.Booster.predict (the alternative),
and prints one row per regime with median and p99 in µs.

    python benchmarks/predictor_bench.py [--model-dir DIR | --train-rows 6000] [--prompts-per-task 50] [--calls 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import lightgbm
import numpy as np

from bear.cli.arguments import MAX_SEED, seed
from bear.predictor.catalog import PAPER_POOL
from bear.predictor.compiled_booster import CompiledBooster
from bear.predictor.features import (FEATURE_NAMES, PROJECTION_DIMENSIONS, model_features, prompt_features,
                                     rows_for_prompt)
from bear.predictor.predictor import Predictor, load_predictor
from bear.predictor.synthetic_corpus import TASKS, generate
from bear.predictor.tokenizers import get_tokenizer
from bear.predictor.training import MIN_ROWS_PER_MODEL, TrainingConfig, train

from arguments import int_at_least, positive_int

# The fewest synthetic rows training accepts. `generate` has every prompt answered by every model in turn (the last
# prompt perhaps by fewer), and `train` needs at least MIN_ROWS_PER_MODEL rows of each model (60 rows for the paper's
# three models) and more than 2 * PROJECTION_DIMENSIONS distinct prompts (97 rows: 33 prompts).
MIN_TRAIN_ROWS = max(MIN_ROWS_PER_MODEL * len(PAPER_POOL), 2 * PROJECTION_DIMENSIONS * len(PAPER_POOL) + 1)


def main() -> int:
    args = parse_args()
    predictor = _predictor(args)
    held_out = generate(args.prompts_per_task * len(TASKS) * len(PAPER_POOL), seed=args.seed + 1).table
    prompts_by_task = {task: list(dict.fromkeys(p for p, t in zip(held_out.prompts, held_out.tasks, strict=True)
                                               if t == task)) for task in TASKS}
    artifact = predictor.artifact
    tokenizer = get_tokenizer(PAPER_POOL.models[0].tokenizer)  # the paper's pool: one tokenizer, three models
    projection = artifact.projections[tokenizer.name]
    models = np.stack([model_features(m, i) for i, m in enumerate(PAPER_POOL)])
    texts = (artifact.accuracy_model, artifact.log_output_tokens_model)
    compiled = [CompiledBooster(text, len(FEATURE_NAMES)) for text in texts]
    boosters = [lightgbm.Booster(model_str=text) for text in texts]

    print(f"per-prompt wall time in µs over {args.calls} calls per prompt; {len(PAPER_POOL)} models; "
          f"{compiled[0].num_iterations} + {compiled[1].num_iterations} trees")
    header = (f"{'task':<20} {'prompts':>7} {'tokens':>7} | {'predict med':>11} {'p99':>8} | {'features':>8} "
              f"{'C API':>7} {'Booster':>8}")
    print(header)
    print("-" * len(header))
    everything: list[float] = []
    for task, prompts in prompts_by_task.items():
        times: dict[str, list[float]] = {"predict": [], "features": [], "c_api": [], "booster": []}
        tokens = []
        for prompt in prompts:
            rows = rows_for_prompt(prompt_features(prompt, tokenizer), projection, models)
            tokens.append(prompt_features(prompt, tokenizer).prompt_tokens)
            times["predict"] += _per_call_us(partial(predictor.predict, prompt), args.calls)
            times["features"] += _per_call_us(partial(prompt_features, prompt, tokenizer), args.calls)
            times["c_api"] += _per_call_us(partial(_score_all, compiled, rows), args.calls)
            times["booster"] += _per_call_us(partial(_score_all, boosters, rows), args.calls)
        everything += times["predict"]
        print(f"{task:<20} {len(prompts):>7} {int(np.median(tokens)):>7} | {np.median(times['predict']):>11.1f} "
              f"{np.percentile(times['predict'], 99):>8.1f} | {np.median(times['features']):>8.1f} "
              f"{np.median(times['c_api']):>7.1f} {np.median(times['booster']):>8.1f}")
    print(f"all prompts: predict median {np.median(everything):.1f} µs, p99 {np.percentile(everything, 99):.1f} µs "
          f"(target: median <= 300 µs)")
    return 0


def _predictor(args: argparse.Namespace) -> Predictor:
    if args.model_dir:
        return load_predictor(Path(args.model_dir))
    start = time.perf_counter()
    artifact = train(generate(args.train_rows, args.seed).table, PAPER_POOL, TrainingConfig(seed=args.seed))
    print(f"trained on {args.train_rows} synthetic rows in {time.perf_counter() - start:.1f} s")
    return Predictor(artifact)


def _score_all(models: list[CompiledBooster] | list[lightgbm.Booster], rows: np.ndarray) -> None:
    for model in models:
        model.predict(rows)


def _per_call_us(call: Callable[[], object], calls: int) -> list[float]:
    for _ in range(min(calls, 10)):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - start) / 1000.0)
    return times


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", help="a trained predictor (default: train one on the synthetic corpus)")
    parser.add_argument("--train-rows", type=int_at_least(MIN_TRAIN_ROWS), default=6000,
                        help=f"synthetic rows to train on without --model-dir, at least {MIN_TRAIN_ROWS} (default "
                             "6000)")
    parser.add_argument("--prompts-per-task", type=positive_int, default=50,
                        help="held-out prompts timed per task (default 50)")
    parser.add_argument("--calls", type=positive_int, default=200, help="timed calls per prompt (default 200)")
    parser.add_argument("--seed", type=seed, default=1,
                        help=f"of the training table and the held-out one, an integer in [0, {MAX_SEED}] (default 1)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
