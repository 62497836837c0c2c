"""The evaluation summary's gains: ratios over a baseline whose OnTimeUtility is not positive are null, never
Infinity or NaN (summary.json must stay JSON)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from bear.evaluation.experiments import RateSweep
from bear.evaluation.runs import _gains


def _sweep(utilities: dict[str, list[float]]) -> RateSweep:
    summaries = {p: [SimpleNamespace(on_time_utility=u) for u in values] for p, values in utilities.items()}
    return RateSweep(10.0, [5.0, 10.0, 50.0], summaries, {})  # type: ignore[arg-type]


def test_gains_over_a_baseline_at_zero_or_below_are_null_and_the_summary_stays_json() -> None:
    gains = _gains(_sweep({"bear": [0.6, 0.5, 0.1], "score": [0.5, 0.4, 0.0], "routebalance": [0.4, -0.01, -0.02]}))
    json.loads(json.dumps(gains, allow_nan=False))
    assert gains["over_best_baseline_per_rate"] == [0.2, 0.25, None]
    assert gains["mean_over_best_baseline_0.3x_to_1x"] == 0.225  # 5 and 10 qps (0.5x, 1x); 50 is past 1x
    assert gains["mean_over_score"] == round((0.2 + 0.25) / 2, 4)
    assert gains["mean_over_routebalance"] == 0.5  # only the rate where it was positive
    assert gains["never_below_best_baseline"]
