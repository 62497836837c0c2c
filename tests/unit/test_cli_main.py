"""`bear`'s entry point: what it makes of errors no command caught."""

from __future__ import annotations

import argparse
import errno

import pytest

from bear.cli import main as cli_main
from bear.cli import replay_command


def _failing(error: BaseException):  # noqa: ANN202 - a handler
    def handler(args: argparse.Namespace) -> int:
        raise error
    return handler


def test_a_path_too_long_for_the_file_system_is_bad_input_not_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """(QA: `bear eval --out <300 characters>` and others ended in a traceback from a file-system call.)"""
    long_name = "a" * 300
    monkeypatch.setattr(replay_command, "run", _failing(OSError(errno.ENAMETOOLONG, "File name too long", long_name)))
    assert cli_main.main(["replay", "case.json"]) == 2
    assert f"bear replay: '{long_name}': File name too long" in capsys.readouterr().err


def test_other_os_errors_are_not_taken_for_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_command, "run", _failing(OSError(errno.EIO, "Input/output error")))
    with pytest.raises(OSError, match="Input/output error"):
        cli_main.main(["replay", "case.json"])
