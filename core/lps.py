"""The limited-processor-sharing (LPS) TTFT estimator (paper §4.2, eq. 13–15), for when no live snapshot is available.

An instance serves up to k queries at once, sharing an aggregate rate of μ queries/s; more wait in an FCFS queue. With
Poisson arrivals at α queries/s and exponential service, an arriving query waits on average (eq. 13)

    W = ρ^k / (μ − α),   ρ = α / μ < 1,

and its TTFT is W plus its prefill at the instance's prefill throughput θ (eq. 14). For general arrivals and service
(squared coefficients of variation c_a², c_s²), eq. 15 corrects the wait: W ≈ (c_a² + c_s²)/2 · ρ^k E[Q] / (1 − ρ)
with E[Q] = 1/μ; it equals eq. 13 when both are 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class LpsParameters:
    arrival_rate_qps: float  # α
    service_rate_qps: float  # μ: the instance's throughput in queries per second at saturation
    concurrency: float  # k: sequences decoding concurrently at saturation
    prefill_tokens_per_s: float  # θ
    arrival_scv: float = 1.0  # c_a²: squared coefficient of variation of inter-arrival times (1 for Poisson)
    service_scv: float = 1.0  # c_s²: same for service requirements (1 for exponential)

    def __post_init__(self) -> None:
        for name in ("arrival_rate_qps", "arrival_scv", "service_scv"):
            _require(getattr(self, name) >= 0, name)
        for name in ("service_rate_qps", "concurrency", "prefill_tokens_per_s"):
            _require(getattr(self, name) > 0, name)

    @property
    def utilisation(self) -> float:
        return self.arrival_rate_qps / self.service_rate_qps


def lps_wait_s(params: LpsParameters) -> float:
    """Expected queueing delay (eq. 15; eq. 13 for Poisson arrivals and exponential service). inf if ρ ≥ 1."""
    rho = params.utilisation
    if rho >= 1.0:
        return math.inf
    variability = (params.arrival_scv + params.service_scv) / 2.0
    return variability * rho**params.concurrency / (params.service_rate_qps * (1.0 - rho))


def lps_ttft_s(params: LpsParameters, num_prompt_tokens: int) -> float:
    """Eq. 14: expected wait plus the query's prefill at throughput θ."""
    return lps_wait_s(params) + num_prompt_tokens / params.prefill_tokens_per_s


def arrival_statistics(arrival_times_s: Sequence[float]) -> tuple[float, float]:
    """(α, c_a²) from observed arrival times: rate and squared coefficient of variation of the gaps."""
    times = np.sort(np.asarray(arrival_times_s, dtype=float))
    if times.size < 3 or times[-1] <= times[0]:
        raise ValueError("arrival statistics need at least three distinct arrival times")
    gaps = np.diff(times)
    mean = float(gaps.mean())
    return 1.0 / mean, float((gaps / mean).var())  # not gaps.var() / mean²: the square overflows for wide gaps


def _require(ok: bool, name: str) -> None:
    if not ok:
        raise ValueError(f"LPS parameter {name} out of range")
