"""The benchmark scripts refuse a bad option value while parsing: exit status 2 and argparse's message naming the
option, before they start anything (before, such values ended in a traceback, a hang or a table of nan later on).

Each script's `parse_args(argv)` is called in this process; one bad value per script also goes through the script
itself (`python benchmarks/X.py ...`), which imports the shared `benchmarks/arguments.py` from its own folder."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from bear.core.case import parse_case
from bear.core.replay import estimate, prepare

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
VLLM_PYTHON = ["--vllm-python", "python"]  # required by snapshot_plugin_bench; never run here

# (script, arguments, the option the message must name); "{file}" is an existing file, "{tmp}" an empty folder.
BAD = [
    *[("route_bench", ["--rate", value], "--rate") for value in ("0", "-5", "nan", "inf", "fast")],
    *[("route_bench", ["--seconds", value], "--seconds") for value in ("0", "-1", "nan", "inf")],
    *[("route_bench", ["--sweep-seconds", value], "--sweep-seconds") for value in ("-1", "nan", "inf")],
    *[("route_bench", ["--p99-limit-ms", value], "--p99-limit-ms") for value in ("0", "-10", "nan", "inf")],
    *[("route_bench", ["--replicas", value], "--replicas") for value in ("0", "-1", "1.5", "many")],
    *[("estimate_bench", ["--residents", value], "--residents") for value in ("0", "8,-1", "2000", "many")],
    *[("estimate_bench", ["--instances", value], "--instances") for value in ("0", "x")],
    *[("estimate_bench", ["--dispatches", value], "--dispatches") for value in ("-1", "0,-8", "x")],
    ("estimate_bench", ["--calls", "0"], "--calls"),
    *[("vllm_route_accuracy", ["--warmup", value], "--warmup") for value in ("0", "-3")],
    *[("vllm_route_accuracy", ["--queries", value], "--queries") for value in ("0", "-1")],
    *[("vllm_route_accuracy", ["--rate", value], "--rate") for value in ("0", "-2", "nan", "inf")],
    *[("vllm_route_accuracy", ["--load", value], "--load") for value in ("0", "-1", "nan", "inf")],
    ("vllm_route_accuracy", ["--seed", "-1"], "--seed"),
    *[("vllm_route_accuracy", ["--num-gpu-blocks", value], "--num-gpu-blocks") for value in ("0", "-1", "1.5")],
    ("vllm_route_accuracy", ["--keep", "{file}"], "--keep"),
    ("vllm_route_accuracy", ["--keep", "{file}/logs"], "--keep"),
    ("vllm_route_accuracy", ["--json", "{tmp}/missing/out.json"], "--json"),
    ("vllm_route_accuracy", ["--json", "{tmp}"], "--json"),
    *[("predictor_bench", ["--train-rows", value], "--train-rows") for value in ("96", "60", "0", "-5")],
    *[("predictor_bench", ["--seed", value], "--seed") for value in ("-1", str(2**31))],
    *[("predictor_bench", ["--prompts-per-task", value], "--prompts-per-task") for value in ("0", "-2")],
    *[("predictor_bench", ["--calls", value], "--calls") for value in ("0", "-3")],
    *[("snapshot_plugin_bench", [*VLLM_PYTHON, "--repeats", value], "--repeats") for value in ("0", "-1")],
    *[("snapshot_plugin_bench", [*VLLM_PYTHON, "--residents", value], "--residents")
      for value in ("0", "-4", "16,0", "abc", "")],
    *[("snapshot_plugin_bench", [*VLLM_PYTHON, "--steps", value], "--steps") for value in ("0", "-10")],
    *[("replay_bench", ["--cases-per-point", value], "--cases-per-point") for value in ("0", "-1")],
    *[("replay_bench", ["--residents", value], "--residents") for value in ("abc", "16,x", "16,0", "1.5")],
    ("replay_bench", ["--budgets", "2048,big"], "--budgets"),
    ("replay_bench", ["--calls", "0"], "--calls"),
    *[("estimator_feed_bench", ["--instances", value], "--instances") for value in ("a", "0", "1,-4", "1.5", "")],
    *[("estimator_feed_bench", ["--seconds", value], "--seconds") for value in ("nan", "inf", "0")],
    *[("estimator_feed_bench", ["--step-ms", value], "--step-ms") for value in ("nan", "inf", "0", "-6")],
    *[("estimator_feed_bench", ["--residents", value], "--residents") for value in ("257", "1000", "-1")],
]


@pytest.fixture(scope="module")
def scripts() -> Iterator[dict[str, ModuleType]]:
    """The benchmark scripts as modules (their folder on sys.path, as when they run)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        yield {name: importlib.import_module(name) for name in {script for script, _, _ in BAD}}


def arguments_in(tmp_path: Path, arguments: list[str]) -> list[str]:
    existing = tmp_path / "a-file"
    existing.write_text("")
    return [a.format(file=existing, tmp=tmp_path) for a in arguments]


@pytest.mark.parametrize(("script", "arguments", "option"), BAD,
                         ids=[f"{s} {' '.join(a)}" for s, a, _ in BAD])
def test_a_bad_value_is_refused_naming_the_option(scripts: dict[str, ModuleType], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str], script: str,
                                                  arguments: list[str], option: str) -> None:
    with pytest.raises(SystemExit) as exited:
        scripts[script].parse_args(arguments_in(tmp_path, arguments))
    assert exited.value.code == 2
    assert f"error: argument {option}: " in capsys.readouterr().err


def test_good_values_are_taken(scripts: dict[str, ModuleType], tmp_path: Path) -> None:
    route = scripts["route_bench"].parse_args(["--rate", "0.5", "--sweep-seconds", "0", "--p99-limit-ms", "2.5"])
    assert (route.rate, route.sweep_seconds, route.p99_limit_ms) == (0.5, 0.0, 2.5)  # 0: no sweep
    assert route.replicas == 1 and scripts["route_bench"].parse_args(["--replicas", "10"]).replicas == 10
    assert [i[0] for i in scripts["route_bench"].instances(2)] == ["small-0", "medium-0", "large-0", "small-1",
                                                                 "medium-1", "large-1"]
    replay = scripts["replay_bench"].parse_args(["--residents", "16,64", "--budgets", "2048"])
    assert (replay.residents, replay.budgets, replay.cases_per_point) == ([16, 64], [2048], 5)
    predictor = scripts["predictor_bench"]
    assert predictor.MIN_TRAIN_ROWS == 97  # 20 rows of each of 3 models and more than 32 distinct prompts
    assert predictor.parse_args(["--train-rows", "97", "--seed", "0"]).train_rows == 97
    feed = scripts["estimator_feed_bench"]
    assert feed.MAX_RESIDENTS == 256  # the published engine's max_num_seqs: 256 < 20,000 blocks // 48 per resident
    parsed = feed.parse_args(["--instances", "2,3", "--residents", "256", "--step-ms", "0.5"])
    assert (parsed.instances, parsed.residents, parsed.step_ms) == ([2, 3], 256, 0.5)
    plugin = scripts["snapshot_plugin_bench"].parse_args([*VLLM_PYTHON, "--residents", "8", "--repeats", "1"])
    assert (plugin.residents, plugin.repeats) == ([8], 1)
    accuracy = scripts["vllm_route_accuracy"].parse_args(["--keep", str(tmp_path / "new" / "logs"), "--json",
                                                          str(tmp_path / "out.json"), "--warmup", "1"])
    assert accuracy.keep == tmp_path / "new" / "logs" and accuracy.warmup == 1


def test_every_script_has_good_defaults(scripts: dict[str, ModuleType]) -> None:
    for name, module in scripts.items():
        module.parse_args(VLLM_PYTHON if name == "snapshot_plugin_bench" else [])


@pytest.mark.parametrize(("script", "arguments", "option"), [
    ("route_bench", ["--fakes", "--rate", "-5", "--seconds", "1", "--sweep-seconds", "0"], "--rate"),
    ("vllm_route_accuracy", ["--warmup", "0"], "--warmup"),
    ("predictor_bench", ["--train-rows", "50"], "--train-rows"),
    ("snapshot_plugin_bench", [*VLLM_PYTHON, "--residents", "-4"], "--residents"),
    ("replay_bench", ["--residents", "abc"], "--residents"),
    ("estimator_feed_bench", ["--residents", "1000"], "--residents"),
    ("estimate_bench", ["--residents", "2000"], "--residents"),
])
def test_the_script_itself_exits_2(script: str, arguments: list[str], option: str) -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{script}.py"), *arguments], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"error: argument {option}: " in done.stderr
    assert done.stdout == ""  # nothing was started


def test_the_estimate_benchmark_times_the_estimator_and_the_replay_on_busy_instances(
        scripts: dict[str, ModuleType]) -> None:
    """The script builds states the replay accepts (a busy engine under async scheduling, requests dispatched since
    its snapshot) and times both paths."""
    estimator_us, replay_us = scripts["estimate_bench"]._measure(2, 16, 4, 5)  # noqa: SLF001 - one point, briefly
    assert estimator_us > 0 and replay_us > 0  # a state the replay refuses, or no replay, stops _measure


def test_the_replay_benchmark_measures_a_case_with_the_compiled_cores_own_call(scripts: dict[str, ModuleType]) -> None:
    """replay_bench calls the compiled core's `replay` bare: a change of its arguments broke `make bench` unseen."""
    text = json.loads((BENCHMARKS.parent / "docs" / "examples" / "case.json").read_text())
    case = parse_case(text)
    expected = estimate(prepare(case.state), case.query, case.coefficients).first_token_batch
    record = {"case": text, "expected": {"first_token_batch": expected}, "vllm_step_us": [75.0], "meta": {}}
    measured = importlib.import_module("replay_bench")._measure(record, 3)
    assert all(value > 0 for key in ("production_us", "core_us", "reference_us") for value in measured[key])
