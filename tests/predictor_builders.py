"""Small builders for the predictor's tests: tables that state only what a test is about, and one trained predictor
on a small synthetic corpus shared by every test that needs one (trained once per session, ~2 s)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from bear.predictor.artifact import PredictorArtifact
from bear.predictor.catalog import PAPER_POOL
from bear.predictor.evals import EvalTable
from bear.predictor.synthetic_corpus import SyntheticCorpus, generate
from bear.predictor.training import TrainingConfig, train

TRAIN_ROWS, TRAIN_SEED = 1500, 11
TEST_ROWS, TEST_SEED = 1200, 12
SMALL_CONFIG = TrainingConfig(num_trees=100)
PROMPTS = (
    "Give three tips for staying healthy. Answer in 50 words.",
    "[WP] A lighthouse keeper finds a map that changes every night. Write a story of about 800 words.",
    "Summarize the following government report.\n\n" + "The agency audit reviews the federal grant program. " * 300,
    "Answer the question using the documents below.\n\nDocument 1: Alder Plan\nThe treaty ended the siege.\n\n"
    "Question: Which treaty ended the siege?",
)


def make_table(prompts: Sequence[str], models: Sequence[str] | None = None, scores: Sequence[float] | None = None,
               output_tokens: Sequence[int] | None = None, tasks: Sequence[str] | None = None) -> EvalTable:
    n = len(prompts)
    return EvalTable(tuple(prompts), tuple(models or [PAPER_POOL.names[0]] * n),
                     np.array(scores if scores is not None else [0.5] * n, dtype=np.float64),
                     np.array(output_tokens if output_tokens is not None else [100] * n, dtype=np.int64),
                     tuple(tasks) if tasks is not None else None)


@functools.cache
def synthetic_corpus(rows: int, seed: int) -> SyntheticCorpus:
    return generate(rows, seed)


def synthetic_table(rows: int, seed: int) -> EvalTable:
    return synthetic_corpus(rows, seed).table


@functools.cache
def trained_artifact() -> PredictorArtifact:
    """The predictor trained on TRAIN_ROWS synthetic rows (seed TRAIN_SEED) with SMALL_CONFIG."""
    return train(synthetic_table(TRAIN_ROWS, TRAIN_SEED), PAPER_POOL, SMALL_CONFIG)
