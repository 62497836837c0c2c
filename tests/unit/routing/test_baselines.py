"""`score` (SCORE), `routebalance` (RouteBalance) and `vllm-sr` (vLLM Semantic Router): cases where their formulas
give a known answer."""

from __future__ import annotations

import math

import pytest

from bear.routing.contract import InstanceSignals
from bear.routing.policies.vllm_sr import percentile
from tests.unit.routing.builders import candidate, choose, request, scores_by_id


@pytest.mark.parametrize(("tpots", "expected"), [
    ((), None), ((0.02,), 0.02), ((0.01, 0.03), 0.02), ((0.01, math.nan, 0.03), 0.02), ((math.inf,), None),
])
def test_mean_recent_tpot(tpots, expected):
    assert InstanceSignals(recent_tpot_s=tpots).mean_recent_tpot_s == (None if expected is None
                                                                        else pytest.approx(expected))


# SCORE: L = tpot · (pending + output), S = acc − γ·(w_c·cost + w_L·L). Rows: accuracy, cost µ$, TPOTs, pending, output.
SCORE_CASES = [
    # id, rows, λ, params, expected choice, expected latencies
    ("idle pool: quality outweighs a short wait",
     [(0.9, 0.0, (0.05,), 0.0, 100), (0.6, 0.0, (0.01,), 0.0, 100)], 0.0, {}, "a", [5.0, 1.0]),
    ("a long remaining workload is penalised",
     [(0.9, 0.0, (0.05,), 10_000.0, 100), (0.6, 0.0, (0.01,), 0.0, 100)], 0.0, {}, "b", [505.0, 1.0]),
    ("tradeoff 0: quality alone",
     [(0.9, 1000.0, (0.05,), 10_000.0, 100), (0.6, 0.0, (0.01,), 0.0, 100)], 5e-4, {"tradeoff": 0.0}, "a",
     [505.0, 1.0]),
    ("no latency weight: eq. 4 utility",
     [(0.9, 1000.0, (0.05,), 10_000.0, 100), (0.8, 0.0, (0.01,), 0.0, 100)], 5e-4, {"latency_weight_per_s": 0.0},
     "b", [505.0, 1.0]),
    ("cost weight overrides lambda",
     [(0.9, 1000.0, (0.01,), 0.0, 100), (0.8, 0.0, (0.01,), 0.0, 100)], 5e-4, {"cost_weight_per_micro_usd": 0.0},
     "a", [1.0, 1.0]),
    ("measured TPOT is the mean of the window",
     [(0.8, 0.0, (0.01, 0.05), 0.0, 100), (0.8, 0.0, (0.02,), 0.0, 100)], 0.0, {"latency_weight_per_s": 1.0}, "b",
     [3.0, 2.0]),
    ("no TPOT: the slowest measured",
     [(0.8, 0.0, (), 0.0, 100), (0.8, 0.0, (0.02,), 0.0, 100), (0.8, 0.0, (0.01,), 0.0, 100)], 0.0,
     {"latency_weight_per_s": 1.0}, "c", [2.0, 2.0, 1.0]),
    ("no pending count: the largest known",
     [(0.8, 0.0, (0.01,), None, 100), (0.8, 0.0, (0.01,), 500.0, 100), (0.8, 0.0, (0.01,), 200.0, 100)], 0.0,
     {"latency_weight_per_s": 1.0}, "c", [6.0, 6.0, 3.0]),
    ("no TPOT anywhere: quality and cost only",
     [(0.9, 1000.0, (), 10_000.0, 100), (0.8, 0.0, (), 0.0, 100)], 5e-4, {}, "b", [None, None]),
    ("tie: first candidate",
     [(0.8, 0.0, (0.01,), 100.0, 100), (0.8, 0.0, (0.02,), 0.0, 100)], 0.0, {}, "a", [2.0, 2.0]),
]


@pytest.mark.parametrize(("rows", "lam", "params", "expected", "latencies"), [c[1:] for c in SCORE_CASES],
                         ids=[c[0] for c in SCORE_CASES])
def test_score_trades_quality_against_cost_and_completion_latency(rows, lam, params, expected, latencies):
    candidates = [candidate(chr(ord("a") + i), accuracy, cost=cost, recent_tpot=tpots, pending=pending, output=output)
                  for i, (accuracy, cost, tpots, pending, output) in enumerate(rows)]

    choice = choose("score", candidates, request(lam=lam), **params)

    assert choice.instance_id == expected
    assert [s.latency_s for s in choice.scores] == [None if x is None else pytest.approx(x) for x in latencies]
    tradeoff = params.get("tradeoff", 1.0)
    latency_weight = params.get("latency_weight_per_s", 0.01)
    cost_weight = params.get("cost_weight_per_micro_usd", lam)
    for s, (accuracy, cost, *_), latency in zip(choice.scores, rows, latencies, strict=True):
        assert s.score == pytest.approx(accuracy - tradeoff * (cost_weight * cost + latency_weight * (latency or 0.0)))
        assert s.utility == pytest.approx(accuracy - lam * cost)


def test_score_says_when_no_tpot_is_measured():
    assert "no TPOT" in choose("score", [candidate("a"), candidate("b")]).reason


@pytest.mark.parametrize(("param", "value"), [
    ("tradeoff", -1.0), ("tradeoff", math.nan), ("latency_weight_per_s", -0.1), ("cost_weight_per_micro_usd", -1e-4),
])
def test_score_rejects_bad_parameters_naming_them(param, value):
    with pytest.raises(ValueError, match=param):
        choose("score", [candidate("a")], **{param: value})


# RouteBalance: L = tpot·(max(1, o) + [no free slot]·pending / max(1, running)).
ROUTEBALANCE_LATENCY_CASES = [
    # id, signals, output tokens, expected L
    ("free slot: own tokens only", dict(recent_tpot=(0.02,), running=4, waiting=0, pending=400.0), 100, 2.0),
    ("queue: pending over the decode batch", dict(recent_tpot=(0.02,), running=4, waiting=2, pending=400.0), 100,
     4.0),
    ("at least one own token", dict(recent_tpot=(0.02,), running=4, waiting=0, pending=400.0), 0, 0.02),
    ("unknown waiting: no free slot", dict(recent_tpot=(0.02,), running=4, waiting=None, pending=400.0), 100, 4.0),
    ("unknown running: a batch of 1", dict(recent_tpot=(0.02,), running=None, waiting=1, pending=400.0), 100, 10.0),
    ("empty batch: a batch of 1", dict(recent_tpot=(0.02,), running=0, waiting=1, pending=400.0), 100, 10.0),
]


@pytest.mark.parametrize(("signals", "output", "expected"), [c[1:] for c in ROUTEBALANCE_LATENCY_CASES],
                         ids=[c[0] for c in ROUTEBALANCE_LATENCY_CASES])
def test_routebalance_latency_estimate(signals, output, expected):
    choice = choose("routebalance", [candidate("a", output=output, **signals)])

    assert choice.scores[0].latency_s == pytest.approx(expected)


# Rows: accuracy, cost µ$, TPOTs, pending, resident (running, waiting); output 100 tokens.
ROUTEBALANCE_CASES = [
    # id, rows, params, expected, expected scores
    ("uniform weights: cheaper and faster wins",
     # L: a 0.1·100 = 10 s, b 0.05·100 = 5 s; S_a = 0.9/3, S_b = (0.6 + 0.5 + 0.5)/3.
     [(0.9, 100.0, (0.1,), 0.0, (1, 0)), (0.6, 50.0, (0.05,), 0.0, (1, 0))], {}, "b", [0.3, 1.6 / 3]),
    ("quality weight only",
     [(0.9, 100.0, (0.1,), 0.0, (1, 0)), (0.6, 50.0, (0.05,), 0.0, (1, 0))],
     {"cost_weight": 0.0, "latency_weight": 0.0, "quality_weight": 1.0}, "a", [0.9, 0.6]),
    ("latency weight only: normalised by the slowest",
     # L: a 0.01·(100 + 900/3) = 4 s (queued), b 0.02·100 = 2 s, c 0.01·100 = 1 s.
     [(0.9, 0.0, (0.01,), 900.0, (3, 1)), (0.9, 0.0, (0.02,), 900.0, (3, 0)), (0.5, 0.0, (0.01,), 0.0, (0, 0))],
     {"quality_weight": 0.0, "cost_weight": 0.0, "latency_weight": 1.0}, "c", [0.0, 0.5, 0.75]),
    ("all costs zero: cost score 1 for all",
     [(0.5, 0.0, (0.01,), 0.0, (0, 0)), (0.7, 0.0, (0.01,), 0.0, (0, 0))], {}, "b", [1.5 / 3, 1.7 / 3]),
    ("no TPOT anywhere: latency score 1 for all",
     [(0.5, 10.0, (), 0.0, (0, 0)), (0.5, 20.0, (), 0.0, (0, 0))], {}, "a", [2.0 / 3, 1.5 / 3]),
    ("tie: fewer resident requests",
     [(0.5, 10.0, (0.01,), 0.0, (5, 0)), (0.5, 10.0, (0.01,), 0.0, (2, 0))], {}, "b", [0.5 / 3, 0.5 / 3]),
    ("tie: unknown queue last",
     [(0.5, 10.0, (0.01,), 0.0, (None, 0)), (0.5, 10.0, (0.01,), 0.0, (9, 0))], {}, "b", [0.5 / 3, 0.5 / 3]),
    ("tie of both: first candidate",
     [(0.5, 10.0, (0.01,), 0.0, (2, 0)), (0.5, 10.0, (0.01,), 0.0, (2, 0))], {}, "a", [0.5 / 3, 0.5 / 3]),
]


@pytest.mark.parametrize(("rows", "params", "expected", "scores"), [c[1:] for c in ROUTEBALANCE_CASES],
                         ids=[c[0] for c in ROUTEBALANCE_CASES])
def test_routebalance_maximises_weighted_normalised_scores(rows, params, expected, scores):
    candidates = [candidate(chr(ord("a") + i), accuracy, cost=cost, recent_tpot=tpots, pending=pending,
                            running=running, waiting=waiting)
                  for i, (accuracy, cost, tpots, pending, (running, waiting)) in enumerate(rows)]

    choice = choose("routebalance", candidates, **params)

    assert choice.instance_id == expected
    assert list(scores_by_id(choice).values()) == pytest.approx(scores)


@pytest.mark.parametrize("param", ["quality_weight", "cost_weight", "latency_weight"])
def test_routebalance_rejects_negative_weights_naming_them(param):
    with pytest.raises(ValueError, match=param):
        choose("routebalance", [candidate("a")], **{param: -0.1})


PERCENTILE_CASES = [
    # id, observations, q, expected
    ("none", (), 95, None),
    ("one observation: itself", (2.0,), 95, 2.0),
    ("two observations: moving average", (1.0, 2.0), 50, 0.3 * 2.0 + 0.7 * 1.0),
    ("median of five", (5.0, 1.0, 4.0, 2.0, 3.0), 50, 3.0),
    ("p90 interpolates", (1.0, 2.0, 3.0, 4.0, 5.0), 90, 4.6),
    ("p100 is the maximum", (1.0, 2.0, 3.0, 4.0, 5.0), 100, 5.0),
    ("p1 near the minimum", (1.0, 2.0, 3.0), 1, 1.02),
    ("non-finite and non-positive dropped", (1.0, math.nan, 2.0, -1.0, 0.0, 3.0, math.inf), 50, 2.0),
]


@pytest.mark.parametrize(("observations", "q", "expected"), [c[1:] for c in PERCENTILE_CASES],
                         ids=[c[0] for c in PERCENTILE_CASES])
def test_vllm_sr_percentile(observations, q, expected):
    assert percentile(observations, q) == (None if expected is None else pytest.approx(expected))


SLOW_TTFT_FAST_TPOT = dict(recent_ttft=(2.0, 2.0, 2.0), recent_tpot=(0.02, 0.02, 0.02))
FAST_TTFT_SLOW_TPOT = dict(recent_ttft=(1.0, 1.0, 1.0), recent_tpot=(0.04, 0.04, 0.04))
VLLM_SR_CASES = [
    # id, candidates (keyword arguments), params, expected, expected scores
    ("mean of normalised percentiles; tie: first", [SLOW_TTFT_FAST_TPOT, FAST_TTFT_SLOW_TPOT], {}, "a", [-1.5, -1.5]),
    ("TTFT only", [SLOW_TTFT_FAST_TPOT, FAST_TTFT_SLOW_TPOT], {"tpot_percentile": 0}, "b", [-2.0, -1.0]),
    ("TPOT only", [FAST_TTFT_SLOW_TPOT, SLOW_TTFT_FAST_TPOT], {"ttft_percentile": 0}, "b", [-2.0, -1.0]),
    ("the tail decides", [dict(recent_ttft=(0.1,) * 9 + (5.0,)), dict(recent_ttft=(1.0,) * 10)],
     {"tpot_percentile": 0, "ttft_percentile": 95}, "b", [-2.795, -1.0]),
    ("the median decides", [dict(recent_ttft=(0.1,) * 9 + (5.0,)), dict(recent_ttft=(1.0,) * 10)],
     {"tpot_percentile": 0, "ttft_percentile": 50}, "a", [-1.0, -10.0]),
    ("only the last window observations", [dict(recent_ttft=(9.0, 9.0, 9.0, 1.0, 1.0, 1.0)), dict(recent_ttft=(2.0,))],
     {"tpot_percentile": 0, "window": 3}, "a", [-1.0, -2.0]),
    ("unobserved counts as fastest", [dict(recent_ttft=(2.0,) * 3), dict(), dict(recent_ttft=(1.0,) * 3)],
     {"tpot_percentile": 0}, "b", [-2.0, 0.0, -1.0]),
    ("unobserved beats the first and only measured one", [dict(recent_ttft=(5.0, 6.0, 7.0)), dict()],
     {"tpot_percentile": 0}, "b", [-1.0, 0.0]),
    ("a metric not yet measured counts as fastest", [FAST_TTFT_SLOW_TPOT, dict(recent_ttft=(1.0,) * 3)], {}, "b",
     [-1.0, -0.5]),
    ("unobserved skipped as in Semantic Router", [dict(recent_ttft=(2.0,) * 3), dict(), dict(recent_ttft=(1.0,) * 3)],
     {"tpot_percentile": 0, "unobserved": "skip"}, "c", [-2.0, -math.inf, -1.0]),
    ("no observations: first candidate", [dict(), dict()], {}, "a", [0.0, 0.0]),
    ("no observations, skip: first candidate", [dict(), dict()], {"unobserved": "skip"}, "a", [-math.inf, -math.inf]),
]


@pytest.mark.parametrize(("signals", "params", "expected", "scores"), [c[1:] for c in VLLM_SR_CASES],
                         ids=[c[0] for c in VLLM_SR_CASES])
def test_vllm_sr_picks_the_lowest_normalised_percentiles(signals, params, expected, scores):
    # Quality and cost favour the last candidate; the policy must not care.
    candidates = [candidate(chr(ord("a") + i), 0.1 + 0.1 * i, cost=100.0 - i, **kwargs)
                  for i, kwargs in enumerate(signals)]

    choice = choose("vllm-sr", candidates, **params)

    assert choice.instance_id == expected
    assert list(scores_by_id(choice).values()) == pytest.approx(scores)


def test_vllm_sr_reports_its_ttft_percentile_as_the_ttft_estimate():
    choice = choose("vllm-sr", [candidate("a", recent_ttft=(1.0, 2.0, 3.0)), candidate("b")], ttft_percentile=50)

    assert [s.ttft_s for s in choice.scores] == [2.0, None]


def test_vllm_sr_says_when_nothing_is_observed():
    assert "no latency observations" in choose("vllm-sr", [candidate("a"), candidate("b")]).reason


@pytest.mark.parametrize(("params", "named"), [
    ({"ttft_percentile": 101}, "ttft_percentile"), ({"tpot_percentile": -1}, "tpot_percentile"),
    ({"ttft_percentile": 0, "tpot_percentile": 0}, "ttft_percentile"), ({"window": 0}, "window"),
    ({"unobserved": "guess"}, "unobserved"), ({"ttft_percentile": 95.5}, "ttft_percentile"),
])
def test_vllm_sr_rejects_bad_parameters_naming_them(params, named):
    with pytest.raises(ValueError, match=named):
        choose("vllm-sr", [candidate("a")], **params)
