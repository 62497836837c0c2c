"""Residents' expected remaining output, E[min(L, M) − g | L > g], resolved ahead of the replay and cached.

The replay needs, for every resident of a snapshot, the output tokens it still has to generate. The predictor answers
that from its length distributions (`bear.predictor.length_distribution`), either in this process (the artifact
loaded locally) or over gRPC (`bear.v1.Predictor/ExpectedRemaining`). `RemainingLengths` resolves the rows of the
snapshots about to be adopted in one call per model, with the source's deadline, and caches each answer by its inputs
(model, predicted length, tokens generated, max_tokens), so that a waiting request, whose inputs do not change, is
asked once. Adopting the snapshot then reads the cache (`lookup`, the estimator's `RemainingTokens`) and never waits.

When no source is configured, or the source fails (the estimator then leaves it alone for a back-off delay, and for
a minute a model it does not know), the stated fallback is

    remaining = max(1, predicted − generated), capped at max_tokens − generated

which is exact for a request that stops at its predicted length and too short for one that outlives it. A request
that has generated its max_tokens (its last token in flight) has 0 tokens left beyond those; the estimator adds the
tokens in flight.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import numpy as np

from bear.snapshotter.backoff import Backoff

logger = logging.getLogger("bear.estimator")

# (predicted output tokens at dispatch, tokens generated, max_tokens with 0 for none): arrays of equal length
Rows = tuple[np.ndarray, np.ndarray, np.ndarray]
# E[remaining] per row of one model; raises RemainingUnavailable when it cannot answer
RemainingSource = Callable[[str, np.ndarray, np.ndarray, np.ndarray], Awaitable[np.ndarray]]

UNSUPPORTED_MODEL_RETRY_S = 60.0


class RemainingUnavailable(Exception):
    """The source could not answer (unreachable, too slow, or it does not know the model)."""

    def __init__(self, message: str, *, unknown_model: bool = False) -> None:
        super().__init__(message)
        self.unknown_model = unknown_model


def fallback_remaining(predicted: np.ndarray, generated: np.ndarray, max_tokens: np.ndarray) -> np.ndarray:
    """max(1, predicted − generated), capped at max_tokens − generated (0 once max_tokens are generated)."""
    remaining = np.maximum(np.asarray(predicted, dtype=np.float64) - generated, 1.0)
    capped = np.where(max_tokens > 0, np.minimum(remaining, max_tokens - generated), remaining)
    return np.maximum(capped, 0.0)


@dataclass
class RemainingStats:
    rows_resolved: int = 0  # rows answered by the source
    rows_cached: int = 0  # rows found in the cache
    rows_fallback: int = 0  # rows answered by the fallback
    source_failures: int = 0


class RemainingLengths:
    """One event loop calls `resolve` and `lookup`; not thread-safe."""

    def __init__(self, source: RemainingSource | None, *, max_entries: int = 1 << 16,
                 backoff: Backoff | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self._cache: OrderedDict[tuple[str, float, float, float], float] = OrderedDict()
        self._max_entries = max_entries
        self._backoff = backoff or Backoff(base_s=0.1, cap_s=10.0)
        self._clock = clock
        self._retry_at = -math.inf  # the source is left alone until then
        self._unknown_models: dict[str, float] = {}  # model → when to ask again
        self.stats = RemainingStats()

    @property
    def source_configured(self) -> bool:
        return self._source is not None

    async def resolve(self, requests: Mapping[str, Rows]) -> None:
        """Asks the source for the rows not cached yet (one call per model); never raises."""
        if self._source is None:
            return
        for model, (predicted, generated, max_tokens) in requests.items():
            if not self._may_ask(model):
                continue
            keys = [(model, float(p), float(g), float(m)) for p, g, m in zip(predicted, generated, max_tokens)]
            finished = [m > 0 and g >= m for _, _, g, m in keys]  # nothing left beyond the tokens in flight
            missing = [i for i, key in enumerate(keys) if key not in self._cache and not finished[i]]
            self.stats.rows_cached += len(keys) - len(missing)
            if not missing:
                continue
            index = np.array(missing)
            try:
                answers = await self._source(model, predicted[index], generated[index], max_tokens[index])
            except RemainingUnavailable as error:
                self._failed(model, error)
                continue
            self._backoff.succeeded()
            self.stats.rows_resolved += len(missing)
            for i, value in zip(missing, np.asarray(answers, dtype=np.float64), strict=True):
                self._remember(keys[i], float(value))

    def lookup(self, model: str, predicted: np.ndarray, generated: np.ndarray, max_tokens: np.ndarray) -> np.ndarray:
        """Cached answers, the fallback for the rest (the estimator's `RemainingTokens`)."""
        out = fallback_remaining(predicted, generated, max_tokens)
        num_fallback = 0
        for i, (p, g, m) in enumerate(zip(predicted, generated, max_tokens)):
            if m > 0 and g >= m:
                continue
            value = self._cache.get((model, float(p), float(g), float(m)))
            if value is None:
                num_fallback += 1
            else:
                out[i] = value
        self.stats.rows_fallback += num_fallback
        return out

    def _may_ask(self, model: str) -> bool:
        now = self._clock()
        if now < self._retry_at:
            return False
        retry_at = self._unknown_models.get(model)
        if retry_at is not None and now < retry_at:
            return False
        self._unknown_models.pop(model, None)
        return True

    def _failed(self, model: str, error: RemainingUnavailable) -> None:
        self.stats.source_failures += 1
        if error.unknown_model:
            self._unknown_models[model] = self._clock() + UNSUPPORTED_MODEL_RETRY_S
            logger.warning("the predictor does not know model %r (%s): remaining lengths fall back for %.0f s", model,
                           error, UNSUPPORTED_MODEL_RETRY_S)
            return
        delay_s = self._backoff.failed()
        self._retry_at = self._clock() + delay_s
        if self._backoff.failures == 1 or self._backoff.failures % 20 == 0:
            logger.warning("remaining lengths unavailable (%d failures, next try in %.2f s): %s",
                           self._backoff.failures, delay_s, error)

    def _remember(self, key: tuple[str, float, float, float], value: float) -> None:
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_entries:
            self._cache.popitem(last=False)


def catalogue_name(model: str, known: Mapping[str, object]) -> str:
    """`model` as a predictor artifact names it: itself, or the `name` of a repository id `org/name` (vLLM's served
    name by default, `Qwen/Qwen3-8B`) where only that is known, as the predictor's catalogue resolves names."""
    if model in known:
        return model
    short = model.rsplit("/", 1)[-1]
    return short if short in known else model


def artifact_source(distributions: Mapping[str, object]) -> RemainingSource:
    """A source over a predictor artifact's length distributions (`PredictorArtifact.length_distributions`), in
    this process. A model the artifact does not know (by its name or, for a repository id, the part after the last
    '/') is unavailable."""
    from bear.predictor.length_distribution import UNBOUNDED

    async def expected_remaining(model: str, predicted: np.ndarray, generated: np.ndarray,
                                 max_tokens: np.ndarray) -> np.ndarray:
        distribution = distributions.get(catalogue_name(model, distributions))
        if distribution is None:
            raise RemainingUnavailable(f"the predictor artifact has no model {model!r}", unknown_model=True)
        caps = np.where(max_tokens > 0, max_tokens, UNBOUNDED)
        return distribution.expected_remaining(predicted, generated, caps)  # type: ignore[attr-defined]

    return expected_remaining
