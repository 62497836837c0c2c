"""Tokenizers that count a model's prompt tokens and give the token keys the prompt features hash. All work offline.

A model's catalogue entry names its tokenizer (`tokenizer:`); omitted, it is `qwen`.

- `qwen`: the byte-level BPE vocabulary of Qwen (151,643 merges, the `qwen.tiktoken` file that the `dashscope` wheel
  ships) with Qwen's pre-tokenisation pattern and NFC normalisation, run by `tiktoken`. Qwen2 and Qwen3 use this same
  vocabulary and pattern, so prompt counts are exact for the paper's pool (special tokens are counted as plain text).
  It is the fallback for any model whose own tokenizer is not available offline: counts for non-Qwen models are then
  approximate (BPE vocabularies of this size agree within ~10–20% on English text).
- `pretokens`: no vocabulary at all, one token per word or punctuation run, cut into pieces of at most 16 characters,
  and one per CJK character (Chinese, Japanese and Korean are written without spaces: counted by word, a whole
  paragraph was one token). For a pool whose tokenizer is unknown and where even an approximate BPE is not wanted; it
  counts about 20% fewer tokens than `qwen` on English prose, and roughly as many on CJK text.

Token keys are non-negative integers: the BPE token id, or the CRC-32 of a pre-token's UTF-8 bytes.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import re
import unicodedata
import zlib
from pathlib import Path
from typing import Protocol

import numpy as np

QWEN = "qwen"
PRETOKENS = "pretokens"
KNOWN_TOKENIZERS = (QWEN, PRETOKENS)

# Qwen's pre-tokenisation pattern (Qwen, Qwen2, Qwen3 alike); tiktoken's regex engine understands \p{...}.
_QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tiktoken's BPE recursion can overflow its stack on one huge piece: texts longer than this are encoded in parts cut at
# whitespace (the same guard as dashscope's own Qwen tokenizer).
_MAX_CHARS_PER_CALL = 100_000
_CJK = "\u1100-\u11ff\u2e80-\u2fdf\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_MAX_PRETOKEN_CHARS = 16
_PRETOKEN = re.compile(f"[{_CJK}]|[^\\W{_CJK}]{{1,{_MAX_PRETOKEN_CHARS}}}|[^\\w\\s]{{1,{_MAX_PRETOKEN_CHARS}}}")


class TokenizerUnavailable(RuntimeError):
    """A tokenizer whose data is not installed."""


class Tokenizer(Protocol):
    name: str

    def token_keys(self, text: str) -> np.ndarray:
        """One non-negative int64 key per token of `text`."""
        ...


def get_tokenizer(name: str) -> Tokenizer:
    """The tokenizer called `name` (built once per process: the Qwen vocabulary takes ~0.15 s to load)."""
    if name not in KNOWN_TOKENIZERS:
        raise KeyError(f"unknown tokenizer {name!r}; known: {', '.join(KNOWN_TOKENIZERS)}")
    return _build(name)


@functools.cache
def _build(name: str) -> Tokenizer:
    return QwenTokenizer() if name == QWEN else PretokenTokenizer()


class QwenTokenizer:
    name = QWEN

    def __init__(self, vocabulary: Path | None = None) -> None:
        import tiktoken  # a heavy import, needed only when a Qwen tokenizer is built

        path = vocabulary or qwen_vocabulary_path()
        ranks = {base64.b64decode(token): int(rank)
                 for token, rank in (line.split() for line in path.read_bytes().splitlines() if line)}
        self._encoding = tiktoken.Encoding("qwen", pat_str=_QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={})

    def token_keys(self, text: str) -> np.ndarray:
        text = unicodedata.normalize("NFC", text)
        if len(text) <= _MAX_CHARS_PER_CALL:
            return np.asarray(self._encoding.encode_ordinary(text), dtype=np.int64)
        parts = [self._encoding.encode_ordinary(part) for part in _split_at_whitespace(text, _MAX_CHARS_PER_CALL)]
        return np.asarray([token for part in parts for token in part], dtype=np.int64)


class PretokenTokenizer:
    name = PRETOKENS

    def token_keys(self, text: str) -> np.ndarray:
        pieces = _PRETOKEN.findall(unicodedata.normalize("NFC", text))
        # surrogatepass: a lone surrogate (an undecodable byte of a file or the command line) is a piece as any other
        return np.fromiter((zlib.crc32(p.encode("utf-8", "surrogatepass")) for p in pieces), dtype=np.int64,
                           count=len(pieces))


def qwen_vocabulary_path() -> Path:
    """`qwen.tiktoken` inside the installed dashscope package (located without importing it)."""
    spec = importlib.util.find_spec("dashscope")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerUnavailable("tokenizer 'qwen' needs the dashscope package (it ships qwen.tiktoken); "
                                   "install bear-router's dependencies, or set `tokenizer: pretokens` in the catalogue")
    path = Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise TokenizerUnavailable(f"tokenizer 'qwen': {path} not found in the installed dashscope package")
    return path


def _split_at_whitespace(text: str, max_chars: int) -> list[str]:
    parts = []
    start = 0
    while len(text) - start > max_chars:
        cut = text.rfind(" ", start + 1, start + max_chars)
        cut = cut if cut > start else start + max_chars
        parts.append(text[start:cut])
        start = cut
    parts.append(text[start:])
    return parts
