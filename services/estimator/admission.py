"""What the estimator's feed takes in from Redis, and what it refuses before doing any work on it.

- **Snapshots** (`refusal`): one whose times are not plausible on the estimator's clock (`estimation.time_fault`: not
  a number, or more than MAX_CLOCK_AHEAD_S ahead), or that holds more rows than the snapshotter ever writes: at most
  `max_num_seqs` running requests (vLLM runs no more; `max_num_seqs` itself at most MAX_NUM_SEQS), and
  `max_num_seqs + MAX_WAITING_ROWS` rows in all. Adopting a snapshot costs Python work per row on the event loop
  that answers Estimate calls (100,000 rows held it ~1.5 s), so its size is checked first, before anything reads its
  rows.
- **Values** (`RedisValues`): a registration or snapshot that does not decode or names another instance than its
  key, or a member of a sorted set that is not UTF-8, is one bad value to skip (counted), not a reason to give up on
  the others.

A value read again at every resync is logged the first time and every 100th (`bear.common.log_throttle`), so that
it does not flood the log.
"""

from __future__ import annotations

import logging
from typing import Protocol, TypeVar

from google.protobuf.message import DecodeError, Message

from bear.common.log_throttle import LogThrottle
from bear.estimator.estimation import time_fault
from bear.snapshotter.region import MAX_WAITING_ROWS_LIMIT
from bear.v1 import snapshot_pb2

# The most rows beyond the running ones any snapshotter writes: its region holds max_num_seqs + max_waiting_rows
# (bear.snapshotter.recorder), max_waiting_rows being configurable (BEAR_SNAPSHOT_MAX_WAITING) up to this.
MAX_WAITING_ROWS = MAX_WAITING_ROWS_LIMIT
MAX_NUM_SEQS = 65_536  # no engine runs more sequences at once (vLLM's defaults: 256 to 1,024): a larger one is a lie

M = TypeVar("M", bound=Message)


def refusal(snapshot: snapshot_pb2.InstanceSnapshot, now_s: float) -> str | None:
    """Why the feed refuses `snapshot` at `now_s` (None: it takes it in). Reads only counts and times."""
    max_num_seqs = snapshot.engine.max_num_seqs
    num_running, num_waiting = len(snapshot.running), len(snapshot.waiting)
    if max_num_seqs > MAX_NUM_SEQS:
        return f"max_num_seqs = {max_num_seqs}, more than any engine runs (at most {MAX_NUM_SEQS} taken)"
    if num_running > max_num_seqs:
        return f"{num_running} running rows, more than max_num_seqs = {max_num_seqs}"
    if num_running + num_waiting > max_num_seqs + MAX_WAITING_ROWS:
        return (f"{num_running} running + {num_waiting} waiting rows, more than the snapshotter writes "
                f"(max_num_seqs + {MAX_WAITING_ROWS} = {max_num_seqs + MAX_WAITING_ROWS})")
    return time_fault(snapshot, now_s)


def parsed(message_type: type[M], payload: bytes) -> M | None:
    """`payload` decoded as `message_type`, or None when it is not one (a foreign value under our key)."""
    try:
        return message_type.FromString(payload)
    except (DecodeError, ValueError):
        return None


def text(value: bytes | str) -> str | None:
    """A Redis member or value as text, or None when it is not UTF-8."""
    if isinstance(value, str):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


class SkipCounts(Protocol):
    undecodable_values: int


class RedisValues:
    """Decodes what the feed reads from Redis: a value that does not decode is skipped, counted in
    `counts.undecodable_values` and logged (the first time for its key, then every 100th)."""

    def __init__(self, counts: SkipCounts, logger: logging.Logger) -> None:
        self._counts = counts
        self._logger = logger
        self._throttle = LogThrottle()  # by Redis key

    def message(self, message_type: type[M], payload: bytes | None, key: str, instance_id: str) -> M | None:
        """The message stored under `key`, the key of `instance_id`; None when there is none, it does not decode or
        it names another instance (a value under one instance's key must not speak for another, or for one that
        does not exist)."""
        if payload is None:
            return None
        message = parsed(message_type, payload)
        if message is None:
            self._skip(key, f"the value under {key} is not a {message_type.__name__}")
        elif (named := getattr(message, "instance_id")) != instance_id:
            self._skip(key, f"the {message_type.__name__} under {key} is of instance {named!r}")
            return None
        else:
            self._throttle.ok(key)
        return message

    def texts(self, members: list[bytes], key: str) -> list[str]:
        """The members read from the sorted set `key` as text, without those that are not UTF-8."""
        texts = []
        for member in members:
            value = text(member)
            if value is None:
                self._skip(key, f"a member of {key} is not UTF-8 ({member[:40]!r})")
            else:
                texts.append(value)
        return texts

    def _skip(self, key: str, what: str) -> None:
        self._counts.undecodable_values += 1
        if self._throttle.should_log(key):
            self._logger.warning("%s: skipped (%d times so far)", what, self._throttle.count(key))
