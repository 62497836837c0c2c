"""Argument types the benchmark scripts share. Each refuses a bad value while argparse parses, so a script exits with
status 2 and a message naming the option (`argument --rate: must be a finite number > 0, got 'nan'`) before it starts
anything, instead of a traceback, a hang or a table of nan later. Integer ranges and seeds come from
`bear.cli.arguments`, as the `bear` commands use them.

The scripts import this module as `arguments`: run as `python benchmarks/X.py`, their own folder is first on sys.path.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bear.cli.arguments import int_at_least, non_negative_number, positive_int, positive_number

__all__ = ["folder", "int_at_least", "non_negative_number", "output_file", "positive_int", "positive_int_list",
           "positive_number"]


def positive_int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers >= 1 (`16,64,128`)."""
    return _int_list(text, 1)


def non_negative_int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers >= 0 (`0,8,32`)."""
    return _int_list(text, 0)


def _int_list(text: str, least: int) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= {least}, got {text!r}") from None
    if min(values) < least:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= {least}, got {text!r}")
    return values


def folder(text: str) -> Path:
    """An argparse type: a folder that exists or can be made (the path is not a file, nor under one)."""
    path = Path(text)
    if not text or (path.exists() and not path.is_dir()):
        raise argparse.ArgumentTypeError(f"must name a folder, got {text!r}")
    _require_folder_above(path, text)
    return path


def output_file(text: str) -> Path:
    """An argparse type: a file to write at the end of a run, in a folder that exists now (a run is not lost to a
    missing folder or a typo)."""
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"must name a file, got {text!r}")
    if not path.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"must be in a folder that exists, got {text!r}")
    return path


def _require_folder_above(path: Path, text: str) -> None:
    """The nearest existing folder above `path` must be a folder (mkdir -p fails under a file)."""
    for above in path.absolute().parents:
        if above.exists():
            if not above.is_dir():
                raise argparse.ArgumentTypeError(f"must name a folder, but {str(above)!r} is a file, got {text!r}")
            return
