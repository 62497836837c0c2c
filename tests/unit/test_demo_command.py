"""`bear demo`'s checks of its input, made before anything starts: a folder or file it could not write, or a Redis URL
it could not use, is refused with exit status 2 and a message naming the flag, and the refused run leaves nothing
behind. (Checks that start the system: tests/e2e/test_demo.py.)"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import pytest

from bear.cli.main import main
from bear.demo import runner

UNWRITABLE_FILE = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")  # read-only to root too


@pytest.fixture(autouse=True)
def _no_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache folder of the test's own, and no demo run: a test that reached it would start the system."""
    monkeypatch.setenv("BEAR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)

    def started(config: runner.DemoConfig) -> dict[str, object]:
        raise AssertionError("the demo started")

    monkeypatch.setattr(runner, "run_demo", started)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The message of a `bear demo` refused with exit status 2 (by argparse or by the command)."""
    try:
        code = main(["demo", *argv])
    except SystemExit as exited:
        code = exited.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "Error:" not in err  # no exception's class name
    return err


def test_a_run_folder_no_file_can_be_written_in_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """(QA: `--run-folder /proc` passed the permission check, root's, and ended in a traceback: FileNotFoundError
    '/proc/.bear-demo.lock'.)"""
    err = _refused(["--run-folder", "/proc"], capsys)
    assert err.startswith("bear demo: --run-folder /proc: cannot write in the folder /proc")


def test_a_cache_folder_no_file_can_be_written_in_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """(QA: `BEAR_CACHE_DIR=/proc bear demo` failed with a traceback after ~10 s of training, and left its temporary
    run folder and lock behind.)"""
    monkeypatch.setenv("BEAR_CACHE_DIR", "/proc")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    err = _refused(["--json", "out/demo.json"], capsys)
    assert err.startswith("bear demo: BEAR_CACHE_DIR /proc: cannot write in the folder /proc")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"] and not list((tmp_path / "tmp").iterdir())


def test_a_json_file_that_could_not_be_written_is_refused_before_the_run(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """(QA: `--json /proc/x.json` ran the whole demo, to fail at its end, the figures lost.)"""
    err = _refused(["--json", "/proc/x.json"], capsys)
    assert err.startswith("bear demo: --json /proc/x.json: cannot write in the folder /proc")
    err = _refused(["--json", "/proc/new/x.json"], capsys)
    assert err.startswith("bear demo: --json /proc/new/x.json: cannot create the folder /proc/new")
    assert not (tmp_path / "cache").exists()  # checked before the cache folder was made


@pytest.mark.skipif(not UNWRITABLE_FILE.is_file(), reason="no sysfs")
def test_an_existing_json_file_that_cannot_be_opened_to_write_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["--json", str(UNWRITABLE_FILE)], capsys)
    assert err.startswith(f"bear demo: --json {UNWRITABLE_FILE}: ")


def test_the_checks_leave_an_existing_json_file_and_its_folder_as_they_were(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from bear.cli import demo_command

    (tmp_path / "out").mkdir()
    earlier = tmp_path / "out" / "demo.json"
    earlier.write_text("{}\n")
    made: list[Path] = []
    assert demo_command._json_problem(earlier, made) is None
    assert demo_command._json_problem(tmp_path / "out" / "new.json", made) is None
    assert made == [] and [p.name for p in (tmp_path / "out").iterdir()] == ["demo.json"]
    assert earlier.read_text() == "{}\n"


def test_a_json_file_in_new_folders_leaves_no_folder_when_another_check_refuses_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("BEAR_CACHE_DIR", str(tmp_path / "a-file"))
    err = _refused(["--json", "jdir/sub/out.json", "--run-folder", "rdir/run"], capsys)
    assert "BEAR_CACHE_DIR" in err and "exists and is not a folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # (the run folder and jdir/sub are made first)


@pytest.mark.parametrize(("url", "says"), [
    ("http://x", "argument --redis-url: must start with redis://, rediss:// or unix://, got 'http://x'"),
    (" ", "argument --redis-url: is empty"),
    ("", "argument --redis-url: is empty"),
    ("redis://h:6379/x", "argument --redis-url: "),
])
def test_a_redis_url_the_client_could_not_use_is_refused_before_any_folder_is_made(
        url: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(QA: `--redis-url http://x --json jdir/sub/out.json` left jdir/sub/ behind, and said `--redis-url http://x:
    ValueError: BEAR_REDIS_URL (--redis-url): must start with…`.)"""
    err = _refused(["--redis-url", url, "--json", "jdir/sub/out.json", "--run-folder", "run"], capsys)
    assert says in err and "BEAR_REDIS_URL" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_fails_writing_a_file_exits_2_naming_it_and_leaves_no_folder_it_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder found writable up front that cannot be written after all (filled up, its permissions changed):
    said, not a traceback."""
    def fails(config: runner.DemoConfig) -> dict[str, object]:
        assert config.run_folder is not None
        (config.run_folder / runner.LOCK_FILE).touch()  # as the run takes the folder's lock
        raise OSError(28, "No space left on device", str(tmp_path / "cache" / "model.txt"))

    monkeypatch.setattr(runner, "run_demo", fails)
    err = _refused(["--json", "jdir/sub/out.json", "--run-folder", "rdir/run"], capsys)
    assert err == f"bear demo: {tmp_path / 'cache' / 'model.txt'}: No space left on device\n"
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_fails_in_its_temporary_run_folder_leaves_neither_the_folder_nor_its_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(QA: a run that failed while training the predictor left /tmp/bear-demo-XXXX/.bear-demo.lock behind.)"""
    def fails(seed: int) -> Path:
        raise OSError(2, "No such file or directory", "/proc/demo-predictor")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(runner, "predictor_artifact", fails)
    with pytest.raises(OSError, match="No such file or directory"):
        runner._run(runner.DemoConfig(), None, None, io.StringIO(), io.StringIO())  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_temporary_run_folder_with_logs_is_kept(tmp_path: Path) -> None:
    (tmp_path / runner.LOCK_FILE).touch()
    (tmp_path / "router.log").write_text("…")
    runner.remove_unused_run_folder(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [runner.LOCK_FILE, "router.log"]
