"""Feature rows for a whole evaluation table (training and evaluation), built from bear.predictor.features.

Each distinct prompt is tokenised and featurised once per tokenizer of the pool, however many models answered it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from bear.predictor.catalog import Catalog, UnknownModelError
from bear.predictor.evals import EvalsError, EvalTable
from bear.predictor.features import PROJECTION_DIMENSIONS, feature_rows, model_features, prompt_features
from bear.predictor.progress import Progress, no_progress
from bear.predictor.projection import Projection
from bear.predictor.tokenizers import get_tokenizer


@dataclass(frozen=True, slots=True, eq=False)
class TokenizedPrompts:
    """The distinct prompts of a table with their features under one tokenizer."""

    prompt_tokens: np.ndarray  # (U,)
    hashed: np.ndarray  # (U, HASH_DIMENSIONS)
    text: np.ndarray  # (U, len(TEXT_FEATURES))


@dataclass(frozen=True, slots=True, eq=False)
class PromptBatch:
    distinct: tuple[str, ...]
    prompt_index: np.ndarray  # per table row: its prompt's position in `distinct`
    by_tokenizer: Mapping[str, TokenizedPrompts]


def with_catalogue_names(table: EvalTable, catalog: Catalog) -> EvalTable:
    """`table` with every row's model as the catalogue names it: its own name, or for a repository id `org/name`
    (as vLLM serves and logs models) the catalogue's `name`, as Predict calls resolve it. An EvalsError names the
    first row whose model is not in the catalogue."""
    names: dict[str, str] = {}
    for i, model in enumerate(table.models):
        if model not in names:
            try:
                names[model] = catalog.resolve(model)
            except UnknownModelError:
                raise EvalsError(f"evals row {i + 1}: model {model!r} is not in the catalogue "
                                 f"({', '.join(catalog.names)})") from None
    if all(given == name for given, name in names.items()):
        return table
    return replace(table, models=tuple(names[model] for model in table.models))


def featurise_prompts(table: EvalTable, catalog: Catalog, progress: Progress = no_progress) -> PromptBatch:
    positions: dict[str, int] = {}
    prompt_index = np.array([positions.setdefault(p, len(positions)) for p in table.prompts], dtype=np.intp)
    distinct = tuple(positions)
    tokenizers = dict.fromkeys(catalog.spec(m).tokenizer for m in dict.fromkeys(table.models))
    by_tokenizer = {}
    for name in tokenizers:
        tokenizer = get_tokenizer(name)
        features = [prompt_features(p, tokenizer)
                    for p in progress(distinct, f"featurising prompts ({name} tokens)", len(distinct))]
        by_tokenizer[name] = TokenizedPrompts(
            np.array([f.prompt_tokens for f in features], dtype=np.int64),
            np.stack([f.hashed for f in features]), np.stack([f.text for f in features]))
    return PromptBatch(distinct, prompt_index, by_tokenizer)


def fit_projections(batch: PromptBatch) -> dict[str, Projection]:
    return {name: Projection.fit(prompts.hashed, PROJECTION_DIMENSIONS) for name, prompts in batch.by_tokenizer.items()}


def table_rows(batch: PromptBatch, models: Sequence[str], catalog: Catalog,
               projections: Mapping[str, Projection]) -> np.ndarray:
    """The feature matrix of a table, one row per (prompt, model) row, in FEATURE_NAMES order."""
    tokenizer_of = np.array([catalog.spec(m).tokenizer for m in models], dtype=object)
    n = len(models)
    projected = np.empty((n, PROJECTION_DIMENSIONS))
    text = np.empty((n, next(iter(batch.by_tokenizer.values())).text.shape[1]))
    for name, prompts in batch.by_tokenizer.items():
        rows = np.flatnonzero(tokenizer_of == name)
        which = batch.prompt_index[rows]
        projected[rows] = projections[name].apply(prompts.hashed[which])
        text[rows] = prompts.text[which]
    per_model = {m: model_features(catalog.spec(m), catalog.index(m)) for m in catalog.names}
    return feature_rows(projected, text, np.stack([per_model[m] for m in models]))


def prompt_tokens_of_rows(batch: PromptBatch, models: Sequence[str], catalog: Catalog) -> np.ndarray:
    """Each row's prompt length under its model's tokenizer."""
    return np.array([batch.by_tokenizer[catalog.spec(m).tokenizer].prompt_tokens[u]
                     for m, u in zip(models, batch.prompt_index, strict=True)], dtype=np.int64)
