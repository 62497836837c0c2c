"""`bear replay --repeat`: the production path's mean time, within its budget however long one run takes."""

from __future__ import annotations

import time

import pytest

from bear.cli import replay_command
from bear.core.case import parse_case
from tests.unit.test_case import EXAMPLE


@pytest.mark.parametrize("run_s, most_runs", [(0.0, 1000), (0.01, 6)])
def test_repeats_stop_at_the_budget(monkeypatch: pytest.MonkeyPatch, run_s: float, most_runs: int) -> None:
    """(QA: with runs of ~25 s each, the clock was read every 64th run only: --repeat 64 would take half an hour.)"""
    def slow_estimate(*args: object, **options: object) -> None:
        time.sleep(run_s)

    monkeypatch.setattr(replay_command, "estimate", slow_estimate)
    monkeypatch.setattr(replay_command, "REPEAT_BUDGET_S", 0.05)
    _, runs = replay_command._mean_estimate_us(parse_case(EXAMPLE), 1000)
    assert 1 <= runs <= most_runs


def test_a_replay_out_of_memory_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path,  # noqa: ANN001
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """(QA: a case of 200,000 residents under a 4 GiB limit ended in the compiled core's std::bad_alloc traceback.)"""
    import json

    from bear.cli import main as cli_main

    def out_of_memory(*args: object, **options: object) -> None:
        raise MemoryError("std::bad_alloc")

    monkeypatch.setattr(replay_command, "replay", out_of_memory)
    path = tmp_path / "case.json"
    path.write_text(json.dumps(EXAMPLE))
    assert cli_main.main(["replay", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"bear replay: {path}: the replay needs more memory than this machine has"
