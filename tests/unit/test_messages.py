"""How messages quote what a caller sent, and how log lines name another library's exceptions."""

from __future__ import annotations

import redis

from bear.common.messages import described, shown


def test_a_long_text_is_quoted_by_its_beginning_and_its_length() -> None:
    assert shown("short") == "'short'"
    assert shown("p" * 100, limit=4) == "'pppp'… (100 characters)"


def test_an_exception_is_named_with_its_message() -> None:
    # (QA: redis-py 8's repr is the type alone, so "DB index is out of range" never reached the estimator's log.)
    error = redis.exceptions.ResponseError("DB index is out of range")
    assert described(error) == "ResponseError: DB index is out of range"
    assert described(TimeoutError()) == "TimeoutError"
