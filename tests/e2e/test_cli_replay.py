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


def test_a_replay_too_long_to_print_gives_its_result_without_the_batches(tmp_path: Path) -> None:
    """1,000 requests filling max_num_seqs, 20,000 tokens each still to write: the query waits ~20,000 steps of 1,000
    requests each, which printed would be gigabytes of memory and hundreds of MB of JSON."""
    running = [{"id": f"r{i}", "num_prompt_tokens": 10, "num_computed_tokens": 10, "num_output_tokens": 1,
                "remaining_output_tokens": 20_000, "num_allocated_blocks": 1} for i in range(1000)]
    case = tmp_path / "case.json"
    engine = {**EXAMPLE["engine"], "max_num_seqs": 1000, "num_gpu_blocks": 2_000_000}
    case.write_text(json.dumps({**EXAMPLE, "engine": engine, "running": running, "waiting": [],
                                "free_blocks": 2_000_000 - 1000}))
    completed = _bear("replay", str(case))
    assert completed.returncode == 0, completed.stderr
    printed = json.loads(completed.stdout)
    assert printed["status"] == "first_token" and printed["first_token_batch"] == printed["num_batches"] > 19_000
    assert printed["batches"] == [] and "more than the 2000000 scheduled entries printed" in printed["batches_omitted"]
    refused = _bear("replay", str(case), "--engine", "reference")
    assert refused.returncode == 2 and "use --engine native" in refused.stderr and "Traceback" not in refused.stderr


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
        (json.dumps(EXAMPLE).replace('"free_blocks": ', '"free_blocks": 5, "free_blocks": ', 1),
         "the key 'free_blocks' is given twice"),  # json keeps the last one silently
        (json.dumps(_with("engine.block_size", 2**30)), "engine.block_size must be at most 65536"),
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
    completed = _bear("replay", str(case), "--repeat", "1" + "0" * 22)  # would loop for a very long time
    assert completed.returncode == 2 and "--repeat" in completed.stderr
    completed = _bear("replay", "")  # an unset shell variable: not the current folder
    assert completed.returncode == 2 and "empty: name the case file" in completed.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (json.dumps(EXAMPLE).replace('"q"', '"q\u00e9"').encode("latin-1"), "is not UTF-8 text (byte 0xe9"),
        (b"[" * 100_000, "nests arrays or objects too deeply"),
        (json.dumps(_with("batch_time.b0", 1)).replace('"b0": 1', '"b0": ' + "9" * 5000).encode(), "digits"),
        (json.dumps(_with("batch_time.b0", int("9" * 400))).encode(), "batch_time.b0: must be a finite number"),
        (json.dumps(_with("engine.watermark", int("9" * 400))).encode(), "engine.watermark: must be a finite number"),
        (json.dumps(_with("horizon_s", int("9" * 400))).encode(), "horizon_s: must be a finite number"),
        (json.dumps(_with("batch_time", {"b0": 1e308, "b1": 1e308, "b2": 1e308, "b3": 1e308})).encode(),
         "batch_time: the coefficients are too large"),
    ],
    ids=["latin-1", "deep", "5000-digits", "huge-b0", "huge-watermark", "huge-horizon", "overflowing-times"],
)
def test_a_case_file_that_breaks_the_reader_exits_2_without_a_traceback(tmp_path: Path, content: bytes,
                                                                          message: str) -> None:
    case = tmp_path / "case.json"
    case.write_bytes(content)
    completed = _bear("replay", str(case))
    assert completed.returncode == 2, completed.stderr
    assert message in completed.stderr and "Traceback" not in completed.stderr
    assert completed.stdout == ""


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`bear replay case.json | head -c 10`: no BrokenPipeError traceback, the status a shell gives SIGPIPE."""
    case = tmp_path / "case.json"
    case.write_text(json.dumps(EXAMPLE))
    process = subprocess.Popen([BEAR, "replay", str(case)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the command writes
    with process.stderr:
        stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141 and "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_the_case_formats_output_example_is_what_replay_prints_for_its_input_example() -> None:
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "replay-case.md").read_text()
    output = text.split("## Output", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    printed = json.loads(_bear("replay", str(root / "docs" / "examples" / "case.json")).stdout)
    assert json.loads(output) == printed
