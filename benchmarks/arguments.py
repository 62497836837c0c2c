"""Argument types the benchmark scripts share. Each refuses a bad value while argparse parses, so a script exits with
status 2 and a message naming the option (`argument --rate: must be a finite number > 0, got 'nan'`) before it starts
anything, instead of a traceback, a hang or a table of nan later. Integer ranges and seeds come from
`bear.cli.arguments`, as the `bear` commands use them.

The scripts import this module as `arguments`: run as `python benchmarks/X.py`, their own folder is first on sys.path.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum."""
    def parse(text: str) -> int:
        value = _integer(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value
    return parse


positive_int = int_at_least(1)


def positive_int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers >= 1 (`16,64,128`)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1, got {text!r}")
    return values


def positive_finite_float(text: str) -> float:
    """An argparse type: a finite number > 0 (not 0, a negative number, nan or inf)."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def non_negative_finite_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


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


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value
