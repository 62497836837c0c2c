"""What a routing policy sees and what it answers.

A policy gets the query's request (its TTFT target and the utility weights) and one `Candidate` per model instance:
the predictor's accuracy, output length and cost for the query on that instance's model, and the instance's live
signals (queue lengths, TTFT estimates, observed latencies, throughput). It returns a `Choice` that names the instance
(or sheds the query) and carries every candidate's score, so that decisions can be traced and compared.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

DEFAULT_LAMBDA_PER_MICRO_USD = 5e-4  # cost weight in eq. 4, per micro-dollar
MAX_WEIGHT = 1e9  # λ and δ above this only overflow utilities (λ·cost, δ·TTFT) to -inf, where every choice ties


def weight_problem(name: str, value: float | None) -> str | None:
    """Why `value` is no weight λ or δ (a number in [0, MAX_WEIGHT]; None: none given), or None."""
    if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_WEIGHT):
        return f"{name} must be a number in [0, {MAX_WEIGHT:g}], got {value!r}"
    return None


class Estimator(enum.StrEnum):
    """TTFT estimators an instance can offer (keys of `InstanceSignals.ttft_estimates_s`)."""

    BEA = "bea"  # the replay (paper §4.1)
    PREFILL_TPS = "prefill-tps"  # prefill throughput (eq. 8)
    LPS = "lps"  # limited processor sharing (eq. 13–15)


@dataclass(frozen=True, slots=True)
class InstanceSignals:
    """What the router knows about one instance now. Any signal may be missing (None / empty)."""

    num_running: int | None = None
    num_waiting: int | None = None
    # Completed requests per second, measured over a recent window (LMDeploy's proxy signal).
    request_throughput_rps: float | None = None
    # This query's TTFT on the instance, by estimator.
    ttft_estimates_s: Mapping[str, float] = field(default_factory=dict)
    # Recently observed TTFTs and times per output token at the instance over a rolling window, oldest first
    # (vLLM Semantic Router's percentiles; SCORE and RouteBalance take the mean TPOT).
    recent_ttft_s: Sequence[float] = ()
    recent_tpot_s: Sequence[float] = ()
    # Predicted output tokens still to come, summed over the instance's residents (SCORE, RouteBalance).
    pending_decode_tokens: float | None = None

    @property
    def num_resident(self) -> int | None:
        if self.num_running is None or self.num_waiting is None:
            return None
        return self.num_running + self.num_waiting

    @property
    def mean_recent_tpot_s(self) -> float | None:
        """The measured time per output token: the mean of `recent_tpot_s` (SCORE, RouteBalance), None if empty."""
        observed = [t for t in self.recent_tpot_s if math.isfinite(t)]
        return sum(observed) / len(observed) if observed else None


@dataclass(frozen=True, slots=True)
class Candidate:
    """One model instance and the predictions for this query on it."""

    instance_id: str
    model: str
    accuracy: float  # predicted response quality in [0, 1]
    prompt_tokens: int
    output_tokens: float  # predicted output length
    cost_micro_usd: float  # predicted cost: tokens × USD per million tokens
    signals: InstanceSignals = field(default_factory=InstanceSignals)

    def utility(self, lambda_per_micro_usd: float) -> float:
        """Eq. 4: accuracy minus λ·cost."""
        return self.accuracy - lambda_per_micro_usd * self.cost_micro_usd

    def ttft_s(self, estimator: Estimator | str) -> float | None:
        value = self.signals.ttft_estimates_s.get(str(estimator))
        return None if value is None or math.isnan(value) else value


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """The query as routing needs it."""

    request_id: str
    ttft_slo_s: float  # the query's TTFT target τ
    lambda_per_micro_usd: float = DEFAULT_LAMBDA_PER_MICRO_USD
    delta_per_s: float | None = None  # latency weight δ of the Lagrangian policy (eq. 7), per s; None: its default


class Decision(enum.StrEnum):
    ROUTE = "route"
    SHED = "shed"  # the query is refused: no instance can serve it in time and the policy sheds such queries


@dataclass(frozen=True, slots=True)
class Score:
    """One candidate as the policy saw it."""

    instance_id: str
    utility: float
    score: float  # what the policy maximised (higher is better)
    ttft_s: float | None = None  # the TTFT estimate the policy used, if any
    feasible: bool | None = None  # whether that estimate meets the target, if the policy asks
    # The policy's own latency estimate when it is not a TTFT (SCORE, RouteBalance: time to complete the query), s.
    latency_s: float | None = None


@dataclass(frozen=True, slots=True)
class Choice:
    instance_id: str | None  # None when shed
    decision: Decision
    reason: str
    scores: tuple[Score, ...]


class Policy(Protocol):
    """A routing policy. `name` is its registry name (also its config and Helm value)."""

    name: ClassVar[str]
    # The TTFT estimator whose estimates the policy reads (the caller computes only what is needed), or None.
    estimator: ClassVar[Estimator | None]

    def choose(self, request: RouteRequest, candidates: Sequence[Candidate]) -> Choice:
        """Picks one of `candidates` (never empty) for `request`."""
        ...


def best(scores: Sequence[Score]) -> Score:
    """The highest score; ties go to the earliest candidate (callers list candidates in a stable order)."""
    return max(scores, key=lambda s: s.score)  # max keeps the first of equal keys
