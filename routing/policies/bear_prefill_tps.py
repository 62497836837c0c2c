"""`bear-prefill-tps`: BEAR's rule (eq. 5) with the prefill-throughput TTFT estimator (eq. 8) instead of the replay —
the estimator ablation of the paper's Fig. 16. Same parameters as `bear`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from bear.routing.contract import Estimator
from bear.routing.policies.bear_constrained import Bear
from bear.routing.registry import register


@register
@dataclass
class BearPrefillTps(Bear):
    name: ClassVar[str] = "bear-prefill-tps"
    estimator: ClassVar[Estimator | None] = Estimator.PREFILL_TPS
