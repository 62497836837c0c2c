"""Query arrival processes and TTFT targets of the paper's experiments (Appendix A.2, Appendix B).

- Poisson arrivals at a mean rate ᾱ.
- MMPP-2 (two-state Markov-modulated Poisson): a low state L and a burst state H with rates α_L and α_H = r·α_L,
  α_L = ᾱ / ((1 − p_H) + p_H·r), p_H = 0.2, switching L→H at 0.1/s and H→L at 0.4/s (the paper's Table 3).
- TTFT targets (A.2): τ = min(1120 ms, max(150 ms, u + (155 + 3.5e-3·p)·v)) with u ~ U(1, 5) ms, v ~ U(0.98, 1.02)
  and p the prompt's token count; the "loose" variant doubles them.

Everything is drawn from a numpy Generator the caller seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MMPP_HIGH_FRACTION = 0.2  # p_H
MMPP_LOW_TO_HIGH_PER_S = 0.1
MMPP_HIGH_TO_LOW_PER_S = 0.4


def poisson_arrivals_s(rate_qps: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` arrival times (seconds from 0) of a Poisson process."""
    _check_rate(rate_qps)
    return np.cumsum(rng.exponential(1.0 / rate_qps, size=count))


@dataclass(frozen=True, slots=True)
class Mmpp2:
    """The paper's two-state MMPP for a mean rate and a high-to-low rate ratio r."""

    mean_rate_qps: float
    ratio: float  # r = α_H / α_L

    def __post_init__(self) -> None:
        _check_rate(self.mean_rate_qps)
        if not (math.isfinite(self.ratio) and self.ratio >= 1):
            raise ValueError(f"MMPP-2 rate ratio must be >= 1, got {self.ratio!r}")

    @property
    def low_rate_qps(self) -> float:
        return self.mean_rate_qps / ((1 - MMPP_HIGH_FRACTION) + MMPP_HIGH_FRACTION * self.ratio)

    @property
    def high_rate_qps(self) -> float:
        return self.ratio * self.low_rate_qps

    def arrivals_s(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """`count` arrival times, starting in the stationary state distribution (80% low, 20% high)."""
        times: list[float] = []
        now, high = 0.0, bool(rng.random() < MMPP_HIGH_FRACTION)
        while len(times) < count:
            stay = rng.exponential(1.0 / (MMPP_HIGH_TO_LOW_PER_S if high else MMPP_LOW_TO_HIGH_PER_S))
            rate = self.high_rate_qps if high else self.low_rate_qps
            t = now + rng.exponential(1.0 / rate)
            while t < now + stay and len(times) < count:
                times.append(t)
                t += rng.exponential(1.0 / rate)
            now, high = now + stay, not high
        return np.array(times)


def ttft_targets_s(prompt_tokens: np.ndarray, rng: np.random.Generator, *, looseness: float = 1.0) -> np.ndarray:
    """Appendix A.2's TTFT target per query, in seconds (`looseness` 2 for the variant with targets twice as loose)."""
    if not (math.isfinite(looseness) and looseness > 0):
        raise ValueError(f"looseness must be a positive number, got {looseness!r}")
    p = np.asarray(prompt_tokens, dtype=float)
    u = rng.uniform(1.0, 5.0, size=p.shape)
    v = rng.uniform(0.98, 1.02, size=p.shape)
    target_ms = np.minimum(1120.0, np.maximum(150.0, u + (155.0 + 3.5e-3 * p) * v))
    return looseness * target_ms / 1000.0


def _check_rate(rate_qps: float) -> None:
    if not (math.isfinite(rate_qps) and rate_qps > 0):
        raise ValueError(f"arrival rate must be a positive number of queries per second, got {rate_qps!r}")
