"""The sidecar republishes an unchanged (idle) engine's snapshot every refresh_s with a fresh read_at_s, so that the
estimator never finds an idle instance's snapshot older than its limit."""

from __future__ import annotations

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
