"""How long work reports progress: the caller passes a wrapper (the CLI's draws a bar); domain code only iterates."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
Progress = Callable[[Iterable[T], str, int], Iterable[T]]  # (items, description, total) -> the same items


def no_progress(items: Iterable[T], description: str, total: int) -> Iterable[T]:
    return items
