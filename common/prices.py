"""Token prices, USD per million tokens (eq. 4's cost): one bound for every place a price comes in, the predictor's
catalogue, the pools file, a sidecar's settings and so its registration in Redis."""

from __future__ import annotations

MAX_USD_PER_MTOK = 1e6  # above a million USD per million tokens is a typo; up to it, every cost stays finite
PRICE_RANGE = f"a number in [0, {MAX_USD_PER_MTOK:g}] (USD per million tokens)"  # what a refusal says a price must be


def price_ok(value: float) -> bool:
    """A price in [0, MAX_USD_PER_MTOK]: finite, not negative, not NaN."""
    return 0.0 <= value <= MAX_USD_PER_MTOK
