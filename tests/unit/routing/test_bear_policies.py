"""`bear` (eq. 5 with its fallbacks), `bear-prefill-tps`, `bear-lagrangian` (eq. 7) and `latency-agnostic` (eq. 4)."""

from __future__ import annotations

import math

import pytest

from bear.routing.contract import Decision
from tests.unit.routing.builders import candidate, choose, request

# (accuracy, BEA TTFT estimate) per instance a, b, c, ...; cost 0, so utility = accuracy. The target τ is 1 s.
BEAR_CASES = [
    # id, instances, params, expected instance (None: shed)
    ("best utility among feasible", [(0.9, 2.0), (0.7, 0.5), (0.8, 0.9)], {}, "c"),
    ("all feasible: best utility", [(0.9, 0.1), (0.7, 0.2)], {}, "a"),
    ("feasible tie: lower TTFT (replicas share the load)", [(0.8, 0.5), (0.8, 0.2)], {}, "b"),
    ("feasible tie, equal TTFTs: first candidate", [(0.8, 0.2), (0.8, 0.2)], {}, "a"),
    ("TTFT equal to the target is feasible", [(0.9, 1.0), (0.5, 0.1)], {}, "a"),
    ("no estimate is infeasible", [(0.9, None), (0.5, 0.5)], {}, "b"),
    ("NaN estimate is infeasible", [(0.9, math.nan), (0.5, 0.5)], {}, "b"),
    ("safety margin excludes the near miss", [(0.9, 0.8), (0.5, 0.5)], {"safety": 1.5}, "b"),
    ("safety margin 1 keeps it", [(0.9, 0.8), (0.5, 0.5)], {"safety": 1.0}, "a"),
    ("safety margin below 1 admits a late one", [(0.9, 1.2), (0.5, 0.5)], {"safety": 0.8}, "a"),
    ("min-ttft fallback: lowest estimate", [(0.9, 3.0), (0.5, 2.0), (0.7, 2.5)], {"fallback": "min-ttft"}, "b"),
    ("min-ttft fallback tie: first candidate", [(0.9, 2.0), (0.5, 2.0)], {"fallback": "min-ttft"}, "a"),
    ("min-ttft fallback skips missing estimates", [(0.9, None), (0.5, 4.0)], {"fallback": "min-ttft"}, "b"),
    ("max-utility fallback (the default)", [(0.5, 2.0), (0.9, 3.0), (0.7, 2.5)], {}, "b"),
    ("max-utility fallback skips missing estimates", [(0.9, None), (0.5, 4.0), (0.7, 5.0)], {}, "c"),
    ("shed: fastest misses by more than 2x", [(0.9, 3.0), (0.5, 2.5)], {"fallback": "shed"}, None),
    ("shed: fastest within 2x routes to it", [(0.9, 3.0), (0.5, 1.5)], {"fallback": "shed"}, "b"),
    ("shed: exactly 2x routes", [(0.9, 3.0), (0.5, 2.0)], {"fallback": "shed"}, "b"),
    ("shed with shed_ratio 3", [(0.9, 3.0), (0.5, 2.5)], {"fallback": "shed", "shed_ratio": 3.0}, "b"),
    ("shed is not used while one is feasible", [(0.9, 3.0), (0.5, 0.5)], {"fallback": "shed"}, "b"),
    ("no estimates at all: best utility", [(0.6, None), (0.9, None)], {"fallback": "min-ttft"}, "b"),
    ("no estimates at all, shed: best utility", [(0.6, None), (0.9, None)], {"fallback": "shed"}, "b"),
    ("no estimates at all, max-utility: best utility", [(0.6, None), (0.9, None)], {}, "b"),
]


def _instances(rows: list[tuple[float, float | None]]) -> list:
    return [candidate(chr(ord("a") + i), accuracy, ttft=ttft) for i, (accuracy, ttft) in enumerate(rows)]


@pytest.mark.parametrize(("instances", "params", "expected"), [c[1:] for c in BEAR_CASES],
                         ids=[c[0] for c in BEAR_CASES])
def test_bear_follows_eq5_and_its_fallback(instances, params, expected):
    choice = choose("bear", _instances(instances), request(1.0), **params)

    assert choice.instance_id == expected
    assert choice.decision == (Decision.SHED if expected is None else Decision.ROUTE)
    assert choice.reason


def test_bear_explores_an_idle_instance_without_an_estimate_and_only_while_idle():
    """A fresh pool: no instance of the 0.6B has a calibration to estimate from; the others are past the target."""
    rows = [candidate("busy", 0.9, ttft=3.0), candidate("fresh", 0.5, running=0, waiting=0)]
    choice = choose("bear", rows, request(1.0))
    assert choice.instance_id == "fresh" and "explored" in choice.reason
    assert [(s.ttft_s, s.feasible) for s in choice.scores] == [(3.0, False), (None, True)]
    for running, waiting in ((1, 0), (0, 2), (None, None)):  # busy, or no snapshot to tell: infeasible
        rows = [candidate("busy", 0.9, ttft=3.0), candidate("fresh", 0.5, running=running, waiting=waiting)]
        assert choose("bear", rows, request(1.0)).instance_id == "busy"
    rows = [candidate("busy", 0.9, ttft=3.0), candidate("fresh", 0.5, running=0, waiting=0)]
    assert choose("bear", rows, request(1.0), explore_idle=False).instance_id == "busy"
    # an idle instance without an estimate competes on utility with those meeting the target
    rows = [candidate("good", 0.9, ttft=0.2), candidate("fresh", 0.5, running=0, waiting=0)]
    assert choose("bear", rows, request(1.0)).instance_id == "good"


def test_bear_records_each_estimate_and_its_feasibility():
    choice = choose("bear", _instances([(0.9, 2.0), (0.7, 0.5), (0.8, None)]), request(1.0))

    assert [(s.instance_id, s.ttft_s, s.feasible) for s in choice.scores] == [
        ("a", 2.0, False), ("b", 0.5, True), ("c", None, False)]
    assert [s.utility for s in choice.scores] == [s.score for s in choice.scores] == [0.9, 0.7, 0.8]


def test_bear_utility_is_accuracy_minus_lambda_cost():
    expensive, cheap = candidate("a", 0.9, cost=1000.0, ttft=0.1), candidate("b", 0.8, cost=0.0, ttft=0.1)

    assert choose("bear", [expensive, cheap], request(1.0, lam=5e-4)).instance_id == "b"  # 0.9 - 0.5 < 0.8
    assert choose("bear", [expensive, cheap], request(1.0, lam=0.0)).instance_id == "a"


@pytest.mark.parametrize(("name", "expected"), [("bear", "a"), ("bear-prefill-tps", "b")])
def test_each_bear_variant_reads_only_its_estimator(name, expected):
    # a is feasible by the replay only, b by prefill throughput only.
    candidates = [candidate("a", 0.9, ttft=0.5, prefill_tps_ttft=5.0), candidate("b", 0.7, ttft=5.0, prefill_tps_ttft=0.5)]

    assert choose(name, candidates, request(1.0)).instance_id == expected


@pytest.mark.parametrize("name", ["bear", "bear-prefill-tps"])
@pytest.mark.parametrize(("param", "value"), [
    ("safety", 0.0), ("safety", -1.0), ("safety", math.inf), ("safety", math.nan),
    ("fallback", "defer"), ("shed_ratio", 0.5), ("shed_ratio", math.inf),
])
def test_bear_rejects_bad_parameters_naming_them(name, param, value):
    with pytest.raises(ValueError, match=param):
        choose(name, _instances([(0.5, 0.1)]), **{param: value})


# Lagrangian: utility − δ·TTFT. a: U 0.9, TTFT 2 s; b: U 0.7, TTFT 0.5 s; c: U 0.8, TTFT 1 s.
LAGRANGIAN_ROWS = [(0.9, 2.0), (0.7, 0.5), (0.8, 1.0)]
LAGRANGIAN_CASES = [
    # id, policy default δ, request δ, expected
    ("delta 0 (policy default) is latency-agnostic", 0.0, None, "a"),
    ("delta 0 on the request overrides the default", 0.1, 0.0, "a"),
    ("small delta keeps utility ahead", 0.05, None, "a"),  # 0.8, 0.675, 0.75
    ("delta 0.15 picks the middle", 0.15, None, "c"),  # 0.6, 0.625, 0.65
    ("request delta overrides the default", 0.0, 0.15, "c"),
    ("large delta minimises TTFT", 0.0, 1e6, "b"),
]


@pytest.mark.parametrize(("default_delta", "request_delta", "expected"), [c[1:] for c in LAGRANGIAN_CASES],
                         ids=[c[0] for c in LAGRANGIAN_CASES])
def test_bear_lagrangian_maximises_utility_minus_delta_ttft(default_delta, request_delta, expected):
    req = request(1.0, delta=request_delta)
    choice = choose("bear-lagrangian", _instances(LAGRANGIAN_ROWS), req, default_delta_per_s=default_delta)

    assert choice.instance_id == expected
    delta = default_delta if request_delta is None else request_delta
    for s, (utility, ttft) in zip(choice.scores, LAGRANGIAN_ROWS, strict=True):
        assert s.score == pytest.approx(utility - delta * ttft)
        assert s.feasible == (ttft <= 1.0)


def test_bear_lagrangian_delta_zero_agrees_with_latency_agnostic():
    rows = [(0.6, 0.1), (0.95, 9.0), (0.7, 0.3)]

    agnostic = choose("latency-agnostic", _instances(rows))
    lagrangian = choose("bear-lagrangian", _instances(rows), default_delta_per_s=0.0)

    assert lagrangian.instance_id == agnostic.instance_id == "b"


def test_bear_lagrangian_large_delta_agrees_with_min_ttft():
    rows = [(0.6, 0.4), (0.95, 9.0), (0.7, 0.3)]

    assert choose("bear-lagrangian", _instances(rows), default_delta_per_s=1e6).instance_id == "c"


@pytest.mark.parametrize(("rows", "expected"), [
    ([(0.9, None), (0.5, 3.0)], "b"),  # a candidate without an estimate scores −∞
    ([(0.5, None), (0.9, None)], "b"),  # none has one: best utility
])
def test_bear_lagrangian_without_estimates(rows, expected):
    choice = choose("bear-lagrangian", _instances(rows))

    assert choice.instance_id == expected
    assert choice.scores[0].score == -math.inf


def test_bear_lagrangian_rejects_a_negative_default_delta():
    with pytest.raises(ValueError, match="default_delta_per_s"):
        choose("bear-lagrangian", _instances([(0.5, 0.1)]), default_delta_per_s=-0.1)


LATENCY_AGNOSTIC_CASES = [
    # id, (accuracy, cost µ$) per instance, λ, expected
    ("best accuracy at zero cost", [(0.6, 0.0), (0.9, 0.0), (0.7, 0.0)], 5e-4, "b"),
    ("cost counts through lambda", [(0.9, 1000.0), (0.8, 0.0)], 5e-4, "b"),
    ("lambda 0 ignores cost", [(0.9, 1000.0), (0.8, 0.0)], 0.0, "a"),
    ("tie: first candidate", [(0.8, 0.0), (0.8, 0.0)], 5e-4, "a"),
]


@pytest.mark.parametrize(("rows", "lam", "expected"), [c[1:] for c in LATENCY_AGNOSTIC_CASES],
                         ids=[c[0] for c in LATENCY_AGNOSTIC_CASES])
def test_latency_agnostic_maximises_eq4_utility(rows, lam, expected):
    candidates = [candidate(chr(ord("a") + i), accuracy, cost=cost, ttft=100.0)
                  for i, (accuracy, cost) in enumerate(rows)]

    choice = choose("latency-agnostic", candidates, request(1.0, lam=lam))

    assert choice.instance_id == expected
    assert [s.score for s in choice.scores] == pytest.approx([a - lam * c for a, c in rows])
