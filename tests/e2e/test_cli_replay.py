"""`bear replay` as a user runs it: one JSON object out, exit status 2 with a message naming the field on bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.test_case import EXAMPLE, _with

BEAR = shutil.which("bear") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "bear")


def _bear(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BEAR, *args], capture_output=True, text=True, timeout=60)


def test_replay_prints_one_json_object(tmp_path: Path) -> None:
    case = tmp_path / "case.json"
    case.write_text(json.dumps(EXAMPLE))
    completed = _bear("replay", str(case))
    assert completed.returncode == 0, completed.stderr
    printed = json.loads(completed.stdout)
    assert printed["first_token_batch"] == 1 and printed["feasible"] is True
    assert printed["batches"] == [{"scheduled": {"a": 1, "b": 300, "q": 700}, "time_s": printed["ttft_s"]}]
    assert "mean_estimate_us" not in printed


def test_repeat_adds_the_mean_production_estimate_time(tmp_path: Path) -> None:
    case = tmp_path / "case.json"
    case.write_text(json.dumps(EXAMPLE))
    printed = json.loads(_bear("replay", str(case), "--repeat", "200").stdout)
    assert 0 < printed["mean_estimate_us"] < 10_000
    reference = json.loads(_bear("replay", str(case), "--engine", "reference").stdout)
    assert reference["batches"] == printed["batches"] and reference["ttft_s"] == printed["ttft_s"]


def test_an_infeasible_query_is_reported_not_failed(tmp_path: Path) -> None:
    case = tmp_path / "case.json"
    case.write_text(json.dumps(_with("query.num_prompt_tokens", 40000)))
    printed = json.loads(_bear("replay", str(case)).stdout)
    assert printed["status"] == "infeasible" and printed["feasible"] is False
    assert printed["first_token_batch"] is None and "max_model_len" in printed["reason"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (json.dumps(_with("engine.max_num_batched_tokens", 0)), "engine.max_num_batched_tokens"),
        (json.dumps(_with("running.0.num_computed_tokens", 950)), "running[0].num_computed_tokens"),
        (json.dumps(_with("waiting.0.remaining_output_tokens", -3)), "waiting[0].remaining_output_tokens"),
        (json.dumps(_with("query.surprise", 1)), "query.surprise: unknown key"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_input_exits_2_naming_the_field(tmp_path: Path, content: str, message: str) -> None:
    case = tmp_path / "case.json"
    case.write_text(content)
    completed = _bear("replay", str(case))
    assert completed.returncode == 2
    assert message in completed.stderr and completed.stdout == ""


def test_missing_file_and_bad_repeat_exit_2(tmp_path: Path) -> None:
    assert _bear("replay", str(tmp_path / "absent.json")).returncode == 2
    case = tmp_path / "case.json"
    case.write_text(json.dumps(EXAMPLE))
    completed = _bear("replay", str(case), "--repeat", "0")
    assert completed.returncode == 2 and "--repeat" in completed.stderr
