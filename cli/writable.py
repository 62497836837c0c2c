"""Whether a command can write where it was told to, found before its run (minutes to an hour) rather than after it;
and, when it cannot, the folders the check made removed again: a refused command leaves nothing behind."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path


def make_folder(folder: Path) -> list[Path]:
    """Creates `folder` and its missing parents, one at a time; returns the folders it made, outermost first (for
    `remove_made`): those its own mkdir created, and no other (a path through `..`, or another process making one
    meanwhile, cannot make it count a folder that was there). Raises OSError, having removed what it made, if one
    cannot be made."""
    made: list[Path] = []
    for current in [*reversed(folder.parents), folder]:
        try:
            current.mkdir()
        except FileExistsError:
            continue  # there already (a file in the way fails at the next level, or at the caller's check)
        except OSError:
            remove_made(made)
            raise
        made.append(current)
    return made


def remove_made(folders: Sequence[Path]) -> None:
    """Removes the folders `make_folder` made, innermost first, those still empty (one that is not keeps its parents:
    they are not empty either)."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:  # removed already, or something was written there since: it stays
            continue


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
