"""Exponential back-off with full jitter, for retrying an unavailable dependency (Redis) without hammering it.

The n-th consecutive failure waits a random time in [0, min(cap, base · 2^n)] ("full jitter"), so that many sidecars
that lost Redis together do not retry in lockstep. A success resets the count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    base_s: float = 0.05
    cap_s: float = 5.0
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0  # consecutive failures so far

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError("back-off needs 0 < base_s <= cap_s")

    def failed(self) -> float:
        """Records a failure; returns how long to wait before the next try."""
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(self.failures, 62))
        self.failures += 1
        return self.rng.uniform(0.0, ceiling)

    def succeeded(self) -> None:
        self.failures = 0
