"""Training: deterministic, learns something real on held-out synthetic data, refuses tables it cannot learn from."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bear.predictor.catalog import PAPER_POOL, Catalog
from bear.predictor.evals import EvalsError
from bear.predictor.predictor import Predictor
from bear.predictor.training import TrainingConfig, train
from tests.predictor_builders import TEST_ROWS, TEST_SEED, make_table, synthetic_table, trained_artifact

# The stated margins on held-out synthetic data (TRAIN_ROWS rows to learn from, TEST_ROWS other rows to judge on):
SPEARMAN_OVER_CONSTANT = 0.35  # a constant ranks nothing (Spearman 0); the learned models reach 0.45–0.67
MAE_RATIO = 0.95  # accuracy MAE at most 95% of the best constant's (learned: 0.75–0.89 of it)
MAPE_RATIO = 0.85  # length MAPE at most 85% of the MAPE-optimal constant's (learned: 0.76–0.80 of it)


def test_learned_models_beat_the_constant_baseline_on_held_out_data() -> None:
    report = Predictor(trained_artifact()).evaluate(synthetic_table(TEST_ROWS, TEST_SEED))
    assert list(report["models"]) == list(PAPER_POOL.names)
    for model in PAPER_POOL.names:
        learned, constant = report["models"][model], report["constant_baseline"][model]
        assert constant["accuracy_spearman"] == 0.0
        assert learned["accuracy_spearman"] >= constant["accuracy_spearman"] + SPEARMAN_OVER_CONSTANT, model
        assert learned["accuracy_mae"] <= MAE_RATIO * constant["accuracy_mae"], model
        assert learned["length_mape"] <= MAPE_RATIO * constant["length_mape"], model


def test_predicted_means_add_up_to_real_lengths() -> None:
    table = synthetic_table(TEST_ROWS, TEST_SEED)
    _, output_tokens = Predictor(trained_artifact()).predict_table(table)
    assert output_tokens.sum() == pytest.approx(table.output_tokens.sum(), rel=0.1)
    models = np.asarray(table.models)
    for model in PAPER_POOL.names:  # 400 rows a model: a handful of runaway responses move a model's sum by ~10%
        rows = models == model
        assert output_tokens[rows].sum() == pytest.approx(table.output_tokens[rows].sum(), rel=0.2), model


def test_training_is_deterministic() -> None:
    table = synthetic_table(150, 3)
    config = TrainingConfig(num_trees=10)
    first, second = train(table, PAPER_POOL, config), train(table, PAPER_POOL, config)
    assert first.accuracy_model == second.accuracy_model
    assert first.log_output_tokens_model == second.log_output_tokens_model
    assert np.array_equal(first.projections["qwen"].components, second.projections["qwen"].components)
    for model in PAPER_POOL.names:
        a, b = first.length_distributions[model], second.length_distributions[model]
        assert np.array_equal(a.ratios, b.ratios) and a.scale_to_mean == b.scale_to_mean
    other = train(table, PAPER_POOL, dataclasses.replace(config, seed=1))
    assert other.accuracy_model != first.accuracy_model


def test_rows_naming_models_by_repository_id_train_the_catalogues_models() -> None:
    # operators log vLLM's served names (Qwen/Qwen3-8B), which Predict calls already take
    table = synthetic_table(150, 3)
    by_id = dataclasses.replace(table, models=tuple(f"Qwen/{model}" for model in table.models))
    config = TrainingConfig(num_trees=5)
    assert train(by_id, PAPER_POOL, config).accuracy_model == train(table, PAPER_POOL, config).accuracy_model


def test_a_model_outside_the_catalogue_is_named_with_its_row() -> None:
    table = make_table([f"prompt {i}" for i in range(3)], ["Qwen3-8B", "Qwen3-8B", "Llama-3-8B"])
    with pytest.raises(EvalsError, match="evals row 3: model 'Llama-3-8B' is not in the catalogue"):
        train(table, PAPER_POOL, TrainingConfig(num_trees=5))


def test_every_catalogue_model_needs_rows() -> None:
    only_one_model = Catalog((PAPER_POOL.spec("Qwen3-8B"), PAPER_POOL.spec("Qwen3-32B")))
    table = make_table([f"List {i} rivers." for i in range(40)], ["Qwen3-8B"] * 40)
    with pytest.raises(EvalsError, match="model 'Qwen3-32B' has 0 rows; training needs at least 20"):
        train(table, only_one_model, TrainingConfig(num_trees=5))


def test_too_few_distinct_prompts() -> None:
    one_model = Catalog((PAPER_POOL.spec("Qwen3-8B"),))
    table = make_table([f"List {i % 10} rivers." for i in range(40)], ["Qwen3-8B"] * 40)
    with pytest.raises(EvalsError, match="10 distinct prompts; training needs more than 32"):
        train(table, one_model, TrainingConfig(num_trees=5))


@pytest.mark.parametrize("change", [{"num_trees": 0}, {"learning_rate": 0}, {"num_folds": 1}, {"tail_fraction": 0.6}])
def test_bad_configs(change: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        TrainingConfig(**change)  # type: ignore[arg-type]
