"""Argument types the commands share (argparse names the flag in their messages)."""

from __future__ import annotations

import argparse
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
