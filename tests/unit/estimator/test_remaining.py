"""Residents' remaining lengths: resolved once per input, cached, and the stated fallback whenever the source fails."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bear.estimator.remaining import (
    RemainingLengths,
    RemainingUnavailable,
    artifact_source,
    fallback_remaining,
)
from bear.predictor.length_distribution import LengthDistribution
from bear.snapshotter.backoff import Backoff
from tests.estimator_builders import FakeClock


def rows(*triples: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.array(column, dtype=np.float64) for column in zip(*triples))  # type: ignore[return-value]


class Source:
    """Answers predicted × 2 − generated, counts its calls, fails when told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.error: RemainingUnavailable | None = None

    async def __call__(self, model: str, predicted: np.ndarray, generated: np.ndarray,
                       max_tokens: np.ndarray) -> np.ndarray:
        self.calls.append((model, len(predicted)))
        if self.error is not None:
            raise self.error
        return predicted * 2 - generated


def test_the_fallback_is_predicted_minus_generated_at_least_one_within_max_tokens() -> None:
    predicted, generated, max_tokens = rows((100, 30, 0), (100, 130, 0), (100, 30, 50), (100, 50, 50))
    assert fallback_remaining(predicted, generated, max_tokens).tolist() == [70, 1, 20, 0]


def test_answers_are_resolved_once_per_input_and_read_from_the_cache() -> None:
    source = Source()
    lengths = RemainingLengths(source)
    asyncio.run(lengths.resolve({"m": rows((100, 10, 0), (50, 5, 0))}))
    asyncio.run(lengths.resolve({"m": rows((100, 10, 0), (50, 6, 0))}))  # one row is new
    assert source.calls == [("m", 2), ("m", 1)]
    assert lengths.lookup("m", *rows((100, 10, 0), (50, 6, 0), (70, 1, 0))).tolist() == [190, 94, 69]
    assert (lengths.stats.rows_resolved, lengths.stats.rows_cached, lengths.stats.rows_fallback) == (3, 1, 1)


def test_a_request_at_its_max_tokens_is_not_asked_for() -> None:
    source = Source()
    lengths = RemainingLengths(source)
    asyncio.run(lengths.resolve({"m": rows((100, 8, 8))}))
    assert source.calls == [] and lengths.lookup("m", *rows((100, 8, 8))).tolist() == [0]


def test_a_failing_source_is_left_alone_for_its_back_off() -> None:
    source, clock = Source(), FakeClock(0.0)
    lengths = RemainingLengths(source, backoff=Backoff(base_s=1.0, cap_s=1.0, rng=_Max()), clock=clock)
    source.error = RemainingUnavailable("DEADLINE_EXCEEDED")
    asyncio.run(lengths.resolve({"m": rows((100, 10, 0))}))
    assert lengths.lookup("m", *rows((100, 10, 0))).tolist() == [90]  # the fallback
    source.error = None
    asyncio.run(lengths.resolve({"m": rows((100, 10, 0))}))
    assert len(source.calls) == 1  # still backing off
    clock.advance(1.5)
    asyncio.run(lengths.resolve({"m": rows((100, 10, 0))}))
    assert len(source.calls) == 2 and lengths.lookup("m", *rows((100, 10, 0))).tolist() == [190]
    assert lengths.stats.source_failures == 1


def test_a_model_the_source_does_not_know_falls_back_for_a_minute_without_holding_up_the_others() -> None:
    source, clock = Source(), FakeClock(0.0)
    lengths = RemainingLengths(source, clock=clock)
    source.error = RemainingUnavailable("unknown model 'x'", unknown_model=True)
    asyncio.run(lengths.resolve({"x": rows((100, 10, 0))}))
    source.error = None
    asyncio.run(lengths.resolve({"x": rows((100, 11, 0)), "m": rows((100, 11, 0))}))
    assert source.calls == [("x", 1), ("m", 1)]
    clock.advance(61)
    asyncio.run(lengths.resolve({"x": rows((100, 12, 0))}))
    assert source.calls[-1] == ("x", 1)


def test_without_a_source_everything_falls_back() -> None:
    lengths = RemainingLengths(None)
    asyncio.run(lengths.resolve({"m": rows((100, 10, 0))}))
    assert not lengths.source_configured and lengths.lookup("m", *rows((100, 10, 0))).tolist() == [90]


def test_the_cache_is_bounded() -> None:
    lengths = RemainingLengths(Source(), max_entries=2)
    asyncio.run(lengths.resolve({"m": rows((1, 0, 0), (2, 0, 0), (3, 0, 0))}))
    assert lengths.lookup("m", *rows((1, 0, 0), (3, 0, 0))).tolist() == [1, 6]  # the oldest fell out


def test_the_artifact_source_is_the_length_distribution() -> None:
    distribution = LengthDistribution(np.linspace(0.2, 1.8, 64), 3, 1.0)
    source = artifact_source({"m": distribution})
    got = asyncio.run(source("m", *rows((100, 10, 0), (100, 150, 400))))
    assert got.tolist() == pytest.approx(distribution.expected_remaining(
        np.array([100.0, 100.0]), np.array([10.0, 150.0]), np.array([1e18, 400.0])).tolist())
    with pytest.raises(RemainingUnavailable) as error:
        asyncio.run(source("other", *rows((100, 10, 0))))
    assert error.value.unknown_model


def test_the_artifact_source_knows_a_model_by_its_repository_id_as_the_predictor_does() -> None:
    # vLLM's served name is the repository id by default: Qwen/Qwen3-8B where the artifact says Qwen3-8B
    distribution = LengthDistribution(np.linspace(0.2, 1.8, 64), 3, 1.0)
    source = artifact_source({"Qwen3-8B": distribution})
    by_id, by_name = (asyncio.run(source(name, *rows((100, 10, 0)))) for name in ("Qwen/Qwen3-8B", "Qwen3-8B"))
    assert by_id.tolist() == by_name.tolist()
    with pytest.raises(RemainingUnavailable):
        asyncio.run(source("Qwen/Qwen3-14B", *rows((100, 10, 0))))


class _Max:
    """A random source that always draws the top of the range (deterministic back-off)."""

    def uniform(self, low: float, high: float) -> float:
        return high
