"""What the estimator's feed refuses before working on it: implausible snapshots, oversized ones, undecodable values."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from bear.estimator.admission import MAX_NUM_SEQS, MAX_WAITING_ROWS, RedisValues, refusal
from bear.estimator.estimation import MAX_CLOCK_AHEAD_S
from bear.v1 import snapshot_pb2
from tests.estimator_builders import decoding, engine, queued, registration, snapshot

NOW = 1_800_000_000.0
SEQS = 8


def sized(num_running: int, num_waiting: int = 0, taken_at_s: float = NOW) -> snapshot_pb2.InstanceSnapshot:
    return snapshot("a", taken_at_s, [decoding(f"r{k}") for k in range(num_running)],
                    [queued(f"w{k}") for k in range(num_waiting)], engine_config=engine(max_num_seqs=SEQS))


@pytest.mark.parametrize("message, refused", [
    (sized(SEQS, MAX_WAITING_ROWS), None),  # as many rows as the snapshotter writes
    (sized(SEQS + 1), "9 running rows, more than max_num_seqs = 8"),
    (sized(SEQS, MAX_WAITING_ROWS + 1), f"8 running + {MAX_WAITING_ROWS + 1} waiting rows, more than the "
                                        f"snapshotter writes (max_num_seqs + {MAX_WAITING_ROWS} = "
                                        f"{SEQS + MAX_WAITING_ROWS})"),
    (snapshot("a", NOW, engine_config=engine(max_num_seqs=MAX_NUM_SEQS + 1)),
     f"max_num_seqs = {MAX_NUM_SEQS + 1}, more than any engine runs (at most {MAX_NUM_SEQS} taken)"),
    (sized(0, 0, NOW + MAX_CLOCK_AHEAD_S), None),
    (sized(0, 0, NOW + MAX_CLOCK_AHEAD_S + 0.5), "taken_at_s is 5.500 s ahead of the estimator's clock (at most 5 s)"),
    (sized(0, 0, NOW - 3600), None),  # old: the estimator's age limit deals with it
])
def test_refusal(message: snapshot_pb2.InstanceSnapshot, refused: str | None) -> None:
    assert refusal(message, NOW) == refused


@dataclass
class Counts:
    undecodable_values: int = 0


def test_values_that_do_not_decode_are_skipped_counted_and_logged_once_per_key(
        caplog: pytest.LogCaptureFixture) -> None:
    counts = Counts()
    values = RedisValues(counts, logging.getLogger("test"))
    good = registration("a").SerializeToString()
    with caplog.at_level("WARNING", logger="test"):
        for _ in range(3):
            assert values.texts([b"a", b"\xff\xfe", "b"], "set") == ["a", "b"]
            assert values.message(snapshot_pb2.InstanceRegistration, b"\xff\xff garbage", "key", "a") is None
        assert values.message(snapshot_pb2.InstanceRegistration, good, "key", "a") == registration("a")
        assert values.message(snapshot_pb2.InstanceRegistration, b"\xff\xff garbage", "key", "a") is None
    assert values.message(snapshot_pb2.InstanceRegistration, None, "key", "a") is None
    assert counts.undecodable_values == 7
    assert [r.getMessage() for r in caplog.records] == [
        "a member of set is not UTF-8 (b'\\xff\\xfe'): skipped (1 times so far)",
        "the value under key is not a InstanceRegistration: skipped (1 times so far)",
        "the value under key is not a InstanceRegistration: skipped (1 times so far)",  # bad again after a good one
    ]


def test_a_value_naming_another_instance_than_its_key_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    counts = Counts()
    values = RedisValues(counts, logging.getLogger("test"))
    with caplog.at_level("WARNING", logger="test"):
        for _ in range(2):
            assert values.message(snapshot_pb2.InstanceRegistration, registration("b").SerializeToString(),
                                  "bear:instance:a", "a") is None
    assert counts.undecodable_values == 2
    assert [r.getMessage() for r in caplog.records] == [
        "the InstanceRegistration under bear:instance:a is of instance 'b': skipped (1 times so far)"]
