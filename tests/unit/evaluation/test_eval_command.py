"""`bear eval --out`: a folder the results cannot be written into is refused before the run (minutes to an hour),
not after it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

BEAR = shutil.which("bear") or str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "bear")


@pytest.mark.parametrize(("out", "says"), [
    ("", "empty: name the output folder"),
    ("   ", "empty: name the output folder"),
    ("/etc/hostname", "exists and is not a folder"),
    ("/etc/hostname/results", "cannot write there: Not a directory"),
    ("/proc/results", "cannot write there"),
])
def test_an_output_folder_it_cannot_write_is_refused_at_once(out: str, says: str) -> None:
    done = subprocess.run([BEAR, "eval", "quick", "--out", out], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "building the setting" not in done.stderr  # nothing ran


def test_a_missing_folder_is_created_and_left_empty(tmp_path: Path) -> None:
    from bear.cli.eval_command import _out_problem

    out = tmp_path / "a" / "b"
    made: list[Path] = []
    assert _out_problem(str(out), False, made) is None
    assert out.is_dir() and list(out.iterdir()) == []
    assert made == [tmp_path / "a", out]  # removed should the run fail


def test_a_folder_where_a_result_file_goes_is_refused_at_once(tmp_path: Path) -> None:
    # QA: a folder named summary.json made the run fail after its 85 s, naming no file
    (tmp_path / "summary.json").mkdir()
    (tmp_path / "notes").mkdir()  # other folders are the user's own
    done = subprocess.run([BEAR, "eval", "quick", "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "summary.json in it is a folder" in done.stderr, done.stderr
    assert "building the setting" not in done.stderr


def test_a_link_to_a_folder_where_a_result_file_goes_is_refused_too(tmp_path: Path) -> None:
    """(QA: summary.json -> a folder passed the check, and the run failed writing its results at the end.)"""
    from bear.cli.eval_command import _out_problem

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "summary.json").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "fig5.csv").symlink_to(tmp_path / "absent.csv")  # a dangling link is written through: fine
    assert _out_problem(str(tmp_path), True, []) == (
        "summary.json in it is a folder, where a result file is written: remove or rename it")


def test_a_folder_holding_an_earlier_runs_results_is_refused_unless_forced(tmp_path: Path) -> None:
    """(QA: a second run wrote over the first one's results without a word.)"""
    from bear.cli.eval_command import _out_problem

    (tmp_path / "summary.json").write_text('{"saturation_qps": 35}\n')
    done = subprocess.run([BEAR, "eval", "quick", "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"bear eval: --out {str(tmp_path)!r}: holds the results of an earlier run (summary.json): "
                           "pass --force to write over them, or name another folder\n")
    assert (tmp_path / "summary.json").read_text() == '{"saturation_qps": 35}\n'
    assert _out_problem(str(tmp_path), True, []) is None  # --force
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
