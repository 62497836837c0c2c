"""The evaluation summary's gains: ratios over a baseline whose OnTimeUtility is not positive are null, never
Infinity or NaN (summary.json must stay JSON)."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from bear.evaluation.experiments import QUICK, RateSweep, parse_policy
from bear.evaluation.runs import _gains, _gains_text, _ttft_mapes_text
from bear.routing.contract import Decision


def _sweep(utilities: dict[str, list[float]], saturation: float = 10.0,
           fractions: tuple[float, ...] = (0.5, 1.0, 5.0)) -> RateSweep:
    summaries = {p: [SimpleNamespace(on_time_utility=u) for u in values] for p, values in utilities.items()}
    rates = [round(f * saturation, 3) for f in fractions]  # as sweep_rates rounds them
    return RateSweep(saturation, rates, summaries, {}, list(fractions))  # type: ignore[arg-type]


@pytest.mark.parametrize("saturation", [31.1716, 31.1714, 10.0])  # 1.0x rounded up, down, exact
def test_the_saturation_rate_counts_up_to_saturation_however_its_rate_is_rounded(saturation: float) -> None:
    # QA: 1.0x at 31.172 qps (saturation 31.1716) was left out of the mean up to saturation, and kept from the
    # overload study when it rounded down
    sweep = _sweep({"bear": [0.6, 1.0], "score": [0.5, 0.5]}, saturation, (0.5, 1.0))
    assert _gains(sweep)["mean_over_best_baseline_0.3x_to_1x"] == round((0.2 + 1.0) / 2, 4)
    assert [sweep.up_to_saturation(r) for r in sweep.rates_qps] == [True, True]
    assert [sweep.from_saturation(r) for r in sweep.rates_qps] == [False, True]


def test_gains_over_a_baseline_at_zero_or_below_are_null_and_the_summary_stays_json() -> None:
    gains = _gains(_sweep({"bear": [0.6, 0.5, 0.1], "score": [0.5, 0.4, 0.0], "routebalance": [0.4, -0.01, -0.02]}))
    json.loads(json.dumps(gains, allow_nan=False))
    assert gains["over_best_baseline_per_rate"] == [0.2, 0.25, None]
    assert gains["mean_over_best_baseline_0.3x_to_1x"] == 0.225  # 5 and 10 qps (0.5x, 1x); 50 is past 1x
    assert gains["mean_over_score"] == round((0.2 + 0.25) / 2, 4)
    assert gains["mean_over_routebalance"] == 0.5  # only the rate where it was positive
    assert gains["never_below_best_baseline"]


def test_a_summary_of_no_routed_query_is_json_and_a_warmup_must_leave_queries() -> None:
    from bear.evaluation.metrics import summarise

    with pytest.raises(ValueError, match="warmup must be in"):
        summarise("bear", 5.0, [], warmup=0)
    with pytest.raises(ValueError, match="warmup_queries must be in"):
        replace(QUICK, warmup_queries=QUICK.queries_per_run)
    shed = SimpleNamespace(decision=Decision.SHED, ttft_s=None, on_time_utility=0.0, on_time=False, utility=0.0)
    summary = summarise("bear", 5.0, [shed])  # type: ignore[list-item]
    text = json.dumps(summary.to_json(), allow_nan=False)  # mean TTFT and utility over no routed query: null
    assert json.loads(text)["mean_ttft_s"] is None and json.loads(text)["shed_fraction"] == 1.0


def test_a_policy_spec_parses_numbers_and_bad_values_are_named() -> None:
    policy = parse_policy("bear:safety=2,shed_ratio=1.5e0,fallback=shed")
    assert (policy.safety, policy.shed_ratio, policy.fallback) == (2, 1.5, "shed")
    with pytest.raises(ValueError, match="safety must be a positive number, got inf"):  # a number, for the policy
        parse_policy("bear:safety=inf")
    with pytest.raises(ValueError, match="policy 'bear': parameter 'safety' must be a number, got 'abc'"):
        parse_policy("bear:safety=abc")
    assert parse_policy("bear:explore_idle=false").explore_idle is False
    with pytest.raises(ValueError, match="has no parameter 'speed'"):
        parse_policy("bear:speed=1")



def test_the_markdown_summary_says_the_gains_and_errors_in_words_not_python_dicts() -> None:
    gains = _gains(_sweep({"bear": [0.6, 0.5, 0.1], "score": [0.5, 0.4, 0.0], "routebalance": [0.4, -0.01, -0.02]}))
    text = _gains_text(gains, [5.0, 10.0, 50.0])
    assert text.startswith("+22.5% over the best baseline on average from 0.3x to 1x saturation (+20.0% at 5 qps, "
                           "+25.0% at 10 qps, n/a at 50 qps); never below it; +22.5% over SCORE on average; "
                           "+50.0% over RouteBalance on average")
    assert _ttft_mapes_text({"bea": 0.0634, "bea-oracle-lengths": None, "prefill-tps": 0.66}) == \
        "BEA 6.3% (with oracle output lengths n/a), eq. 8 66.0%"
    assert "{" not in text and "True" not in text
