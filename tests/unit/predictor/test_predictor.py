"""The loaded predictor as a servicer will call it: per-model predictions with cost, remaining-length estimates, the
batch path agreeing with the single-prompt path, and clear errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bear.predictor.catalog import PAPER_POOL, Catalog, UnknownModelError
from bear.predictor.features import EmptyPromptError
from bear.predictor.predictor import Predictor
from bear.predictor.tokenizers import get_tokenizer
from bear.predictor.training import TrainingConfig, train
from tests.predictor_builders import PROMPTS, make_table, synthetic_table, trained_artifact


@pytest.fixture(scope="module")
def predictor() -> Predictor:
    return Predictor(trained_artifact())


def test_predictions_for_every_model_in_catalogue_order(predictor: Predictor) -> None:
    predictions = predictor.predict(PROMPTS[0])
    assert list(predictions) == ["Qwen3-0.6B", "Qwen3-8B", "Qwen3-32B"]
    for name, p in predictions.items():
        spec = predictor.catalog.spec(name)
        assert p.model == name and 0 <= p.accuracy <= 1 and p.output_tokens >= 1
        assert p.prompt_tokens == get_tokenizer("qwen").token_keys(PROMPTS[0]).size
        assert p.cost_usd == pytest.approx((p.prompt_tokens * spec.input_usd_per_mtok
                                            + p.output_tokens * spec.output_usd_per_mtok) / 1e6)


def test_the_predictions_follow_the_prompt(predictor: Predictor) -> None:
    short, story, report = (predictor.predict(p) for p in PROMPTS[:3])
    assert story["Qwen3-8B"].output_tokens > 2 * short["Qwen3-8B"].output_tokens
    assert report["Qwen3-32B"].prompt_tokens > 2000
    assert report["Qwen3-32B"].accuracy > report["Qwen3-0.6B"].accuracy


def test_a_subset_of_models(predictor: Predictor) -> None:
    chosen = predictor.predict(PROMPTS[1], ["Qwen3-32B", "Qwen3-0.6B"])
    assert list(chosen) == ["Qwen3-0.6B", "Qwen3-32B"]
    assert chosen["Qwen3-32B"] == predictor.predict(PROMPTS[1])["Qwen3-32B"]


def test_a_repository_id_names_the_catalogues_model(predictor: Predictor) -> None:
    """As Predict over gRPC takes them (vLLM and clients name models `org/name`)."""
    prompt = PROMPTS[0]
    assert predictor.predict(prompt, ["Qwen/Qwen3-8B"]) == predictor.predict(prompt, ["Qwen3-8B"])
    with pytest.raises(UnknownModelError, match="'Qwen/Qwen3-9B'"):
        predictor.predict(prompt, ["Qwen/Qwen3-9B"])


def test_the_batch_path_gives_the_single_prompt_numbers(predictor: Predictor) -> None:
    names = list(predictor.catalog.names)
    table = make_table([p for p in PROMPTS for _ in names], names * len(PROMPTS))
    accuracy, output_tokens = predictor.predict_table(table)
    single = [predictor.predict(p)[m] for p in PROMPTS for m in names]
    assert np.array_equal(accuracy, [s.accuracy for s in single])
    assert np.array_equal(output_tokens, [s.output_tokens for s in single])
    assert predictor.prompt_tokens(table).tolist() == [s.prompt_tokens for s in single]
    by_id = make_table([p for p in PROMPTS for _ in names], [f"Qwen/{m}" for m in names] * len(PROMPTS))
    assert np.array_equal(predictor.predict_table(by_id)[0], accuracy)  # repository ids, as Predict takes them
    assert predictor.evaluate(by_id) == predictor.evaluate(table)


def test_expected_remaining_tokens(predictor: Predictor) -> None:
    mean = predictor.predict(PROMPTS[1])["Qwen3-8B"].output_tokens
    assert predictor.expected_remaining_tokens("Qwen3-8B", mean, 0) == pytest.approx(mean)
    late = predictor.expected_remaining_tokens("Qwen3-8B", mean, int(2 * mean), max_tokens=int(2 * mean) + 50)
    assert 1 <= late <= 50
    assert predictor.expected_remaining_tokens("Qwen/Qwen3-8B", mean, 10) == \
        predictor.expected_remaining_tokens("Qwen3-8B", mean, 10)  # a repository id, as Predict takes it
    with pytest.raises(ValueError, match="max_tokens must exceed generated_tokens"):
        predictor.expected_remaining_tokens("Qwen3-8B", mean, 100, max_tokens=100)


def test_errors_name_the_problem(predictor: Predictor) -> None:
    with pytest.raises(EmptyPromptError, match="prompt is empty"):
        predictor.predict("   ")
    with pytest.raises(UnknownModelError, match="unknown model 'gpt-5'"):
        predictor.predict(PROMPTS[0], ["gpt-5"])
    with pytest.raises(UnknownModelError):
        predictor.expected_remaining_tokens("gpt-5", 100.0, 10)


def test_a_pool_with_two_tokenizers_counts_and_projects_each_models_own_tokens() -> None:
    mixed = Catalog((PAPER_POOL.spec("Qwen3-8B"), dataclasses.replace(PAPER_POOL.spec("Qwen3-32B"),
                                                                      tokenizer="pretokens")))
    table = synthetic_table(200, 8)
    keep = [i for i, m in enumerate(table.models) if m in mixed.names]
    artifact = train(make_table([table.prompts[i] for i in keep], [table.models[i] for i in keep],
                                table.scores[keep].tolist(), table.output_tokens[keep].tolist()),
                     mixed, TrainingConfig(num_trees=10))
    assert set(artifact.projections) == {"qwen", "pretokens"}
    predictor = Predictor(artifact)
    prompt = "Hello, world! Summarize this."
    predictions = predictor.predict(prompt)
    assert list(predictions) == ["Qwen3-8B", "Qwen3-32B"]
    assert predictions["Qwen3-8B"].prompt_tokens == get_tokenizer("qwen").token_keys(prompt).size
    assert predictions["Qwen3-32B"].prompt_tokens == 7  # Hello , world ! Summarize this .
    names = list(mixed.names)
    accuracy, _ = predictor.predict_table(make_table([prompt] * 2, names))
    assert accuracy.tolist() == [predictions[m].accuracy for m in names]
