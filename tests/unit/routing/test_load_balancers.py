"""`round-robin`, `shortest-queue` and `lmdeploy`: load balancers that ignore the TTFT target."""

from __future__ import annotations

import math

import pytest

from bear.routing.registry import build_policy
from tests.unit.routing.builders import candidate, choose, request, scores_by_id


@pytest.mark.parametrize("orders", [
    ["abc"] * 6,
    ["cab", "bca", "acb", "abc", "cba", "bac"],  # the caller lists them differently each time
])
def test_round_robin_cycles_by_instance_id_whatever_the_order(orders):
    policy = build_policy("round-robin")

    chosen = [policy.choose(request(), [candidate(i) for i in order]).instance_id for order in orders]

    assert chosen == ["a", "b", "c", "a", "b", "c"]


def test_round_robin_scores_the_chosen_one_and_keeps_the_callers_order():
    choice = build_policy("round-robin").choose(request(), [candidate("b"), candidate("a")])

    assert [(s.instance_id, s.score) for s in choice.scores] == [("b", 0.0), ("a", 1.0)]


def test_round_robin_instances_do_not_share_a_counter():
    first, second = build_policy("round-robin"), build_policy("round-robin")
    candidates = [candidate("a"), candidate("b")]

    first.choose(request(), candidates)

    assert second.choose(request(), candidates).instance_id == "a"


def test_round_robin_ignores_quality_and_latency():
    candidates = [candidate("a", 0.1, ttft=100.0), candidate("b", 0.9, ttft=0.1)]

    assert build_policy("round-robin").choose(request(), candidates).instance_id == "a"


SHORTEST_QUEUE_CASES = [
    # id, (accuracy, running, waiting) per instance, expected
    ("fewest resident requests", [(0.9, 5, 3), (0.5, 2, 1), (0.7, 4, 0)], "b"),
    ("waiting requests count", [(0.5, 1, 5), (0.5, 4, 0)], "b"),
    ("tie: better utility", [(0.5, 2, 0), (0.8, 1, 1)], "b"),
    ("tie of both: first candidate", [(0.8, 2, 0), (0.8, 1, 1)], "a"),
    ("missing running counts as longest", [(0.9, None, 0), (0.5, 50, 50)], "b"),
    ("missing waiting counts as longest", [(0.9, 0, None), (0.5, 50, 50)], "b"),
    ("all missing: better utility", [(0.5, None, None), (0.8, None, 1)], "b"),
]


@pytest.mark.parametrize(("rows", "expected"), [c[1:] for c in SHORTEST_QUEUE_CASES],
                         ids=[c[0] for c in SHORTEST_QUEUE_CASES])
def test_shortest_queue_picks_the_fewest_resident_requests(rows, expected):
    candidates = [candidate(chr(ord("a") + i), accuracy, running=running, waiting=waiting)
                  for i, (accuracy, running, waiting) in enumerate(rows)]

    choice = choose("shortest-queue", candidates)

    assert choice.instance_id == expected
    for s, (_, running, waiting) in zip(choice.scores, rows, strict=True):
        assert s.score == (-math.inf if running is None or waiting is None else -(running + waiting))


LMDEPLOY_CASES = [
    # id, (accuracy, running, waiting, request/s) per instance, expected, expected latencies (unfinished / speed)
    ("least unfinished per request/s", [(0.5, 6, 4, 5.0), (0.5, 3, 0, 1.0)], "a", [2.0, 3.0]),
    ("queue length alone misleads", [(0.5, 1, 0, 0.1), (0.5, 8, 2, 10.0)], "b", [10.0, 1.0]),
    ("no throughput: the slowest measured", [(0.5, 6, 4, 5.0), (0.5, 2, 1, None)], "b", [2.0, 3.0 / 5.0]),
    ("zero throughput counts as unmeasured", [(0.5, 2, 0, 0.5), (0.5, 1, 0, 0.0)], "b", [4.0, 2.0]),
    ("none measured: 1 request/s", [(0.5, 3, 0, None), (0.5, 2, 0, None)], "b", [3.0, 2.0]),
    ("no queue counts as unbounded", [(0.9, None, 0, 100.0), (0.5, 9, 9, 1.0)], "b", [math.inf, 18.0]),
    ("tie: better utility", [(0.5, 2, 0, 1.0), (0.8, 4, 0, 2.0)], "b", [2.0, 2.0]),
    ("tie of both: first candidate", [(0.8, 2, 0, 1.0), (0.8, 4, 0, 2.0)], "a", [2.0, 2.0]),
]


@pytest.mark.parametrize(("rows", "expected", "latencies"), [c[1:] for c in LMDEPLOY_CASES],
                         ids=[c[0] for c in LMDEPLOY_CASES])
def test_lmdeploy_picks_the_least_unfinished_requests_per_throughput(rows, expected, latencies):
    candidates = [candidate(chr(ord("a") + i), accuracy, running=running, waiting=waiting, rps=rps)
                  for i, (accuracy, running, waiting, rps) in enumerate(rows)]

    choice = choose("lmdeploy", candidates)

    assert choice.instance_id == expected
    assert list(scores_by_id(choice).values()) == pytest.approx([-latency for latency in latencies])
    measured = any(rps for _, _, _, rps in rows)  # the reason says when no throughput was measured
    assert choice.reason.endswith("(no throughput measured: least unfinished requests)") is not measured
