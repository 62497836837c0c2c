"""The sidecar republishes an unchanged (idle) engine's snapshot every refresh_s with a fresh read_at_s, so that the
estimator never finds an idle instance's snapshot older than its limit."""

from __future__ import annotations

import math
import time

import pytest

from bear.snapshotter.calibration import OnlineCalibrator
from bear.snapshotter.config import SnapshotterConfig
from bear.snapshotter.reader import RegionReader
from bear.snapshotter.region import Capacities
from bear.snapshotter.sidecar import Snapshotter
from tests.region_builders import FakeEngine, decoding


class RecordingPublisher:
    def __init__(self) -> None:
        self.snapshots: list = []

    def offer_snapshot(self, snapshot) -> None:  # noqa: ANN001
        self.snapshots.append(snapshot)

    def offer_coefficients(self, coefficients) -> None:  # noqa: ANN001
        pass

    def set_registration(self, registration) -> None:  # noqa: ANN001
        pass

    def withdraw_registration(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("refresh_s", [0.5, 0.2])
def test_unchanged_snapshot_is_republished_every_refresh(tmp_path, refresh_s: float) -> None:
    path = str(tmp_path / "region")
    engine = FakeEngine(path, Capacities(max_rows=16, max_step_entries=8, num_ring_steps=8, max_slots=64))
    engine.write_state([decoding("a")], written_at_s=time.time())
    clock, publisher = Clock(), RecordingPublisher()
    config = SnapshotterConfig(region=path, instance_id="pod-1", refresh_s=refresh_s)
    sidecar = Snapshotter(config, RegionReader(path), publisher, OnlineCalibrator(100, 10, 1.0), clock=clock)

    assert sidecar.poll_once()
    assert len(publisher.snapshots) == 1
    first_read = publisher.snapshots[0].read_at_s

    clock.now += 0.9 * refresh_s
    sidecar.poll_once()
    assert len(publisher.snapshots) == 1  # not yet due

    clock.now += 0.2 * refresh_s
    sidecar.poll_once()
    assert len(publisher.snapshots) == 2
    again = publisher.snapshots[1]
    assert again.read_at_s == pytest.approx(clock.now) and again.read_at_s > first_read
    assert again.sequence_number == publisher.snapshots[0].sequence_number  # the same state, younger


def test_refresh_must_be_below_the_ttl() -> None:
    with pytest.raises(ValueError, match="BEAR_SNAPSHOT_REFRESH_S"):
        SnapshotterConfig(instance_id="x", refresh_s=20.0)
    assert SnapshotterConfig.from_environ({"BEAR_SNAPSHOT_REFRESH_S": "0.25"}).refresh_s == 0.25


class CountingPublisher(RecordingPublisher):
    def __init__(self) -> None:
        super().__init__()
        self.num_withdrawals = 0

    def withdraw_registration(self) -> None:
        self.num_withdrawals += 1


def _polled_sidecar(tmp_path) -> tuple[FakeEngine, Snapshotter, Clock, CountingPublisher]:  # noqa: ANN001
    path = str(tmp_path / "region")
    engine = FakeEngine(path, Capacities(max_rows=16, max_step_entries=8, num_ring_steps=8, max_slots=64))
    engine.write_state([decoding("a"), decoding("b")], written_at_s=time.time())
    clock, publisher = Clock(), CountingPublisher()
    config = SnapshotterConfig(region=path, instance_id="pod-1", refresh_s=0.5)
    sidecar = Snapshotter(config, RegionReader(path), publisher, OnlineCalibrator(100, 10, 1.0), clock=clock)
    assert sidecar.poll_once() and len(publisher.snapshots) == 1
    return engine, sidecar, clock, publisher


@pytest.mark.parametrize("damage", ["write failed half-way", "contradicts itself"])
def test_a_state_that_cannot_be_read_is_not_replaced_by_the_one_before(tmp_path, damage: str) -> None:
    # The engine has moved on (its residents are no longer a and b): republishing the last good snapshot with fresh
    # read times would have the estimator replay a state that is gone, for as long as the engine stayed idle.
    engine, sidecar, clock, publisher = _polled_sidecar(tmp_path)
    engine.write_state([decoding("c")], written_at_s=time.time())
    if damage == "write failed half-way":
        engine.rewrite_state(flags=0)  # STATE_VALID cleared, as a write that raised leaves it
    else:
        engine.rewrite_state(num_running=0)
    for _ in range(5):  # past refresh_s, within the heartbeat's timeout
        clock.now += 0.3
        sidecar.poll_once()
    assert len(publisher.snapshots) == 1 and sidecar.latest() is None
    assert sidecar.available  # the engine lives: its next state is published
    engine.write_state([decoding("c")], written_at_s=time.time())
    clock.now += 0.01
    assert sidecar.poll_once()
    assert [r.request_id for r in publisher.snapshots[-1].running] == ["c"]


@pytest.mark.parametrize("heartbeat", [math.nan, math.inf, 1e300])
def test_a_heartbeat_that_is_no_time_of_now_does_not_keep_an_engine_alive(tmp_path, heartbeat: float) -> None:
    engine, sidecar, clock, publisher = _polled_sidecar(tmp_path)
    engine.writer.beat(heartbeat)
    clock.now += 3600.0  # an hour without a write or a real beat
    sidecar.poll_once()
    assert not sidecar.available and publisher.num_withdrawals == 1 and sidecar.latest() is None
