"""Back-off: the ceiling doubles per failure up to the cap, waits are jittered below it, a success resets."""

from __future__ import annotations

import random

import pytest

from bear.snapshotter.backoff import Backoff


def test_the_ceiling_doubles_up_to_the_cap_and_waits_stay_below_it() -> None:
    backoff = Backoff(base_s=0.1, cap_s=1.0, rng=random.Random(1))
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    for ceiling in ceilings:
        waits = []
        for _ in range(200):
            probe = Backoff(base_s=0.1, cap_s=1.0, rng=backoff.rng, failures=backoff.failures)
            waits.append(probe.failed())
        assert 0 <= min(waits) and max(waits) <= ceiling
        assert max(waits) > 0.8 * ceiling  # full jitter: the whole range is used
        backoff.failed()
    assert backoff.failures == len(ceilings)


def test_a_success_starts_over() -> None:
    backoff = Backoff(base_s=0.1, cap_s=10.0, rng=random.Random(2))
    for _ in range(10):
        backoff.failed()
    backoff.succeeded()
    assert backoff.failures == 0 and backoff.failed() <= 0.1


def test_many_failures_do_not_overflow() -> None:
    backoff = Backoff(base_s=0.1, cap_s=2.0, failures=10_000)
    assert 0 <= backoff.failed() <= 2.0


@pytest.mark.parametrize("base_s, cap_s", [(0.0, 1.0), (2.0, 1.0)])
def test_bad_settings_are_refused(base_s: float, cap_s: float) -> None:
    with pytest.raises(ValueError):
        Backoff(base_s=base_s, cap_s=cap_s)
