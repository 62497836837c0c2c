"""The loaded predictor: per prompt and model, the judge score, the output length and the cost; per running request,
the output tokens it still has to generate.

    predictor = load_predictor(Path("artifacts/predictor"))
    predictions = predictor.predict("Summarize ...")            # {model: ModelPrediction}, catalogue order
    predictor.expected_remaining_tokens("Qwen3-8B", predictions["Qwen3-8B"].output_tokens, generated_tokens=300,
                                        max_tokens=2048)

One prompt is tokenised and featurised once per tokenizer of the pool; its rows for all the models are scored in one
pass through each LightGBM model's C API (bear.predictor.compiled_booster). Errors: EmptyPromptError, UnknownModelError;
`load_predictor` raises ArtifactError for a directory it cannot use. Safe to call from several threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bear.predictor.artifact import ArtifactError, PredictorArtifact
from bear.predictor.catalog import Catalog
from bear.predictor.compiled_booster import BoosterError, CompiledBooster
from bear.predictor.dataset import featurise_prompts, prompt_tokens_of_rows, table_rows, with_catalogue_names
from bear.predictor.evals import EvalTable
from bear.predictor.evaluation import report
from bear.predictor.features import FEATURE_NAMES, EmptyPromptError, model_features, prompt_features, rows_for_prompt
from bear.predictor.length_distribution import UNBOUNDED
from bear.predictor.progress import Progress, no_progress
from bear.predictor.tokenizers import get_tokenizer


@dataclass(frozen=True, slots=True)
class ModelPrediction:
    model: str
    accuracy: float  # predicted judge score, in [0, 1]
    output_tokens: float  # predicted mean output length, >= 1
    prompt_tokens: int  # under the model's tokenizer
    cost_usd: float  # prompt_tokens × input price + output_tokens × output price


@dataclass(frozen=True, slots=True, eq=False)
class _TokenizerGroup:
    """The models that share a tokenizer, with their fixed feature parts."""

    tokenizer: str
    models: tuple[str, ...]
    model_rows: np.ndarray  # (len(models), len(MODEL_FEATURES))


class Predictor:
    def __init__(self, artifact: PredictorArtifact) -> None:
        self.artifact = artifact
        self.catalog: Catalog = artifact.catalog
        self._accuracy = CompiledBooster(artifact.accuracy_model, len(FEATURE_NAMES))
        self._log_output_tokens = CompiledBooster(artifact.log_output_tokens_model, len(FEATURE_NAMES))
        self._groups = tuple(
            _TokenizerGroup(name, tuple(m.name for m in self.catalog if m.tokenizer == name),
                            np.stack([model_features(m, i) for i, m in enumerate(self.catalog) if m.tokenizer == name]))
            for name in self.catalog.tokenizers)
        self._tokenizers = {name: get_tokenizer(name) for name in self.catalog.tokenizers}

    def predict(self, prompt: str, models: Sequence[str] | None = None) -> dict[str, ModelPrediction]:
        """Predictions for `models` (default: the whole catalogue; a repository id `org/name` names the catalogue's
        `name`), in catalogue order, by catalogue name."""
        if not prompt.strip():
            raise EmptyPromptError("prompt is empty")
        wanted = set(self.catalog.names) if models is None else {self.catalog.resolve(m) for m in models}
        out: dict[str, ModelPrediction] = {}
        for group in self._groups:
            chosen = [i for i, m in enumerate(group.models) if m in wanted]
            if not chosen:
                continue
            features = prompt_features(prompt, self._tokenizers[group.tokenizer])
            rows = rows_for_prompt(features, self.artifact.projections[group.tokenizer], group.model_rows[chosen])
            names = [group.models[i] for i in chosen]
            accuracy, output_tokens = self._score(rows, names)
            for name, a, n in zip(names, accuracy, output_tokens, strict=True):
                out[name] = ModelPrediction(name, float(a), float(n), features.prompt_tokens,
                                            self.catalog.spec(name).cost_usd(features.prompt_tokens, float(n)))
        return {name: out[name] for name in self.catalog.names if name in out}

    def expected_remaining_tokens(self, model: str, predicted_output_tokens: float, generated_tokens: int,
                                  max_tokens: int | None = None) -> float:
        """E[min(L, max_tokens) − g | L > g] for a request of `model` predicted at `predicted_output_tokens` that has
        generated g tokens: >= 1, <= max_tokens − g (bear.predictor.length_distribution)."""
        distribution = self.artifact.length_distributions[self.catalog.resolve(model)]
        return float(distribution.expected_remaining(predicted_output_tokens, generated_tokens, max_tokens))

    def expected_remaining_tokens_many(self, model: str, predicted_output_tokens: np.ndarray,
                                       generated_tokens: np.ndarray, max_tokens: np.ndarray | None = None) -> np.ndarray:
        """`expected_remaining_tokens` for many requests of one model at once (max_tokens 0: none)."""
        distribution = self.artifact.length_distributions[self.catalog.resolve(model)]
        caps = None if max_tokens is None else np.where(np.asarray(max_tokens) > 0, max_tokens, UNBOUNDED)
        return distribution.expected_remaining(predicted_output_tokens, generated_tokens, caps)

    def predict_table(self, table: EvalTable, progress: Progress = no_progress) -> tuple[np.ndarray, np.ndarray]:
        """(accuracy, output_tokens) predicted for every row of `table` (the batch path; same numbers as `predict`)."""
        table = with_catalogue_names(table, self.catalog)
        batch = featurise_prompts(table, self.catalog, progress)
        return self._score(table_rows(batch, table.models, self.catalog, self.artifact.projections), table.models)

    def evaluate(self, table: EvalTable, progress: Progress = no_progress) -> dict[str, object]:
        """Metrics per model against the constant baseline (bear.predictor.evaluation)."""
        table = with_catalogue_names(table, self.catalog)
        accuracy, output_tokens = self.predict_table(table, progress)
        return report(np.asarray(table.models, dtype=object), table.scores, table.output_tokens, accuracy,
                      output_tokens, self.artifact.baselines)

    def prompt_tokens(self, table: EvalTable) -> np.ndarray:
        """Each row's prompt length under its model's tokenizer."""
        table = with_catalogue_names(table, self.catalog)
        return prompt_tokens_of_rows(featurise_prompts(table, self.catalog), table.models, self.catalog)

    def close(self) -> None:
        self._accuracy.close()
        self._log_output_tokens.close()

    def _score(self, rows: np.ndarray, models: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Accuracy in [0, 1] and mean output tokens (>= 1) of feature rows whose models are `models`."""
        accuracy = np.clip(self._accuracy.predict(rows), 0.0, 1.0)
        scale = np.exp(self._log_output_tokens.predict(rows))
        to_mean = np.array([self.artifact.length_distributions[m].scale_to_mean for m in models])
        return accuracy, np.maximum(scale * to_mean, 1.0)


def load_predictor(folder: Path | str) -> Predictor:
    artifact = PredictorArtifact.load(folder)
    try:
        return Predictor(artifact)
    except BoosterError as error:
        raise ArtifactError(f"{folder}: LightGBM cannot use the stored models: {error}") from None
