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


def _edit_tree(text: str, index: int, key: str, edit) -> str:  # noqa: ANN001 - edit: str -> str
    start = text.index(f"\nTree={index}\n")
    line_start = text.index(f"\n{key}=", start) + 1
    line_end = text.index("\n", line_start)
    return text[:line_start] + edit(text[line_start:line_end]) + text[line_end:]


@pytest.mark.parametrize("corrupt", [
    lambda t: t[:len(t) // 2],  # cut short
    lambda t: t.replace("tree_sizes=", "tree_sizes=1 "),  # sizes that no longer match the trees' places
    lambda t: t.replace("tree_sizes=", "tree_sizes=999999999 "),
    lambda t: _edit_tree(t, 3, "leaf_value", lambda line: line.rsplit(" ", 1)[0]),  # a leaf value fewer
    lambda t: _edit_tree(t, 3, "left_child", lambda line: "left_child=" + " ".join(["99"] * len(line.split()))),
    lambda t: _edit_tree(t, 3, "split_feature", lambda line: "split_feature=" + " ".join(["40"] * len(line.split()))),
    lambda t: _edit_tree(t, 3, "num_leaves", lambda line: "num_leaves=0"),
], ids=["cut-short", "tree-sizes-shifted", "tree-sizes-huge", "leaf-value-missing", "child-out-of-range",
        "feature-out-of-range", "no-leaves"])
def test_model_text_its_loader_would_crash_on_is_refused_first(booster: lightgbm.Booster,
                                                               corrupt) -> None:  # noqa: ANN001
    """(QA: a hand-edited model with its checksum recomputed killed `bear serve predictor` with SIGSEGV or SIGABRT
    inside LGBM_BoosterLoadModelFromString.) If this test kills the test process, the check missed one."""
    from bear.predictor.compiled_booster import model_text_problem

    text = booster.model_to_string()
    assert model_text_problem(text) is None
    bad = corrupt(text)
    assert bad != text and model_text_problem(bad) is not None
    with pytest.raises(BoosterError, match="malformed model text: "):
        CompiledBooster(bad, 6)
