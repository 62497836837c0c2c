"""`bear eval quick` and `bear eval full`: build the setting, run the experiments, write the results to a folder."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bear.evaluation import figures
from bear.evaluation.experiments import (
    BASELINES,
    FULL,
    QUICK,
    EvalPlan,
    RateSweep,
    batch_time_mape,
    saturation_qps,
    sweep_rates,
    ttft_mapes,
)
from bear.evaluation.report import markdown_table
from bear.evaluation.scenario import Scenario, build_scenario
from bear.predictor.progress import Progress, no_progress

Say = Callable[[str], None]


def quick(out: Path, progress: Progress = no_progress, say: Say = lambda _: None) -> dict[str, Any]:
    """A reduced run: OnTimeUtility and SLO attainment of every policy across rates, and estimator errors."""
    return _evaluate(out, QUICK, progress, say, full=False)


def full(out: Path, progress: Progress = no_progress, say: Say = lambda _: None) -> dict[str, Any]:
    """Every experiment (see figures.py), on larger workloads and three seeds."""
    return _evaluate(out, FULL, progress, say, full=True)


def _evaluate(out: Path, plan: EvalPlan, progress: Progress, say: Say, *, full: bool) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    say("building the setting: training the predictor, profiling the instances")
    scenario = build_scenario(plan.scenario, progress)
    say("finding the pool's saturation rate")
    saturation = saturation_qps(scenario, plan, on_instance=lambda i, c: say(f"  {i}: {c:.1f} qps"))
    say(f"saturation: {saturation:.1f} qps; sweeping {len(plan.policies)} policies over "
        f"{len(plan.rate_fractions)} rates")
    runs = [(p, f) for p in plan.policies for f in plan.rate_fractions]
    bar = iter(progress(range(len(runs)), "rate sweep", len(runs)))
    sweep = sweep_rates(scenario, plan, saturation, plan.policies, on_run=lambda *_: next(bar, None))
    oracle_plan = replace(plan, rate_fractions=tuple(f for f in plan.rate_fractions if f <= 1.0))
    oracle = sweep_rates(scenario, oracle_plan, saturation, ["bear"], oracle_lengths=True)
    summary = _summary(scenario, sweep, oracle)
    figures.rate_sweep(out, sweep)
    if full:
        summary["experiments"] = figures.all_figures(out, scenario, plan, sweep, progress, say)
    summary["elapsed_s"] = round(time.monotonic() - started, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(_markdown(summary, scenario))
    return summary


def _summary(scenario: Scenario, sweep: RateSweep, oracle: RateSweep) -> dict[str, Any]:
    def clean(values: list[float]) -> list[float | None]:
        return [None if math.isnan(v) else round(v, 5) for v in values]

    return {
        "synthetic": True,
        "saturation_qps": round(sweep.saturation_qps, 3),
        "arrival_rates": sweep.rates_qps,
        "on_time_utility": {p: clean(sweep.metric(p, "on_time_utility")) for p in sweep.summaries},
        "slo_attainment": {p: clean(sweep.metric(p, "slo_attainment")) for p in sweep.summaries},
        "ttft_mape": {k: None if v is None else round(v, 5) for k, v in ttft_mapes(sweep, oracle).items()},
        "batch_time_mape": round(batch_time_mape(scenario), 5),
        "bear_gain": _gains(sweep),
    }


def _gains(sweep: RateSweep) -> dict[str, Any]:
    """BEAR's OnTimeUtility relative to the best baseline at each rate, and to SCORE and RouteBalance. A ratio over
    a baseline whose OnTimeUtility is not positive (past saturation it can be 0, or below) has no meaning: null, and
    means are taken over the rates that have one (null when none has)."""
    bear = np.array(sweep.metric("bear", "on_time_utility"))
    present = [b for b in BASELINES if b in sweep.summaries]
    best = np.max([sweep.metric(b, "on_time_utility") for b in present], axis=0) if present else bear
    fractions = np.array(sweep.rate_fractions)
    up_to = (fractions >= 0.3 - 1e-9) & np.array([sweep.up_to_saturation(rate) for rate in sweep.rates_qps])
    over_best = _relative(bear, best)
    gain = {"over_best_baseline_per_rate": [None if v is None else round(v, 4) for v in over_best],
            "mean_over_best_baseline_0.3x_to_1x": _mean_known(v for v, keep in zip(over_best, up_to) if keep),
            "never_below_best_baseline": bool(np.all(bear >= best - 1e-9))}
    for name in ("score", "routebalance"):
        if name in sweep.summaries:
            gain[f"mean_over_{name}"] = _mean_known(_relative(bear, np.array(sweep.metric(name, "on_time_utility"))))
    return gain


def _relative(values: np.ndarray, baseline: np.ndarray) -> list[float | None]:
    """values / baseline − 1 where the baseline is positive, else None."""
    return [float(v / b - 1) if b > 0 else None for v, b in zip(values, baseline, strict=True)]


def _mean_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(float(np.mean(known)), 4) if known else None


def _markdown(summary: dict[str, Any], scenario: Scenario) -> str:
    rates = summary["arrival_rates"]
    policies = list(summary["on_time_utility"])
    rows = [[p, *summary["on_time_utility"][p]] for p in policies]
    slo = [[p, *summary["slo_attainment"][p]] for p in policies]
    header = ["policy", *(f"{r:g} qps" for r in rates)]
    profiles = [[i, round(p["service_rate_qps"], 2), round(p["concurrency"], 1), round(p["prefill_tokens_per_s"]),
                 round(p["batch_time_mape"], 4)] for i, p in scenario.profiles.items()]
    return "\n\n".join([
        "# BEAR on a simulated H100 pool (synthetic workload)",
        "Pool: Qwen3-0.6B and Qwen3-8B on one H100 each, Qwen3-32B on two (TP2), vLLM H100 defaults; step times from "
        "the reference H100 model (measured kernel tables), not eq. 12. Queries: a synthetic evaluation table "
        "(bear.predictor.synthetic_corpus) the predictor was not trained on. Figures are from one run of this "
        "program; see summary.json.",
        f"Saturation rate: **{summary['saturation_qps']} qps**. TTFT MAPE (BEAR's routed queries up to saturation): "
        f"{_ttft_mapes_text(summary['ttft_mape'])}. Batch-time MAPE (eq. 12 on profiled steps): "
        f"{_percent(summary['batch_time_mape'])}.",
        f"BEAR vs the baselines (OnTimeUtility): {_gains_text(summary['bear_gain'], rates)}.",
        "## OnTimeUtility (eq. 6)", markdown_table(header, rows),
        "## SLO attainment", markdown_table(header, slo),
        "## Profiled instances",
        markdown_table(["instance", "service rate (qps)", "concurrency", "prefill tokens/s", "eq. 12 MAPE"],
                       profiles),
    ]) + "\n"


def _percent(fraction: float | None, signed: bool = False) -> str:
    """A fraction as a percentage for the Markdown summary; n/a for None (no figure)."""
    if fraction is None:
        return "n/a"
    return f"{100 * fraction:+.1f}%" if signed else f"{100 * fraction:.1f}%"


def _ttft_mapes_text(mapes: dict[str, float | None]) -> str:
    return (f"BEA {_percent(mapes['bea'])} (with oracle output lengths {_percent(mapes['bea-oracle-lengths'])}), "
            f"eq. 8 {_percent(mapes['prefill-tps'])}")


def _gains_text(gain: dict[str, Any], rates: list[float]) -> str:
    per_rate = ", ".join(f"{_percent(v, signed=True)} at {r:g} qps"
                         for v, r in zip(gain["over_best_baseline_per_rate"], rates, strict=True))
    parts = [f"{_percent(gain['mean_over_best_baseline_0.3x_to_1x'], signed=True)} over the best baseline on average "
             f"from 0.3x to 1x saturation ({per_rate})",
             "never below it" if gain["never_below_best_baseline"] else "below it at some rate"]
    parts += [f"{_percent(gain[f'mean_over_{name}'], signed=True)} over {label} on average"
              for name, label in (("score", "SCORE"), ("routebalance", "RouteBalance")) if f"mean_over_{name}" in gain]
    return "; ".join(parts)
