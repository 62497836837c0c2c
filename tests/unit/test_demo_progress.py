"""The demo's progress line (bear.demo.runner): what it shows before any call is answered."""

from __future__ import annotations

import time

from bear.demo.runner import _progress_line
from bear.demo.workload import PolicyTurn, summarise


def test_a_turn_without_answers_shows_no_route_latency_and_its_length_unrounded() -> None:
    turn = PolicyTurn("bear", 4 / 3)
    turn.started_at_s = time.time()
    line = _progress_line(turn, summarise(turn.results))
    assert "route p50 –" in line and "None" not in line
    assert "/1.33 s" in line
