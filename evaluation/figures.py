"""The paper's figures, reproduced on the simulated pool: each writes `figN.csv` and `figN.png` into the output folder
and returns the numbers it plotted (for summary.json)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bear.core.lps import LpsParameters, lps_ttft_s
from bear.evaluation.experiments import BASELINES, POLICIES, EvalPlan, RateSweep, run_policy, sweep_rates
from bear.evaluation.metrics import mape_of
from bear.evaluation.report import line_plot, scatter_plot, write_csv
from bear.evaluation.scenario import Scenario, serve_alone
from bear.predictor.progress import Progress

STALENESS_MS = (0, 25, 100, 400, 1000)
DELTAS_PER_S = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
FALLBACKS = ("bear:fallback=min-ttft", "bear:fallback=max-utility", "bear:fallback=shed", "bear:safety=1.2")


def rate_sweep(out: Path, sweep: RateSweep) -> None:
    """Fig. 8 (OnTimeUtility vs rate), Fig. 18 (SLO attainment), Fig. 16 (estimator ablation), Fig. 1 (routing mix)."""
    rates = sweep.rates_qps
    for name, metric, label in (("fig8", "on_time_utility", "OnTimeUtility"),
                                ("fig18", "slo_attainment", "TTFT SLO attainment")):
        series = {p: sweep.metric(p, metric) for p in sweep.summaries}
        write_csv(out / f"{name}.csv", ["policy", *rates], [[p, *v] for p, v in series.items()])
        line_plot(out / f"{name}.png", rates, series, xlabel="arrival rate (qps)", ylabel=label,
                  title=f"{label} vs arrival rate", highlight="bear", vline=sweep.saturation_qps)
    ablation = {p: sweep.metric(p, "on_time_utility") for p in ("bear", "bear-prefill-tps") if p in sweep.summaries}
    if len(ablation) == 2:
        write_csv(out / "fig16.csv", ["policy", *rates], [[p, *v] for p, v in ablation.items()])
        line_plot(out / "fig16.png", rates, ablation, xlabel="arrival rate (qps)", ylabel="OnTimeUtility",
                  title="TTFT estimator ablation (same predictors and rule)", highlight="bear",
                  vline=sweep.saturation_qps)
    rows = []
    for policy, summaries in sweep.summaries.items():
        for rate, summary in zip(rates, summaries, strict=True):
            for model, counts in sorted(summary.routes.items()):
                rows.append([policy, rate, model, counts["met"], counts["missed"]])
    write_csv(out / "fig1.csv", ["policy", "rate_qps", "model", "met", "missed"], rows)


def all_figures(out: Path, scenario: Scenario, plan: EvalPlan, sweep: RateSweep, progress: Progress,
                say: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("fig4_5", lambda: estimator_accuracy(out, scenario, sweep)),
        ("fig7", lambda: lps_vs_measured(out, scenario, plan)),
        ("fig9", lambda: delta_sweep(out, scenario, plan, sweep.saturation_qps)),
        ("fig10", lambda: bursty_arrivals(out, scenario, plan, sweep.saturation_qps)),
        ("fig14", lambda: staleness(out, scenario, plan, sweep.saturation_qps)),
        ("fig19", lambda: policy_estimates(out, sweep)),
        ("overload", lambda: overload(out, scenario, plan, sweep)),
    ]
    for name, step in progress(steps, "experiments", len(steps)):
        say(f"experiment {name}")
        results[name] = step()
    return results


def estimator_accuracy(out: Path, scenario: Scenario, sweep: RateSweep) -> dict[str, Any]:
    """Fig. 4: TTFT estimates vs actual (BEA and prefill throughput); Fig. 5: eq. 12 vs actual step times."""
    upto = [(s, r) for s, r in zip(sweep.summaries["bear"], sweep.rates_qps, strict=True) if sweep.up_to_saturation(r)]
    bea = [p for s, _ in upto for p in s.ttft_pairs]
    prefill = [p for s, _ in upto for p in s.prefill_tps_pairs]
    scatter_plot(out / "fig4.png", {f"BEA (MAPE {mape_of(bea):.1%})": [(a, e) for e, a in bea],
                                    f"prefill throughput (MAPE {mape_of(prefill):.1%})": [(a, e) for e, a in prefill]},
                 xlabel="actual TTFT (s)", ylabel="estimated TTFT (s)", title="TTFT estimates, rates up to saturation")
    write_csv(out / "fig4.csv", ["estimator", "estimate_s", "actual_s"],
              [["bea", e, a] for e, a in bea] + [["prefill-tps", e, a] for e, a in prefill])
    steps = {}
    for instance_id, samples in scenario.step_samples.items():
        coefficients = scenario.calibrations[instance_id].coefficients
        pairs = [(duration, coefficients.time_s(features)) for features, duration in samples]
        steps[f"{instance_id} (MAPE {mape_of([(p, a) for a, p in pairs]):.1%})"] = pairs
    scatter_plot(out / "fig5.png", steps, xlabel="actual step time (s)", ylabel="eq. 12 step time (s)",
                 title="Batch time model on profiled steps")
    return {"ttft_mape_bea": mape_of(bea), "ttft_mape_prefill_tps": mape_of(prefill),
            "batch_time_mape": {i: p["batch_time_mape"] for i, p in scenario.profiles.items()}}


def lps_vs_measured(out: Path, scenario: Scenario, plan: EvalPlan) -> dict[str, Any]:
    """Fig. 7: mean TTFT of Qwen3-0.6B alone across arrival rates, measured vs LPS (eq. 13–14) with its profile."""
    spec = scenario.specs[0]
    calibration = scenario.calibrations[spec.instance_id]
    lps = calibration.lps
    rows = []
    for fraction in (0.2, 0.4, 0.6, 0.7, 0.8, 0.9):
        rate = fraction * lps.service_rate_qps
        served = serve_alone(scenario, spec, rate, plan.queries_per_run, seed=int(fraction * 100))
        measured = float(np.mean([r.ttft_s for r in served]))
        prompt = float(np.mean([r.prompt_tokens for r in served]))
        predicted = lps_ttft_s(LpsParameters(rate, lps.service_rate_qps, lps.concurrency, lps.prefill_tokens_per_s),
                               round(prompt))
        rows.append([rate, measured, predicted])
    write_csv(out / "fig7.csv", ["rate_qps", "measured_mean_ttft_s", "lps_mean_ttft_s"], rows)
    line_plot(out / "fig7.png", [r[0] for r in rows], {"measured": [r[1] for r in rows], "LPS": [r[2] for r in rows]},
              xlabel="arrival rate (qps)", ylabel="mean TTFT (s)", title=f"LPS vs measured, {spec.model} alone")
    return {"rows": rows}


def delta_sweep(out: Path, scenario: Scenario, plan: EvalPlan, saturation: float) -> dict[str, Any]:
    """Fig. 9: BEAR's Lagrangian policy (eq. 7) across δ at one rate: mean utility vs mean TTFT; baselines as points."""
    rate = 0.5 * saturation
    rows = []
    for delta in DELTAS_PER_S:
        summary, _ = run_policy(scenario, "bear-lagrangian", rate, plan, plan.seeds[0], delta_per_s=delta)
        rows.append(["bear-lagrangian", delta, summary.mean_utility, summary.mean_ttft_s])
    for policy in BASELINES:
        summary, _ = run_policy(scenario, policy, rate, plan, plan.seeds[0])
        rows.append([policy, "", summary.mean_utility, summary.mean_ttft_s])
    write_csv(out / "fig9.csv", ["policy", "delta_per_s", "mean_utility", "mean_ttft_s"], rows)
    points = {r[0]: [] for r in rows}
    for r in rows:
        points[r[0]].append((r[3], r[2]))
    scatter_plot(out / "fig9.png", points, xlabel="mean TTFT (s)", ylabel="mean utility",
                 title=f"Utility-latency trade-off at {rate:.1f} qps", log=False)
    return {"rate_qps": rate, "rows": rows}


def bursty_arrivals(out: Path, scenario: Scenario, plan: EvalPlan, saturation: float) -> dict[str, Any]:
    """Fig. 10: OnTimeUtility under MMPP-2 arrivals (r = 3 and 6) at several mean rates."""
    results = {}
    bursty = replace(plan, rate_fractions=(0.3, 0.5, 0.7))
    for ratio in (3, 6):
        sweep = sweep_rates(scenario, bursty, saturation, POLICIES, mmpp_ratio=float(ratio))
        series = {p: sweep.metric(p, "on_time_utility") for p in sweep.summaries}
        write_csv(out / f"fig10_r{ratio}.csv", ["policy", *sweep.rates_qps], [[p, *v] for p, v in series.items()])
        line_plot(out / f"fig10_r{ratio}.png", sweep.rates_qps, series, xlabel="mean arrival rate (qps)",
                  ylabel="OnTimeUtility", title=f"MMPP-2 arrivals, r = {ratio}", highlight="bear")
        results[f"r{ratio}"] = {"rates_qps": sweep.rates_qps, "on_time_utility": series}
    return results


def staleness(out: Path, scenario: Scenario, plan: EvalPlan, saturation: float) -> dict[str, Any]:
    """Fig. 14: BEAR's OnTimeUtility when snapshots reach the router late."""
    rate = 0.5 * saturation
    values = [run_policy(scenario, "bear", rate, plan, plan.seeds[0], staleness_s=ms / 1000)[0].on_time_utility
              for ms in STALENESS_MS]
    write_csv(out / "fig14.csv", ["staleness_ms", "on_time_utility"], list(zip(STALENESS_MS, values, strict=True)))
    line_plot(out / "fig14.png", list(STALENESS_MS), {"bear": values}, xlabel="snapshot staleness (ms)",
              ylabel="OnTimeUtility", title=f"Staleness at {rate:.1f} qps", highlight="bear")
    return {"rate_qps": rate, "staleness_ms": list(STALENESS_MS), "on_time_utility": values}


def policy_estimates(out: Path, sweep: RateSweep) -> dict[str, Any]:
    """Fig. 19: each policy's latency estimate for its chosen instance vs the query's actual TTFT (up to saturation)."""
    points: dict[str, list[tuple[float, float]]] = {}
    for (policy, rate), outcomes in sweep.outcomes.items():
        if not sweep.up_to_saturation(rate):
            continue
        points.setdefault(policy, []).extend((o.ttft_s, o.policy_estimate_s) for o in outcomes
                                             if o.ttft_s is not None and o.policy_estimate_s is not None)
    points = {p: v for p, v in points.items() if v}
    scatter_plot(out / "fig19.png", points, xlabel="actual TTFT (s)", ylabel="policy's latency estimate (s)",
                 title="Latency estimates of the policies")
    write_csv(out / "fig19.csv", ["policy", "actual_ttft_s", "estimate_s"],
              [[p, a, e] for p, v in points.items() for a, e in v])
    return {p: mape_of([(e, a) for a, e in v]) for p, v in points.items()}


def overload(out: Path, scenario: Scenario, plan: EvalPlan, sweep: RateSweep) -> dict[str, Any]:
    """Graceful overload: BEAR's fallback rules against the baselines from saturation to 1.5x."""
    heavy = replace(plan, rate_fractions=tuple(f for f in plan.rate_fractions if f >= 1.0))
    variants = sweep_rates(scenario, heavy, sweep.saturation_qps, FALLBACKS)
    rows, series = [], {}
    for policy in (*FALLBACKS, *BASELINES):
        source = variants if policy in variants.summaries else sweep
        values = [s.on_time_utility for s, r in zip(source.summaries[policy], source.rates_qps, strict=True)
                  if source.from_saturation(r)]
        series[policy] = values
        rows.append([policy, *values])
    rates = [r for r in sweep.rates_qps if sweep.from_saturation(r)]
    write_csv(out / "overload.csv", ["policy", *rates], rows)
    line_plot(out / "overload.png", rates, series, xlabel="arrival rate (qps)", ylabel="OnTimeUtility",
              title="Past saturation: BEAR's fallback rules vs baselines")
    return {"rates_qps": rates, "on_time_utility": series}
