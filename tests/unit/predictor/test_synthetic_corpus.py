"""The synthetic demo table: seeded, labelled synthetic, the four regimes of Appendix A.3 with their length ranges,
Table 2's mean scores, and scores that depend on what the prompt shows."""

from __future__ import annotations

import numpy as np
import pytest

from bear.predictor.catalog import PAPER_POOL
from bear.predictor.synthetic_corpus import JUDGE_SCALE, MODELS, SOURCE, TABLE2_MEAN_SCORE, TASKS, generate
from bear.predictor.synthetic_prompts import BUILDERS
from bear.predictor.tokenizers import get_tokenizer
from tests.predictor_builders import synthetic_corpus, synthetic_table

ROWS, SEED = 2400, 21


def test_the_same_seed_gives_the_same_table_and_another_seed_another() -> None:
    a, b, c = generate(90, 5).table, generate(90, 5).table, generate(90, 6).table
    assert a.prompts == b.prompts and np.array_equal(a.scores, b.scores)
    assert np.array_equal(a.output_tokens, b.output_tokens)
    assert a.prompts != c.prompts


def test_every_prompt_is_answered_by_every_model_of_the_papers_pool() -> None:
    table = generate(10, 1).table
    assert len(table) == 10 and PAPER_POOL.names == MODELS
    assert table.models[:6] == MODELS * 2 and table.prompts[0] == table.prompts[2] != table.prompts[3]
    assert SOURCE.startswith("bear-synthetic")
    with pytest.raises(ValueError, match="num_rows must be >= 1"):
        generate(0, 1)


def test_tasks_are_balanced_and_scores_are_judge_steps() -> None:
    table = synthetic_table(ROWS, SEED)
    tasks, counts = np.unique(np.asarray(table.tasks), return_counts=True)
    assert set(tasks) == set(TASKS) and counts.max() - counts.min() <= 3
    steps = table.scores * JUDGE_SCALE
    assert np.allclose(steps, np.rint(steps)) and table.scores.min() >= 0 and table.scores.max() <= 1


def test_mean_scores_per_task_match_table_2() -> None:
    realised = synthetic_corpus(ROWS, SEED).mean_scores()
    for task, targets in TABLE2_MEAN_SCORE.items():
        for model, target in zip(MODELS, targets, strict=True):
            # 200 prompts a task: the judge's binomial noise alone has a standard error of at most 0.011.
            assert realised[task][model] == pytest.approx(target, abs=0.045), (task, model)


def test_prompt_and_response_lengths_span_the_regimes_of_appendix_a3() -> None:
    table = synthetic_table(ROWS, SEED)
    qwen = get_tokenizer("qwen")
    tasks = np.asarray(table.tasks[::3])
    prompt_tokens = np.array([qwen.token_keys(p).size for p in table.prompts[::3]])
    median_prompt = {t: np.median(prompt_tokens[tasks == t]) for t in TASKS}
    median_output = {t: np.median(table.output_tokens[np.asarray(table.tasks) == t]) for t in TASKS}
    assert prompt_tokens.min() <= 15 and prompt_tokens.max() >= 8000  # ~10 to ~10^4
    assert median_prompt["instruction"] < 60 and median_prompt["creative_writing"] < 60
    assert 500 < median_prompt["multidoc_qa"] < 2000 and median_prompt["long_summarization"] > 3000
    assert median_output["instruction"] < 300 and median_output["multidoc_qa"] < 200  # short answers
    assert median_output["long_summarization"] > 350 and median_output["creative_writing"] > 500  # long answers
    assert 100 <= np.median(table.output_tokens) <= 1000 and table.output_tokens.max() <= 4096


def test_scores_fall_with_what_makes_a_prompt_visibly_harder() -> None:
    rng = np.random.default_rng(0)
    for task, build in BUILDERS.items():
        hardness = np.array([build(rng).hardness for _ in range(200)])
        assert hardness.std() > 0.2, task  # every regime varies in visible difficulty
    table = synthetic_table(ROWS, SEED)
    summaries = np.flatnonzero((np.asarray(table.tasks) == "long_summarization")
                               & (np.asarray(table.models) == "Qwen3-0.6B"))
    lengths = np.array([len(table.prompts[i]) for i in summaries])
    scores = table.scores[summaries]
    long_half = lengths > np.median(lengths)
    assert scores[long_half].mean() < scores[~long_half].mean() - 0.05  # the small model fails on long reports
