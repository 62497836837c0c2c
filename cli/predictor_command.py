"""`bear predictor train|evaluate|predict|synth`: train the accuracy and output-length predictor from an evaluation
table, measure it, query it, or write the synthetic demo table. Each prints one JSON object; bad input exits 2 with a
message naming the field, column or file. Progress bars go to stderr when it is a terminal.

The predictor's modules (LightGBM, pyarrow, the tokenizer) are imported when an action runs, not when the `bear`
command starts, so other subcommands do not pay for them."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from bear.cli.arguments import int_in, positive_int, seed
from bear.cli.writable import make_folder, remove_made
from bear.predictor.config import MAX_PROMPT_CHARS_LIMIT
from bear.predictor.training import MAX_TREES, TrainingConfig

EXIT_BAD_INPUT = 2
MAX_TOKENS = 2**32 - 1  # the Predict API's uint32 token counts
T = TypeVar("T")

# `synth --rows` at most: the table and its prompts are built in memory, ~20 kB a row (50,000 rows: 1.0 GB, 14 s;
# 2,000,000 ran out of 24 GB)
MAX_SYNTH_ROWS = 200_000


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "predictor", help="train, evaluate and query the accuracy / output-length predictor",
        description="The predictor of accuracy, output length and cost per prompt and model (paper Appendix A.4).")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    train_parser = actions.add_parser("train", help="train from an evaluation table and write a model directory")
    train_parser.add_argument("--evals", type=_path, required=True,
                              help="evaluation table (.parquet, .csv or .jsonl): prompt, model, score, output_tokens, "
                                   "optional task")
    train_parser.add_argument("--catalog", type=_path,
                              help="models YAML (prices in USD per million tokens); default: the paper's Qwen3 pool")
    train_parser.add_argument("--out", type=_path, required=True, help="model directory to write")
    train_parser.add_argument("--force", action="store_true", help="replace --out if it holds an earlier artifact")
    train_parser.add_argument("--seed", type=seed, default=0, help="a non-negative integer below 2**31 (default 0)")
    train_parser.add_argument("--num-trees", type=int_in(1, MAX_TREES), default=TrainingConfig().num_trees,
                              help=f"trees per LightGBM model, at most {MAX_TREES} "
                                   f"(default {TrainingConfig().num_trees})")
    train_parser.set_defaults(handler=_train)

    evaluate_parser = actions.add_parser("evaluate", help="metrics per model against a constant baseline")
    evaluate_parser.add_argument("--model-dir", type=_path, required=True)
    evaluate_parser.add_argument("--evals", type=_path, required=True, help="held-out evaluation table")
    evaluate_parser.set_defaults(handler=_evaluate)

    predict_parser = actions.add_parser("predict", help="accuracy, output tokens and cost of one prompt per model")
    predict_parser.add_argument("--model-dir", type=_path, required=True)
    prompt = predict_parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", type=_prompt_text, help="the prompt text")
    prompt.add_argument("--prompt-file", type=_path, help="a file holding the prompt")
    predict_parser.add_argument("--models", help="comma-separated model names (default: all)")
    predict_parser.add_argument("--generated-tokens", type=int_in(0, MAX_TOKENS - 1), metavar="G",
                                help="also print expected_remaining_tokens of a request that has generated G tokens")
    predict_parser.add_argument("--max-tokens", type=int_in(1, MAX_TOKENS), metavar="M",
                                help="its max_tokens (with G)")
    predict_parser.set_defaults(handler=_predict)

    synth_parser = actions.add_parser("synth", help="write the SYNTHETIC demo evaluation table (not real evaluations)")
    synth_parser.add_argument("--rows", type=_synth_rows, required=True,
                              help=f"rows of the table (prompts × models), at most {MAX_SYNTH_ROWS}")
    synth_parser.add_argument("--seed", type=seed, required=True, help="a non-negative integer below 2**31")
    synth_parser.add_argument("--out", type=_path, required=True, help="output file (.parquet, .csv or .jsonl)")
    synth_parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    synth_parser.set_defaults(handler=_synth)


def _train(args: argparse.Namespace) -> int:
    from bear.predictor.artifact import FORMAT_VERSION, save_problem, write_problem
    from bear.predictor.catalog import PAPER_POOL, read_catalog
    from bear.predictor.evals import read_eval_table
    from bear.predictor.tokenizers import KNOWN_TOKENIZERS
    from bear.predictor.training import train

    def work() -> dict[str, Any]:
        problem = save_problem(args.out, args.force)
        if problem is not None:
            hint = "" if args.force or save_problem(args.out, True) else " (use --force to replace it)"
            raise _Usage(f"out: {problem}{hint}")
        parent = Path(os.path.abspath(args.out)).parent
        try:  # the folders above --out, made for the check below, go again if the command fails
            made = make_folder(parent)
        except OSError as error:
            raise _Usage(f"--out: {args.out}: cannot write in {parent}: {error.strerror or error}") from None
        try:
            problem = write_problem(args.out)  # before the training, not after
            if problem is not None:
                raise _Usage(f"--out: {args.out}: {problem}")
            catalog = read_catalog(args.catalog, KNOWN_TOKENIZERS) if args.catalog else PAPER_POOL
            table = read_eval_table(args.evals)
            start = time.perf_counter()
            artifact = train(table, catalog, TrainingConfig(num_trees=args.num_trees, seed=args.seed), _progress)
            try:
                artifact.save(args.out, replace=True)
            except OSError as error:  # its message would name the sibling it is first written into
                raise _Usage(f"--out: cannot write {args.out}: {error.strerror or error}") from None
        except BaseException:
            remove_made(made)
            raise
        return {"out": str(args.out), "format_version": FORMAT_VERSION, "models": list(catalog.names),
                "num_rows": artifact.training["num_rows"], "num_prompts": artifact.training["num_prompts"],
                "train_s": round(time.perf_counter() - start, 2)}
    return _run("train", work)


def _evaluate(args: argparse.Namespace) -> int:
    from bear.predictor.evals import read_eval_table
    from bear.predictor.predictor import load_predictor

    def work() -> dict[str, Any]:
        predictor = load_predictor(args.model_dir)
        return predictor.evaluate(read_eval_table(args.evals), _progress)
    return _run("evaluate", work)


def _predict(args: argparse.Namespace) -> int:
    from bear.predictor.predictor import load_predictor

    def work() -> dict[str, Any]:
        if args.max_tokens is not None:
            if args.generated_tokens is None:
                raise _Usage("max-tokens: only with --generated-tokens")
            if args.max_tokens <= args.generated_tokens:
                raise _Usage("max-tokens: must exceed --generated-tokens")
        text = args.prompt if args.prompt is not None else _read_prompt(args.prompt_file)
        predictor = load_predictor(args.model_dir)
        models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models is not None else None
        if models == []:
            raise _Usage(f"models: no model name in {args.models!r}")
        out: dict[str, dict[str, Any]] = {}
        for name, p in predictor.predict(text, models).items():
            if not (math.isfinite(p.output_tokens) and math.isfinite(p.cost_usd)):  # a model out of its range
                raise _Usage(f"model-dir: {args.model_dir} predicts {p.output_tokens!r} output tokens for {name}")
            out[name] = {"accuracy": round(p.accuracy, 4), "output_tokens": round(p.output_tokens, 1),
                         "prompt_tokens": p.prompt_tokens, "cost_usd": p.cost_usd}
            if args.generated_tokens is not None:
                out[name]["expected_remaining_tokens"] = round(predictor.expected_remaining_tokens(
                    name, p.output_tokens, args.generated_tokens, args.max_tokens), 1)
        return {"models": out}
    return _run("predict", work)


def _synth(args: argparse.Namespace) -> int:
    from bear.predictor.catalog import PAPER_POOL
    from bear.predictor.evals import check_table_path, write_eval_table
    from bear.predictor.synthetic_corpus import SOURCE, TABLE2_MEAN_SCORE, generate

    def work() -> dict[str, Any]:
        if args.out.is_dir():
            raise _Usage(f"--out: {args.out} is a folder, not a file")
        check_table_path(args.out, "--out")  # before the table is built, not after
        if args.out.exists() and not args.force:  # it may be someone's real evaluations
            raise _Usage(f"--out: {args.out} exists (use --force to replace it with the synthetic table)")
        corpus = generate(args.rows, args.seed, _progress)
        try:
            write_eval_table(corpus.table, args.out, {"source": [SOURCE] * len(corpus.table)})
        except OSError as error:
            raise _Usage(f"--out: cannot write {args.out}: {error.strerror or error}") from None
        return {"synthetic": True, "source": SOURCE, "out": str(args.out), "rows": len(corpus.table),
                "prompts": corpus.num_prompts, "seed": args.seed,
                "mean_score": {task: {m: round(s, 4) for m, s in scores.items()}
                               for task, scores in corpus.mean_scores().items()},
                "table2_mean_score": {task: dict(zip(PAPER_POOL.names, scores, strict=True))
                                      for task, scores in TABLE2_MEAN_SCORE.items()}}
    return _run("synth", work)


class _Usage(ValueError):
    """A bad combination of options; the message names the option."""


def _run(action: str, work: Callable[[], dict[str, Any]]) -> int:
    from bear.predictor.artifact import ArtifactError
    from bear.predictor.catalog import CatalogError, UnknownModelError
    from bear.predictor.evals import EvalsError
    from bear.predictor.features import EmptyPromptError
    from bear.predictor.tokenizers import TokenizerUnavailable

    bad_input = (EvalsError, CatalogError, ArtifactError, EmptyPromptError, UnknownModelError, TokenizerUnavailable,
                 _Usage)
    try:
        output = work()
    except bad_input as error:
        print(f"bear predictor {action}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        print(f"bear predictor {action}: {where}{error.strerror or error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        text = json.dumps(output, allow_nan=False)
    except ValueError as error:  # inf or NaN: not JSON, and no answer
        print(f"bear predictor {action}: a result is not a finite number ({error})", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(text)
    return 0


def _read_prompt(path: Path) -> str:
    """The file's text, read no further than a prompt the predictor service could accept (/dev/zero never ends)."""
    try:
        with path.open(encoding="utf-8") as source:
            text = source.read(MAX_PROMPT_CHARS_LIMIT + 1)
    except (OSError, UnicodeDecodeError) as error:
        raise _Usage(f"prompt-file: cannot read {path}: {error}") from None
    if len(text) > MAX_PROMPT_CHARS_LIMIT:
        raise _Usage(f"prompt-file: {path} holds more than {MAX_PROMPT_CHARS_LIMIT} characters, the most a prompt "
                     "may have")
    return text


def _path(text: str) -> Path:
    """An argparse type: a path, not empty (Path("") would be the current folder) or blank (QA: `--out " "` made a
    folder named " ", and `--model-dir " "` loaded it)."""
    if not text:
        raise argparse.ArgumentTypeError("must be a path, got an empty string")
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must be a path, got only white space ({text!r})")
    return Path(text)


def _prompt_text(text: str) -> str:
    """An argparse type: the prompt, UTF-8 text as --prompt-file's must be (QA: a byte that is not, taken from the
    command line as a lone surrogate, was accepted here and refused there)."""
    from bear.common.config_sources import is_utf8

    if not is_utf8(text):
        raise argparse.ArgumentTypeError("not UTF-8 text (it holds a byte that is not)")
    return text


def _progress(items: Iterable[T], description: str, total: int) -> Iterable[T]:
    from tqdm import tqdm

    return tqdm(items, desc=description, total=total, disable=not sys.stderr.isatty(), leave=False, file=sys.stderr)


def _synth_rows(text: str) -> int:
    value = positive_int(text)
    if value > MAX_SYNTH_ROWS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SYNTH_ROWS} (the table is built in memory), "
                                         f"got {text!r}")
    return value
