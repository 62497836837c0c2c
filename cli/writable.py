"""Whether a command can write where it was told to, found before its run (minutes to an hour) rather than after it;
and, when it cannot, the folders the check made removed again: a refused command leaves nothing behind."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path


def make_folder(folder: Path) -> list[Path]:
    """Creates `folder` and its missing parents; returns the folders it made, outermost first (for `remove_made`).
    Raises OSError, having removed what it made, if one cannot be made."""
    missing: list[Path] = []
    current = folder
    while not current.exists() and current.parent != current:  # (a broken link "exists" not: mkdir refuses it)
        missing.append(current)
        current = current.parent
    missing.reverse()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        remove_made(missing)
        raise
    return missing


def remove_made(folders: Sequence[Path]) -> None:
    """Removes the folders `make_folder` made, innermost first, as long as they are empty."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except FileNotFoundError:  # removed already
            continue
        except OSError:  # something was written there since: it stays, and so do the folders above it
            return


def write_problem(folder: Path) -> str | None:
    """Why no file can be written in `folder` (a folder that exists), or None. A file is written and removed to find
    out: permissions alone do not tell (root passes every permission check; a read-only or special file system such
    as /proc refuses all the same)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".bear-probe-"):
            pass
    except OSError as error:
        return str(error.strerror or error)
    return None
