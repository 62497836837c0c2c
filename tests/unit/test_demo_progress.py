"""The demo's progress line and results table (bear.demo.runner): what they show before any call is answered, and
for a turn that sent no query."""

from __future__ import annotations

import io
import json
import time

from bear.demo.runner import DemoConfig, _print_results, _progress_line
from bear.demo.workload import PolicyTurn, gains, summarise


def test_a_turn_without_answers_shows_no_route_latency_and_its_length_unrounded() -> None:
    turn = PolicyTurn("bear", 4 / 3)
    turn.started_at_s = time.time()
    line = _progress_line(turn, summarise(turn.results))
    assert "route p50 –" in line and "None" not in line
    assert "/1.33 s" in line


def test_a_turn_with_no_query_scores_nothing_rather_than_zero() -> None:
    """A turn too short for its rate to send a query: null figures in --json, '-' in the table, no gain computed."""
    summary = summarise([])
    assert summary["on_time_utility"] is None and summary["slo_attainment"] is None and summary["queries"] == 0
    turn = PolicyTurn("score", 2.0)
    line = _progress_line(turn, summary)
    assert "on time –" in line and "OnTimeUtility –" in line and "None" not in line
    report = {"policies": {"bear": {**summary, "on_time_utility": 0.5, "slo_attainment": 0.9, "queries": 10},
                           "score": summary}}
    out = io.StringIO()
    _print_results(report, DemoConfig(duration_s=10, rate_qps=0.1, policies=("bear", "score")), out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("score "))
    assert row.split()[:4] == ["score", "0", "-", "-"] and "0.0%" not in row
    assert "OnTimeUtility vs" not in out.getvalue()  # no gain over a policy that scored nothing
    assert gains(report["policies"], "bear") == {}
    json.dumps(summary, allow_nan=False)
