"""bear.common.log_throttle: the first time a key is bad, then every nth time."""

from __future__ import annotations

from bear.common.log_throttle import LogThrottle


def test_a_log_throttle_says_the_first_time_then_every_nth_and_forgets_a_flood_of_keys() -> None:
    throttle = LogThrottle(every=3, max_keys=2)
    assert [throttle.should_log("a") for _ in range(7)] == [True, False, True, False, False, True, False]
    throttle.ok("a")
    assert throttle.should_log("a") and throttle.count("a") == 1
    assert throttle.should_log("b")
    assert throttle.should_log("c") and throttle.count("a") == 0  # past max_keys: all forgotten
