"""The CLI's folder checks (`bear.cli.writable`) and the demo's removal of a run folder it made: what a refused or
failed run removes is only what it made, never a folder the user had, nor a folder another demo holds."""

from __future__ import annotations

import fcntl
from pathlib import Path

from bear.cli.writable import make_folder, remove_made
from bear.demo.runner import LOCK_FILE, remove_unused_run_folder


def test_a_path_through_dotdot_counts_only_the_folders_made(tmp_path: Path) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()  # the user's, empty
    made = make_folder(tmp_path / "new" / ".." / "existing" / "sub")
    assert made == [tmp_path / "new", tmp_path / "new" / ".." / "existing" / "sub"]
    remove_made(made)
    assert existing.is_dir() and not (existing / "sub").exists() and not (tmp_path / "new").exists()


def test_a_folder_written_in_stays_and_the_others_made_are_removed(tmp_path: Path) -> None:
    made = make_folder(tmp_path / "json" / "out") + make_folder(tmp_path / "cache")
    (tmp_path / "cache" / "predictor.bin").write_bytes(b"x")  # the run wrote there before it failed
    remove_made(made)
    assert not (tmp_path / "json").exists() and (tmp_path / "cache" / "predictor.bin").exists()


def test_a_folder_made_by_another_meanwhile_is_not_counted(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    assert make_folder(tmp_path / "a" / "b") == [tmp_path / "a" / "b"]
    assert make_folder(tmp_path / "a" / "b") == []


def test_a_run_folder_whose_lock_another_demo_holds_stays(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    with open(folder / LOCK_FILE, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another demo, about to write there
        remove_unused_run_folder(folder)
        assert (folder / LOCK_FILE).exists()
    remove_unused_run_folder(folder)  # nobody holds it now
    assert not folder.exists()
