"""The C-API path scores exactly what lightgbm.Booster.predict scores, on both of its paths, and fails clearly."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import lightgbm
import numpy as np
import pytest

from bear.predictor.compiled_booster import SINGLE_ROW_MAX, BoosterError, CompiledBooster


@pytest.fixture(scope="module")
def booster() -> lightgbm.Booster:
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(2000, 6))
    rows[:, 5] = rng.integers(0, 3, 2000)
    labels = rows[:, 0] ** 2 + (rows[:, 5] == 1) * 2 + rng.normal(size=2000) * 0.1
    data = lightgbm.Dataset(rows, label=labels, categorical_feature=[5], params={"verbosity": -1})
    return lightgbm.train({"objective": "huber", "verbosity": -1, "num_threads": 1, "deterministic": True}, data, 60)


@pytest.mark.parametrize("num_rows", [1, 3, SINGLE_ROW_MAX, SINGLE_ROW_MAX + 1, 500])
def test_same_numbers_as_booster_predict(booster: lightgbm.Booster, num_rows: int) -> None:
    rows = np.random.default_rng(num_rows).normal(size=(num_rows, 6))
    rows[:, 5] = np.arange(num_rows) % 4  # includes a category never seen in training
    compiled = CompiledBooster(booster.model_to_string(), 6)
    assert np.array_equal(compiled.predict(rows), booster.predict(rows))
    assert np.array_equal(compiled.predict(np.asfortranarray(rows)), booster.predict(rows))


def test_wrong_shapes_and_bad_models_are_errors(booster: lightgbm.Booster) -> None:
    with pytest.raises(BoosterError, match="expects 6 features, the feature spec has 7"):
        CompiledBooster(booster.model_to_string(), 7)
    compiled = CompiledBooster(booster.model_to_string(), 6)
    with pytest.raises(ValueError, match="expected rows of 6 features"):
        compiled.predict(np.zeros((2, 5)))
    assert compiled.predict(np.zeros((0, 6))).shape == (0,)
    compiled.close()
    compiled.close()
    with pytest.raises(BoosterError, match="closed"):
        compiled.predict(np.zeros((1, 6)))
    with pytest.raises(BoosterError):
        CompiledBooster("tree\nversion=v4\nnot a model", 6)


def test_one_model_serves_several_threads(booster: lightgbm.Booster) -> None:
    compiled = CompiledBooster(booster.model_to_string(), 6)
    batches = [np.random.default_rng(seed).normal(size=(3, 6)) for seed in range(64)]
    expected = [booster.predict(rows) for rows in batches]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(compiled.predict, batches))
    assert all(np.array_equal(r, e) for r, e in zip(results, expected, strict=True))
