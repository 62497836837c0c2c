"""The replay against the real vLLM scheduler: same batches, same first-token batch, on random workloads.

`vllm_driver.py` (run with the vLLM virtualenv's Python, given by BEAR_VLLM_PYTHON) drives vLLM 0.32's own Scheduler
and AsyncScheduler with a fake model runner, snapshots them at random steps, adds a query and records every batch up to
the query's first token. `make test` sets BEAR_VLLM_PYTHON; without it these tests are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bear.core.case import parse_case
from bear.core.replay import ReplayEngine, replay

pytestmark = pytest.mark.conformance

DRIVER = Path(__file__).with_name("vllm_driver.py")
NUM_CASES = int(os.environ.get("BEAR_CONFORMANCE_CASES", "400"))
SEED = int(os.environ.get("BEAR_CONFORMANCE_SEED", "1"))


@pytest.fixture(scope="module")
def vllm_cases(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    python = os.environ.get("BEAR_VLLM_PYTHON")
    if not python:
        pytest.skip("BEAR_VLLM_PYTHON is not set (make test sets it to the vLLM virtualenv's python)")
    if not Path(python).exists():
        pytest.fail(f"BEAR_VLLM_PYTHON={python} does not exist: run `make setup`")
    out = tmp_path_factory.mktemp("conformance") / "cases.jsonl"
    subprocess.run(
        [python, str(DRIVER), "--cases", str(NUM_CASES), "--seed", str(SEED), "--mode", "mixed", "--no-timing",
         "--out", str(out)],
        check=True, timeout=1800,
    )
    return [json.loads(line) for line in out.read_text().splitlines()]


def _mismatch(record: dict[str, Any], engine: ReplayEngine) -> str | None:
    case = parse_case(record["case"])
    result = replay(case.state, case.query, case.coefficients, record_batches=True, engine=engine)
    got = [dict(batch.scheduled) for batch in result.batches]
    expected = [batch["scheduled"] for batch in record["expected"]["batches"]]
    if got == expected and result.first_token_batch == record["expected"]["first_token_batch"]:
        return None
    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    return (f"case {record['meta'].get('index')} ({record['meta']['mode']}): first difference at batch {first + 1}: "
            f"replay {got[first] if first < len(got) else None} vs vLLM {expected[first] if first < len(expected) else None}; "
            f"first-token batch {result.first_token_batch} vs {record['expected']['first_token_batch']}")


@pytest.mark.parametrize("engine", list(ReplayEngine), ids=lambda e: e.value)
def test_replay_reproduces_vllm_batch_for_batch(vllm_cases: list[dict[str, Any]], engine: ReplayEngine) -> None:
    mismatches = [m for m in (_mismatch(record, engine) for record in vllm_cases) if m]
    matched = len(vllm_cases) - len(mismatches)
    print(f"\n{engine.value}: {matched}/{len(vllm_cases)} cases identical to vLLM ({100 * matched / len(vllm_cases):.1f}%)")
    assert not mismatches, "\n".join(mismatches[:10])


def test_the_cases_exercise_every_rule(vllm_cases: list[dict[str, Any]]) -> None:
    engines = [record["case"]["engine"] for record in vllm_cases]
    coverage = Counter(
        async_scheduling=sum(e["async_scheduling"] for e in engines),
        chunked_prefill_off=sum(not e["enable_chunked_prefill"] for e in engines),
        threshold=sum(e["long_prefill_token_threshold"] > 0 for e in engines),
        watermark=sum(e["watermark"] > 0 for e in engines),
        block_size_128=sum(e["block_size"] == 128 for e in engines),
        preemptions=sum(record["meta"]["num_preemptions_during"] > 0 for record in vllm_cases),
        long_waits=sum(record["expected"]["first_token_batch"] > 100 for record in vllm_cases),
    )
    assert all(count >= len(vllm_cases) // 20 for count in coverage.values()), coverage


def test_cli_prints_vllm_batches(vllm_cases: list[dict[str, Any]], tmp_path: Path) -> None:
    for record in vllm_cases[:5]:
        path = tmp_path / "case.json"
        path.write_text(json.dumps(record["case"]))
        completed = subprocess.run([sys.executable, "-m", "bear.cli.main", "replay", str(path)],
                                   capture_output=True, text=True, check=True)
        printed = json.loads(completed.stdout)
        assert printed["first_token_batch"] == record["expected"]["first_token_batch"]
        assert [b["scheduled"] for b in printed["batches"]] == [b["scheduled"] for b in record["expected"]["batches"]]
