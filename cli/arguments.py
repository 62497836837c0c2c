"""Argument types the commands (and the benchmark scripts) share; argparse names the flag in their messages."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from bear.predictor.training import MAX_SEED


def int_in(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: an integer in [minimum, maximum]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be an integer in [{minimum}, {maximum}], got {text!r}")
        return value
    return parse


seed = int_in(0, MAX_SEED)


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value
    return parse


positive_int = int_at_least(1)


def finite_number(text: str) -> float:
    """An argparse type: a finite number (not nan or inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_number(text: str) -> float:
    """An argparse type: a finite number > 0."""
    value = finite_number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def non_negative_number(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    value = finite_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value
