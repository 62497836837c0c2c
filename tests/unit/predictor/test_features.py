"""The features of Appendix A.4, defined once: shape and order, determinism, the hashing vector, the indicators."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bear.predictor.catalog import PAPER_POOL
from bear.predictor.features import (FEATURE_NAMES, HASH_DIMENSIONS, INSTRUCTION_WINDOW_CHARS, MODEL_ID_COLUMN,
                                     TEXT_FEATURES, EmptyPromptError, feature_spec, model_features, prompt_features,
                                     rows_for_prompt, signed_hash, text_features)
from bear.predictor.projection import Projection
from bear.predictor.tokenizers import PretokenTokenizer, get_tokenizer

QWEN = get_tokenizer("qwen")


def _text(prompt: str) -> dict[str, float]:
    return dict(zip(TEXT_FEATURES, text_features(prompt, max(1, len(prompt) // 4)), strict=True))


def test_a_row_has_the_papers_feature_groups_in_a_fixed_order() -> None:
    assert len(FEATURE_NAMES) == 16 + len(TEXT_FEATURES) + 3 == 38
    assert FEATURE_NAMES[:16] == tuple(f"hash_pc{i}" for i in range(16))
    assert FEATURE_NAMES[16:20] == ("prompt_tokens", "prompt_chars", "prompt_sentences", "chars_per_token")
    assert FEATURE_NAMES[-3:] == ("model_id", "log_num_params", "max_context_tokens")
    assert FEATURE_NAMES[MODEL_ID_COLUMN] == "model_id"


def test_prompt_features_are_deterministic_and_count_tokens_chars_sentences() -> None:
    prompt = "Explain why the sky is blue. Keep it brief! Is it the air?"
    first, second = prompt_features(prompt, QWEN), prompt_features(prompt, get_tokenizer("qwen"))
    assert first.prompt_tokens == second.prompt_tokens == QWEN.token_keys(prompt).size
    assert np.array_equal(first.hashed, second.hashed) and np.array_equal(first.text, second.text)
    values = dict(zip(TEXT_FEATURES, first.text, strict=True))
    assert values["prompt_chars"] == len(prompt)
    assert values["prompt_sentences"] == 3
    assert values["chars_per_token"] == pytest.approx(len(prompt) / first.prompt_tokens)
    assert _text("no terminator here")["prompt_sentences"] == 1


def test_the_hashing_vector_adds_one_signed_unit_per_token_divided_by_the_count() -> None:
    keys = np.array([7, 7, 123456, 99], dtype=np.int64)
    hashed = signed_hash(keys)
    assert hashed.shape == (HASH_DIMENSIONS,)
    assert np.abs(hashed).sum() <= 1.0 + 1e-12
    assert sorted(np.abs(signed_hash(np.array([7]))).tolist())[-1] == 1.0  # one token: one bucket at ±1
    assert np.array_equal(signed_hash(keys[[1, 0, 3, 2]]), hashed)  # order does not matter
    repeated = signed_hash(np.array([7, 7], dtype=np.int64))
    assert np.abs(repeated).max() == 1.0  # two identical tokens: the same bucket twice, divided by two


@pytest.mark.parametrize(("prompt", "expected"), [
    ("Answer in 50 words.", {"asks_word_limit": 1, "requested_words": 50}),
    ("Write a 300-word essay.", {"asks_word_limit": 1, "requested_words": 300}),
    ("Briefly explain how this Python function works.", {"asks_brief": 1, "task_explain": 1, "task_code": 1}),
    ("Describe the treaty in detail.", {"asks_detail": 1, "task_explain": 1}),
    ("List five tips for sleeping well.", {"task_list": 1, "asks_count_limit": 1}),
    ("Summarise this article in two sentences.", {"task_summarize": 1, "asks_count_limit": 1,
                                                  "task_from_documents": 1}),
    ("[WP] The moon is a hologram.", {"task_story": 1}),
    ("Compare Python and Rust for web servers.", {"task_compare": 1, "task_code": 1}),
    ("Translate into French: good morning", {"task_rewrite": 1}),
    ("Classify the sentiment: I loved it", {"task_classify": 1}),
    ("Which river is longer?", {"task_question": 1}),
    ("Explain it step-by-step, in no more than 3 sentences.", {"task_explain": 1, "asks_detail": 1,
                                                               "asks_count_limit": 1}),
    ("TL;DR of the passage, in a single line", {"asks_brief": 1, "task_summarize": 1, "task_from_documents": 1,
                                                 "asks_count_limit": 1}),
])
def test_indicators(prompt: str, expected: dict[str, int]) -> None:
    values = _text(prompt)
    indicator_names = [n for n in TEXT_FEATURES if n.startswith(("asks_", "task_"))]
    assert {n: values[n] for n in indicator_names if values[n]} == {n: v for n, v in expected.items()
                                                                     if n != "requested_words"}
    assert values["requested_words"] == expected.get("requested_words", 0)


def test_indicators_read_the_instructions_not_the_document_between_them() -> None:
    filler = "The agency reviewed the grant program. " * 200
    middle = "Summarize the following report.\n" + filler + " Write a poem. " + filler + "\nKeep it brief."
    values = _text(middle)
    assert len(middle) > 4 * INSTRUCTION_WINDOW_CHARS
    assert values["task_summarize"] == 1 and values["asks_brief"] == 1 and values["task_story"] == 0


def test_an_empty_prompt_is_an_error() -> None:
    with pytest.raises(EmptyPromptError, match="prompt is empty"):
        prompt_features("", QWEN)
    with pytest.raises(EmptyPromptError):
        prompt_features("  \n ", PretokenTokenizer())


def test_rows_for_one_prompt_share_the_prompt_part_and_differ_in_the_model_part() -> None:
    features = prompt_features("List three rivers.", QWEN)
    rng = np.random.default_rng(0)
    projection = Projection.fit(rng.normal(size=(40, HASH_DIMENSIONS)), 16)
    models = np.stack([model_features(m, i) for i, m in enumerate(PAPER_POOL)])
    rows = rows_for_prompt(features, projection, models)
    assert rows.shape == (3, len(FEATURE_NAMES)) and rows.flags.c_contiguous
    assert (rows[:, :-3] == rows[0, :-3]).all()
    assert rows[:, MODEL_ID_COLUMN].tolist() == [0, 1, 2]
    assert rows[1, -2] == pytest.approx(np.log(8.2e9)) and rows[2, -1] == 131_072
    assert np.allclose(rows[0, :16], projection.apply(features.hashed))


def test_the_feature_spec_is_plain_data_that_names_every_feature() -> None:
    spec = feature_spec()
    assert json.loads(json.dumps(spec)) == spec
    assert spec["names"] == list(FEATURE_NAMES) and spec["categorical"] == ["model_id"]
