"""`bear demo`: the whole system on this machine, from the command line, as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

BEAR = shutil.which("bear") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "bear")
POLICIES = ("bear", "score", "routebalance")


def _run(args: list[str], tmp_path: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ, BEAR_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run([BEAR, "demo", *args], capture_output=True, text=True, timeout=timeout_s, env=environ)


def test_demo_routes_a_workload_with_three_policies(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    completed = _run(["--duration", "30", "--rate", "12", "--json", str(out), "--run-folder", str(tmp_path / "run")],
                     tmp_path, timeout_s=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(out.read_text())
    assert tuple(report["policies"]) == POLICIES
    for name, figures in report["policies"].items():
        assert figures["errors"] == 0, name
        assert figures["queries"] >= 20 and 0 < figures["routes"] <= figures["queries"], name
        assert 0 <= figures["slo_attainment"] <= 1 and figures["on_time_utility"] > 0, name
        assert 0 < figures["route_p50_ms"] <= figures["route_p99_ms"] < 2000, name
        assert sum(figures["mix"].values()) == figures["routes"], name
    bear = report["policies"]["bear"]
    assert bear["ttft_mape"] is not None and bear["ttft_mape"] < 0.5  # BEAR's estimates were used, and were close
    for name in POLICIES:  # the printed table names every policy
        assert name in completed.stdout
    for service in ("router", "estimator", "predictor"):  # their logs are kept in the run folder
        assert (tmp_path / "run" / f"{service}.log").stat().st_size > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--duration", "5"], "--duration"),
    (["--rate", "-1"], "--rate"),
    (["--rate", "nan"], "--rate"),
    (["--policies", "bear,no-such-policy"], "no-such-policy"),
    (["--policies", "bear,bear"], "policies"),
])
def test_demo_rejects_bad_input_naming_it(tmp_path: Path, args: list[str], message: str) -> None:
    completed = _run(args, tmp_path, timeout_s=120)
    assert completed.returncode == 2
    assert message in completed.stderr
