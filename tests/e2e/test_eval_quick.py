"""`bear eval quick`: the reduced evaluation runs end to end and writes its summary."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

BEAR = shutil.which("bear") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "bear")


def test_eval_quick_writes_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    completed = subprocess.run([BEAR, "eval", "quick", "--out", str(out)], capture_output=True, text=True,
                               timeout=900)
    assert completed.returncode == 0, completed.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["synthetic"] is True
    rates = summary["arrival_rates"]
    saturation = summary["saturation_qps"]
    assert rates[0] <= 0.2 * saturation * 1.001 and rates[-1] >= 1.5 * saturation * 0.999
    policies = {"bear", "latency-agnostic", "round-robin", "shortest-queue", "lmdeploy", "score", "routebalance",
                "vllm-sr", "bear-prefill-tps"}
    assert set(summary["on_time_utility"]) == policies and set(summary["slo_attainment"]) == policies
    assert all(len(v) == len(rates) for v in summary["on_time_utility"].values())
    mape = summary["ttft_mape"]
    assert 0 < mape["bea"] < mape["prefill-tps"] and mape["bea-oracle-lengths"] is not None
    assert 0 < summary["batch_time_mape"] < 0.1
    for name in ("fig8.png", "fig8.csv", "fig18.png", "fig16.png", "fig1.csv", "summary.md"):
        assert (out / name).stat().st_size > 0
