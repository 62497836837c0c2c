"""The registry by name, and the contract every registered policy keeps."""

from __future__ import annotations

import dataclasses
import re

import pytest

from bear.routing.contract import Choice, Decision, Estimator
from bear.routing.registry import UnknownPolicy, build_policy, policy_names
from tests.unit.routing.builders import candidate, request

ISSUE_NAMES = ["bear", "bear-lagrangian", "bear-prefill-tps", "latency-agnostic", "round-robin", "shortest-queue",
               "lmdeploy", "score", "routebalance", "vllm-sr"]
ESTIMATORS = {"bear": Estimator.BEA, "bear-lagrangian": Estimator.BEA, "bear-prefill-tps": Estimator.PREFILL_TPS}


def test_every_policy_of_the_issue_is_registered():
    assert sorted(policy_names()) == sorted(ISSUE_NAMES)


@pytest.mark.parametrize("name", ISSUE_NAMES)
def test_a_policy_is_a_dataclass_under_its_kebab_case_name(name):
    policy = build_policy(name)

    assert re.fullmatch(r"[a-z]+(-[a-z]+)*", name)
    assert policy.name == name
    assert dataclasses.is_dataclass(policy)
    assert policy.estimator == ESTIMATORS.get(name)


@pytest.mark.parametrize("name", ISSUE_NAMES)
def test_build_policy_returns_a_fresh_instance(name):
    assert build_policy(name) is not build_policy(name)


def test_an_unknown_name_is_named_with_the_choices():
    with pytest.raises(UnknownPolicy, match=r"'bear-fast'.*bear-lagrangian.*vllm-sr"):
        build_policy("bear-fast")


def test_an_unknown_policy_is_a_value_error():
    assert issubclass(UnknownPolicy, ValueError)


@pytest.mark.parametrize(("name", "parameter"), [
    ("bear", "saftey"), ("round-robin", "_count"), ("latency-agnostic", "lambda_per_micro_usd"),
    ("vllm-sr", "percentile"), ("score", "alpha"), ("routebalance", "w_balance"),
])
def test_an_unknown_parameter_is_named_with_the_policy(name, parameter):
    with pytest.raises(ValueError, match=rf"'{name}'.*'{parameter}'"):
        build_policy(name, {parameter: 1})


@pytest.mark.parametrize(("name", "params"), [
    ("bear", {"safety": 1.2, "fallback": "shed", "shed_ratio": 3.0}),
    ("bear-prefill-tps", {"fallback": "max-utility"}),
    ("bear-lagrangian", {"default_delta_per_s": 0.5}),
    ("score", {"tradeoff": 0.5, "latency_weight_per_s": 0.1, "cost_weight_per_micro_usd": 1e-3}),
    ("routebalance", {"quality_weight": 0.5, "cost_weight": 0.25, "latency_weight": 0.25}),
    ("vllm-sr", {"ttft_percentile": 50, "tpot_percentile": 0, "window": 100, "unobserved": "skip"}),
])
def test_parameters_reach_the_policy(name, params):
    policy = build_policy(name, params)

    assert {key: getattr(policy, key) for key in params} == params


RICH = [
    candidate("a", 0.9, cost=800.0, ttft=2.0, prefill_tps_ttft=1.5, running=8, waiting=4, rps=2.0,
              recent_ttft=(0.5, 1.5, 2.5), recent_tpot=(0.03, 0.04), pending=4000.0, output=300),
    candidate("b", 0.6, cost=20.0, ttft=0.2, prefill_tps_ttft=0.3, running=2, waiting=0, rps=6.0,
              recent_ttft=(0.1, 0.2, 0.3), recent_tpot=(0.01,), pending=300.0, output=150),
    candidate("c", 0.75, cost=150.0, ttft=0.9, prefill_tps_ttft=0.4, running=5, waiting=1, rps=3.0,
              recent_ttft=(0.4, 0.6, 0.8), recent_tpot=(0.02, 0.02), pending=1500.0, output=200),
]
BARE = [candidate("a", 0.9, cost=800.0), candidate("b", 0.6, cost=20.0), candidate("c", 0.75, cost=150.0)]


@pytest.mark.parametrize("candidates", [RICH, BARE, RICH[:1]], ids=["all signals", "no signals", "one candidate"])
@pytest.mark.parametrize("name", ISSUE_NAMES)
def test_every_policy_routes_and_scores_every_candidate(name, candidates):
    choice = build_policy(name).choose(request(1.0), candidates)

    assert isinstance(choice, Choice)
    assert choice.decision == Decision.ROUTE
    assert choice.instance_id in {c.instance_id for c in candidates}
    assert choice.reason
    assert [s.instance_id for s in choice.scores] == [c.instance_id for c in candidates]
    assert [s.utility for s in choice.scores] == pytest.approx([c.utility(5e-4) for c in candidates])


@pytest.mark.parametrize("name", ISSUE_NAMES)
def test_identical_candidates_go_to_the_documented_tie_break(name):
    # Two identical instances: each policy's documented tie-break picks the first (round robin: by instance id).
    twins = [candidate(i, 0.7, cost=50.0, ttft=0.5, prefill_tps_ttft=0.5, running=1, waiting=0, rps=1.0,
                       recent_ttft=(0.5,) * 3, recent_tpot=(0.02,) * 3, pending=100.0) for i in ("b", "a")]

    expected = "a" if name == "round-robin" else "b"

    assert build_policy(name).choose(request(1.0), twins).instance_id == expected


@pytest.mark.parametrize(("name", "params", "says"), [
    ("bear", {"safety": "1.1"}, "parameter 'safety' must be a number, got '1.1'"),
    ("bear", {"safety": True}, "parameter 'safety' must be a number, got True"),
    ("bear", {"explore_idle": "false"}, "parameter 'explore_idle' must be true or false, got 'false'"),
    ("bear", {"explore_idle": None}, "parameter 'explore_idle' must be true or false"),
    ("bear", {"fallback": 3}, "parameter 'fallback' must be a string"),
])
def test_a_parameter_of_the_wrong_type_is_named(name, params, says):
    """The library refuses what BEAR_ROUTER_POLICY_PARAMS refuses: a string "false" would be true, "1.1" no number."""
    with pytest.raises(ValueError, match=re.escape(f"policy {name!r}: {says}")):
        build_policy(name, params)


@pytest.mark.parametrize("name", ISSUE_NAMES)
def test_every_numeric_parameter_of_every_policy_refuses_text(name):
    policy = build_policy(name)
    for field in dataclasses.fields(policy):
        if field.init and isinstance(getattr(policy, field.name), float):
            with pytest.raises(ValueError, match=f"parameter '{field.name}' must be a number"):
                build_policy(name, {field.name: "1"})
