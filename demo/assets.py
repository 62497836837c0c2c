"""What the demo needs before it starts: a trained predictor, and prompts whose true outcomes the judge knows.

Both come from the SYNTHETIC evaluation tables (`bear.predictor.synthetic_corpus`): the predictor is trained on one
seed's table and cached (training takes tens of seconds; later runs load it), the workload's prompts come from another
seed's table, with every model's true judge score and output length, which routing never sees: they decide what each
instance generates and what a served query was worth.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bear.predictor.artifact import FORMAT_VERSION, PredictorArtifact
from bear.predictor.catalog import PAPER_POOL
from bear.predictor.progress import Progress, no_progress
from bear.predictor.synthetic_corpus import SOURCE, generate
from bear.predictor.training import TrainingConfig, train

TRAIN_ROWS = 6000  # prompts × models of the training table
TEST_SEED_OFFSET = 1000  # the prompts' table is another seed's


@dataclass(frozen=True, slots=True)
class DemoPrompt:
    text: str
    task: str
    true_score: dict[str, float]  # by model: the judge's verdict of its answer
    true_output_tokens: dict[str, int]  # by model: how long its answer is


def cache_folder() -> Path:
    """$BEAR_CACHE_DIR, else $XDG_CACHE_HOME/bear, else ~/.cache/bear."""
    explicit = os.environ.get("BEAR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bear"


def predictor_artifact(seed: int, folder: Path | None = None, progress: Progress = no_progress) -> Path:
    """A predictor trained on the synthetic table of `seed` (cached by everything that shapes it); its folder."""
    config = TrainingConfig(seed=seed)
    key = hashlib.sha256(json.dumps({"source": SOURCE, "rows": TRAIN_ROWS, "seed": seed, "format": FORMAT_VERSION,
                                     "config": repr(config), "pool": PAPER_POOL.names}).encode()).hexdigest()[:16]
    target = (folder or cache_folder()) / f"demo-predictor-{key}"
    try:
        PredictorArtifact.load(target)
        return target
    except Exception:  # noqa: BLE001 - missing, partial or from another version: train it again
        pass
    training = generate(TRAIN_ROWS, seed)
    train(training.table, PAPER_POOL, config, progress=progress).save(target, replace=True)
    return target


def demo_prompts(seed: int, num_prompts: int) -> list[DemoPrompt]:
    """`num_prompts` prompts answered by every model of the pool, from the table of another seed than training's."""
    table = generate(num_prompts * len(PAPER_POOL), seed + TEST_SEED_OFFSET).table
    by_text: dict[str, DemoPrompt] = {}
    tasks: Sequence[str] = table.tasks or ("",) * len(table)
    for text, model, score, length, task in zip(table.prompts, table.models, table.scores, table.output_tokens, tasks,
                                                strict=True):
        prompt = by_text.setdefault(text, DemoPrompt(text, task, {}, {}))
        prompt.true_score[model] = float(score)
        prompt.true_output_tokens[model] = int(length)
    return [p for p in by_text.values() if len(p.true_score) == len(PAPER_POOL.names)]
