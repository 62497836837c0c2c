"""Offline tokenizers: Qwen's BPE from the dashscope wheel, the vocabulary-free fallback, and their edge cases."""

from __future__ import annotations

import importlib.util
import unicodedata

import numpy as np
import pytest

from bear.predictor import tokenizers
from bear.predictor.tokenizers import (PretokenTokenizer, QwenTokenizer, TokenizerUnavailable, get_tokenizer,
                                       qwen_vocabulary_path)


def test_qwen_encodes_with_the_qwen2_and_qwen3_vocabulary() -> None:
    qwen = get_tokenizer("qwen")
    # Ids as Qwen2/Qwen3's tokenizer gives them: "Hello" 9707, "," 11, " world" 1879, "!" 0.
    assert qwen.token_keys("Hello, world!").tolist() == [9707, 11, 1879, 0]
    assert qwen.token_keys("<|im_start|>").size > 1  # special tokens are plain text to a prompt counter


def test_qwen_is_built_once_and_is_deterministic() -> None:
    assert get_tokenizer("qwen") is get_tokenizer("qwen")
    text = "The quick brown fox jumps over the lazy dog. " * 20
    assert np.array_equal(get_tokenizer("qwen").token_keys(text), QwenTokenizer().token_keys(text))


def test_qwen_normalises_to_nfc() -> None:
    composed = "café naïve"
    decomposed = unicodedata.normalize("NFD", composed)
    assert composed != decomposed
    qwen = get_tokenizer("qwen")
    assert np.array_equal(qwen.token_keys(composed), qwen.token_keys(decomposed))


def test_qwen_encodes_very_long_text_in_parts_with_the_same_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    qwen = get_tokenizer("qwen")
    text = "word " * 5000 + "tail"
    whole = qwen.token_keys(text)
    monkeypatch.setattr(tokenizers, "_MAX_CHARS_PER_CALL", 997)
    assert np.array_equal(qwen.token_keys(text), whole)


def test_pretokens_count_words_and_punctuation_runs() -> None:
    keys = PretokenTokenizer().token_keys("Hello, world!! 42 times")
    assert keys.size == 6  # Hello , world !! 42 times
    assert keys.dtype == np.int64 and (keys >= 0).all()
    assert PretokenTokenizer().token_keys("   ").size == 0


def test_pretokens_take_a_lone_surrogate_as_any_other_character() -> None:
    # an undecodable byte of the command line or a JSON "\ud800" (a traceback before)
    assert PretokenTokenizer().token_keys("abc \udcff def").size == PretokenTokenizer().token_keys("abc x def").size


def test_pretokens_count_cjk_by_character_and_cut_long_runs() -> None:
    # Written without spaces: counted by word, a whole Chinese paragraph was one token (and its cost near nothing).
    pretokens = PretokenTokenizer()
    assert pretokens.token_keys("请阅读以下合同").size == 7
    assert pretokens.token_keys("日本語のテキスト 한국어").size == 11
    assert pretokens.token_keys("a" * 40).size == 3 and pretokens.token_keys("1" * 32).size == 2


def test_unknown_tokenizer_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="unknown tokenizer 'gpt2'; known: qwen, pretokens"):
        get_tokenizer("gpt2")


def test_a_missing_dashscope_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TokenizerUnavailable, match="needs the dashscope package.*tokenizer: pretokens"):
        qwen_vocabulary_path()
