"""Training the predictor from an evaluation table (Appendix A.4).

Two LightGBM regressors over the same feature rows (bear.predictor.features): a Huber regressor for the judge's score
and an L2 regressor for the output length. The paper's length model is a mean head on raw token counts; here it is
fitted on log tokens and its output is calibrated to a mean per model (bear.predictor.length_distribution: mean =
exp(prediction) × Σ real / Σ exp(out-of-fold prediction)). On held-out synthetic data (6,000 training rows, 3,000
test rows) the raw-count mean head's length MAPE was 0.65–0.73 per model, hardly better than the best constant's
0.72–0.75, because a squared error on raw counts lets the few very long responses pull every nearby prediction up;
log tokens calibrated this way gave 0.47–0.54, with a 4–5% lower mean absolute error and predicted lengths summing to
within 2.2% of the real ones.

The length distribution comes from out-of-fold predictions: the length model is refitted on `num_folds` − 1 folds of
the prompts (all rows of a prompt in one fold) and predicts the held-out fold, so the ratios of real to predicted
lengths are as wide as they will be on new prompts. The hashing projection is fitted once on all training prompts (it
sees no label).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bear.predictor.artifact import PredictorArtifact
from bear.predictor.catalog import Catalog
from bear.predictor.dataset import featurise_prompts, fit_projections, table_rows, with_catalogue_names
from bear.predictor.evals import EvalsError, EvalTable
from bear.predictor.evaluation import ConstantBaseline
from bear.predictor.features import FEATURE_NAMES, PROJECTION_DIMENSIONS
from bear.predictor.length_distribution import LengthDistribution
from bear.predictor.progress import Progress, no_progress

MAX_SEED = 2**31 - 1  # the seed reaches LightGBM, whose seed is a C int

if TYPE_CHECKING:
    import lightgbm

MIN_ROWS_PER_MODEL = 20
MAX_TREES = 10_000  # per LightGBM model: each tree is evaluated on every prediction, on the Route path


@dataclass(frozen=True, slots=True)
class TrainingConfig:
    num_trees: int = 300
    learning_rate: float = 0.05
    num_leaves: int = 31
    min_data_in_leaf: int = 20
    feature_fraction: float = 0.9
    lambda_l2: float = 1.0
    huber_delta: float = 0.2  # Huber's switch from squared to absolute error, in score units (scores are in [0, 1])
    num_folds: int = 4  # out-of-fold length predictions for the length distributions
    length_quantiles: int = 256  # size of each model's ratio table
    tail_fraction: float = 0.05  # share of the ratio table treated as a memoryless tail
    seed: int = 0
    num_threads: int = 1  # training threads: one is fastest at these sizes, and makes the result machine-independent

    def __post_init__(self) -> None:
        if not 1 <= self.num_trees <= MAX_TREES or self.num_leaves < 2 or self.min_data_in_leaf < 1:
            raise ValueError(f"num_trees in [1, {MAX_TREES}], num_leaves >= 2 and min_data_in_leaf >= 1 are required")
        if not (self.learning_rate > 0 and 0 < self.feature_fraction <= 1 and self.huber_delta > 0):
            raise ValueError("learning_rate > 0, feature_fraction in (0, 1] and huber_delta > 0 are required")
        if self.num_folds < 2 or self.length_quantiles < 8 or not 0 < self.tail_fraction < 0.5:
            raise ValueError("num_folds >= 2, length_quantiles >= 8 and tail_fraction in (0, 0.5) are required")


def train(table: EvalTable, catalog: Catalog, config: TrainingConfig = TrainingConfig(),
          progress: Progress = no_progress) -> PredictorArtifact:
    table = with_catalogue_names(table, catalog)
    models = np.asarray(table.models, dtype=object)
    for name in catalog.names:
        count = int((models == name).sum())
        if count < MIN_ROWS_PER_MODEL:
            raise EvalsError(f"evals: model {name!r} has {count} rows; training needs at least {MIN_ROWS_PER_MODEL} "
                             f"per catalogue model (or leave it out of the catalogue)")
    batch = featurise_prompts(table, catalog, progress)
    if len(batch.distinct) <= 2 * PROJECTION_DIMENSIONS:
        raise EvalsError(f"evals: {len(batch.distinct)} distinct prompts; training needs more than "
                         f"{2 * PROJECTION_DIMENSIONS}")
    projections = fit_projections(batch)
    rows = table_rows(batch, table.models, catalog, projections)
    lengths = table.output_tokens.astype(np.float64)
    log_lengths = np.log(lengths)
    folds = _fold_of_prompt(len(batch.distinct), config)[batch.prompt_index]
    steps = ["accuracy", "log_output_tokens", *(f"fold {k + 1}" for k in range(config.num_folds))]
    boosters: dict[str, lightgbm.Booster] = {}
    out_of_fold = np.empty(len(table))
    for step in progress(steps, "training", len(steps)):
        if step == "accuracy":
            boosters[step] = _fit(rows, table.scores, config, "huber")
        elif step == "log_output_tokens":
            boosters[step] = _fit(rows, log_lengths, config, "regression")
        else:
            held_out = folds == int(step.split()[1]) - 1
            fold_model = _fit(rows[~held_out], log_lengths[~held_out], config, "regression")
            out_of_fold[held_out] = np.exp(fold_model.predict(rows[held_out]))
    return PredictorArtifact(
        catalog=catalog,
        projections=projections,
        accuracy_model=boosters["accuracy"].model_to_string(),
        log_output_tokens_model=boosters["log_output_tokens"].model_to_string(),
        length_distributions={
            name: LengthDistribution.fit(lengths[models == name], out_of_fold[models == name],
                                         config.length_quantiles, config.tail_fraction)
            for name in catalog.names},
        baselines={name: ConstantBaseline.fit(table.scores[models == name], lengths[models == name])
                   for name in catalog.names},
        training=_summary(table, len(batch.distinct), config),
    )


def _fit(rows: np.ndarray, labels: np.ndarray, config: TrainingConfig, objective: str) -> lightgbm.Booster:
    import lightgbm  # heavy; imported when training starts, not when this module (or its config) is

    params: dict[str, Any] = {
        "objective": objective,
        "learning_rate": config.learning_rate,
        "num_leaves": config.num_leaves,
        "min_data_in_leaf": config.min_data_in_leaf,
        "feature_fraction": config.feature_fraction,
        "lambda_l2": config.lambda_l2,
        "seed": config.seed,
        "num_threads": config.num_threads,
        "deterministic": True,
        "force_col_wise": True,
        "verbosity": -1,
    }
    if objective == "huber":
        params["alpha"] = config.huber_delta
    data = lightgbm.Dataset(rows, label=labels, feature_name=list(FEATURE_NAMES), categorical_feature=["model_id"],
                            params={"verbosity": -1})
    return lightgbm.train(params, data, num_boost_round=config.num_trees)


def _fold_of_prompt(num_prompts: int, config: TrainingConfig) -> np.ndarray:
    """Each distinct prompt's fold: a seeded permutation dealt round-robin."""
    folds = np.empty(num_prompts, dtype=np.intp)
    folds[np.random.default_rng(config.seed).permutation(num_prompts)] = np.arange(num_prompts) % config.num_folds
    return folds


def _summary(table: EvalTable, num_prompts: int, config: TrainingConfig) -> dict[str, Any]:
    models, counts = np.unique(np.asarray(table.models, dtype=str), return_counts=True)
    return {
        "num_rows": len(table),
        "num_prompts": num_prompts,
        "rows_per_model": {str(m): int(c) for m, c in zip(models, counts, strict=True)},
        "config": asdict(config),
        "lightgbm_version": importlib.metadata.version("lightgbm"),
    }
