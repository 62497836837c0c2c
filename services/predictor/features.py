"""The predictor's features (paper Appendix A.4), defined once: training and serving both build rows here.

A row, for one prompt and one model, is

    16 hashing components  the prompt's tokens hashed into a 512-dimensional signed vector (each token adds ±1 to one
                           bucket), divided by the token count and projected on the 16 principal components fitted on
                           the training prompts (`Projection`, saved with the model)
    prompt_tokens, prompt_chars, prompt_sentences, chars_per_token
    length constraints     indicators of "in 50 words", "3 sentences", "briefly", "in detail", and the number of
                           words asked for (bear.predictor.indicators)
    task types             indicators of list, summarise, explain, question, story, code, compare, rewrite, classify,
                           answer-from-documents (bear.predictor.indicators)
    model                  model_id (categorical: the model's position in the catalogue), log_num_params,
                           max_context_tokens

A sentence ends at ".", "!" or "?" followed by a space, a line break or the end of the prompt.

The prompt's tokens are its model's tokenizer's (bear.predictor.tokenizers), so models with different tokenizers see
different counts and hashes. Indicators look only at the prompt's first and last INSTRUCTION_WINDOW_CHARS characters,
where instructions sit: a document in between is not a request, and scanning it would cost time on the routing path.

`feature_spec()` is the whole definition as data; an artifact stores it and refuses to load under a different one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from bear.predictor.catalog import ModelSpec
from bear.predictor.indicators import NAMES as INDICATORS
from bear.predictor.indicators import definition as indicators_definition
from bear.predictor.indicators import indicators
from bear.predictor.projection import Projection
from bear.predictor.tokenizers import Tokenizer

HASH_DIMENSIONS = 512
PROJECTION_DIMENSIONS = 16
HASH_SEED = 0x5EED_BEA2
INSTRUCTION_WINDOW_CHARS = 1000

TEXT_FEATURES = ("prompt_tokens", "prompt_chars", "prompt_sentences", "chars_per_token", *INDICATORS)
MODEL_FEATURES = ("model_id", "log_num_params", "max_context_tokens")
FEATURE_NAMES = (*(f"hash_pc{i}" for i in range(PROJECTION_DIMENSIONS)), *TEXT_FEATURES, *MODEL_FEATURES)
MODEL_ID_COLUMN = FEATURE_NAMES.index("model_id")  # LightGBM treats it as categorical

_SENTENCE_ENDS = tuple(mark + space for mark in ".!?" for space in " \n")  # a mark followed by a space or a line break
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)  # SplitMix64 finaliser constants
_MIX_2 = np.uint64(0x94D049BB133111EB)


class EmptyPromptError(ValueError):
    """A prompt with no token."""


@dataclass(frozen=True, slots=True, eq=False)
class PromptFeatures:
    """What one prompt contributes to its rows, under one tokenizer."""

    prompt_tokens: int
    hashed: np.ndarray  # (HASH_DIMENSIONS,): signed token hashes summed, divided by the token count
    text: np.ndarray  # (len(TEXT_FEATURES),), in TEXT_FEATURES order


def prompt_features(prompt: str, tokenizer: Tokenizer) -> PromptFeatures:
    keys = tokenizer.token_keys(prompt)
    if keys.size == 0:
        raise EmptyPromptError("prompt is empty (it has no token)")
    return PromptFeatures(int(keys.size), signed_hash(keys), text_features(prompt, int(keys.size)))


def signed_hash(keys: np.ndarray) -> np.ndarray:
    """Each token adds ±1 to one of HASH_DIMENSIONS buckets (bucket and sign from one 64-bit mix of its key)."""
    h = keys.astype(np.uint64) + np.uint64(HASH_SEED)
    h ^= h >> np.uint64(30)
    h *= _MIX_1
    h ^= h >> np.uint64(27)
    h *= _MIX_2
    h ^= h >> np.uint64(31)
    buckets = (h % np.uint64(HASH_DIMENSIONS)).astype(np.intp)
    signs = 1.0 - 2.0 * (h >> np.uint64(63)).astype(np.float64)
    return np.bincount(buckets, weights=signs, minlength=HASH_DIMENSIONS) / keys.size


def text_features(prompt: str, prompt_tokens: int) -> np.ndarray:
    chars = len(prompt)
    window = prompt if chars <= 2 * INSTRUCTION_WINDOW_CHARS else (
        prompt[:INSTRUCTION_WINDOW_CHARS] + "\n" + prompt[-INSTRUCTION_WINDOW_CHARS:])
    stripped = prompt.rstrip()
    sentences = sum(stripped.count(end) for end in _SENTENCE_ENDS) + 1  # + the last one, terminated or not
    return np.concatenate(([prompt_tokens, chars, sentences, chars / prompt_tokens], indicators(window)))


def model_features(spec: ModelSpec, model_id: int) -> np.ndarray:
    return np.array([model_id, math.log(spec.num_params), spec.max_context_tokens], dtype=np.float64)


def feature_rows(projected: np.ndarray, text: np.ndarray, models: np.ndarray) -> np.ndarray:
    """Rows in FEATURE_NAMES order from aligned (n, 16) projections, (n, |TEXT_FEATURES|) and (n, 3) model parts
    (a part with one row is repeated for every row)."""
    n = max(len(projected), len(text), len(models))
    parts = [np.broadcast_to(part, (n, part.shape[1])) for part in (projected, text, models)]
    return np.ascontiguousarray(np.hstack(parts), dtype=np.float64)


def rows_for_prompt(features: PromptFeatures, projection: Projection, models: np.ndarray) -> np.ndarray:
    """The rows of one prompt for several models (`models`: stacked `model_features`)."""
    return feature_rows(projection.apply(features.hashed)[None, :], features.text[None, :], models)


def feature_spec() -> dict[str, Any]:
    """The complete definition of the features, as stored in an artifact (plain JSON data)."""
    return {
        "names": list(FEATURE_NAMES),
        "categorical": ["model_id"],
        "hash_dimensions": HASH_DIMENSIONS,
        "projection_dimensions": PROJECTION_DIMENSIONS,
        "hash": f"splitmix64(key + {HASH_SEED:#x}); bucket = h mod {HASH_DIMENSIONS}; sign = top bit",
        "instruction_window_chars": INSTRUCTION_WINDOW_CHARS,
        "indicators": indicators_definition(),
        "sentence_ends": list(_SENTENCE_ENDS),
    }
