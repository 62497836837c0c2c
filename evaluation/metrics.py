"""What a run of the simulated pool measured: OnTimeUtility (eq. 6), SLO attainment, routing mix, estimate errors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bear.evaluation.simulation import Outcome
from bear.routing.contract import Decision


@dataclass(frozen=True, slots=True)
class RunSummary:
    policy: str
    rate_qps: float
    num_queries: int
    on_time_utility: float  # eq. 6: mean realised utility, 0 for queries missing their target (or shed)
    slo_attainment: float  # share of queries served within their target
    mean_utility: float  # realised utility of the served queries, on time or not
    mean_ttft_s: float
    shed_fraction: float
    routes: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> {"met": n, "missed": n}
    ttft_pairs: tuple[tuple[float, float], ...] = ()  # (BEA estimate, real TTFT) of routed queries with an estimate
    prefill_tps_pairs: tuple[tuple[float, float], ...] = ()  # (eq. 8 estimate, real TTFT)

    @property
    def ttft_mape(self) -> float:
        return mape_of(self.ttft_pairs)

    def to_json(self) -> dict[str, object]:
        """NaN (a metric over no queries) is null: the result stays JSON."""
        return {"policy": self.policy, "rate_qps": self.rate_qps, "num_queries": self.num_queries,
                "on_time_utility": _known(self.on_time_utility), "slo_attainment": _known(self.slo_attainment),
                "mean_utility": _known(self.mean_utility), "mean_ttft_s": _known(self.mean_ttft_s),
                "shed_fraction": _known(self.shed_fraction), "routes": self.routes,
                "ttft_mape": _known(self.ttft_mape)}


def _known(value: float) -> float | None:
    return None if math.isnan(value) else value


def summarise(policy: str, rate_qps: float, outcomes: Sequence[Outcome], warmup: int = 0) -> RunSummary:
    """Metrics over the outcomes after the first `warmup` queries (the pool starts empty)."""
    if not 0 <= warmup < len(outcomes):
        raise ValueError(f"warmup must be in [0, {len(outcomes)}) for {len(outcomes)} outcomes, got {warmup!r}")
    measured = list(outcomes[warmup:])
    served = [o for o in measured if o.decision is Decision.ROUTE and o.ttft_s is not None]
    routes: dict[str, dict[str, int]] = {}
    for o in served:
        entry = routes.setdefault(o.model or "", {"met": 0, "missed": 0})
        entry["met" if o.on_time else "missed"] += 1
    pairs = tuple((o.estimated_ttft_s, o.ttft_s) for o in served
                  if o.estimated_ttft_s is not None and math.isfinite(o.estimated_ttft_s) and not o.estimate_lower_bound)
    prefill = tuple((o.prefill_tps_estimates[o.instance_id], o.ttft_s) for o in served
                    if o.instance_id is not None and o.prefill_tps_estimates.get(o.instance_id) is not None)
    return RunSummary(
        policy=policy,
        rate_qps=rate_qps,
        num_queries=len(measured),
        on_time_utility=float(np.mean([o.on_time_utility for o in measured])) if measured else math.nan,
        slo_attainment=float(np.mean([o.on_time for o in measured])) if measured else math.nan,
        mean_utility=float(np.mean([o.utility for o in served])) if served else math.nan,
        mean_ttft_s=float(np.mean([o.ttft_s for o in served])) if served else math.nan,
        shed_fraction=float(np.mean([o.decision is Decision.SHED for o in measured])) if measured else math.nan,
        routes=routes,
        ttft_pairs=pairs,  # type: ignore[arg-type]
        prefill_tps_pairs=prefill,  # type: ignore[arg-type]
    )


def mape_of(pairs: Sequence[tuple[float, float]]) -> float:
    """Mean absolute percentage error of (estimate, actual) pairs, as a fraction (nan if none)."""
    usable = [(e, a) for e, a in pairs if a > 0]
    if not usable:
        return math.nan
    return float(np.mean([abs(e - a) / a for e, a in usable]))
