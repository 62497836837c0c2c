"""The sidecar's loop: read the region, keep the latest snapshot, calibrate, hand over to the publisher.

Every `poll_interval_s` the region is read (`RegionReader`); a new state becomes the latest `InstanceSnapshot`
(served over gRPC and offered to Redis), executed steps feed the online calibration, and a new fit is offered too. An
unchanged region is re-offered every `refresh_s` with a fresh `read_at_s`: an idle engine's snapshot stays young
enough for the estimator, and its Redis key alive. A missing region (the engine shut down) or one whose heartbeat is
older than `engine_timeout_s` (the engine was killed) clears the latest snapshot and withdraws the instance; so does
an engine whose server fails its health probe (`engine_healthy`, engine_health.py), and a region whose server has not
answered yet is not registered. Nothing here waits on Redis or HTTP.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from bear.snapshotter.calibration import OnlineCalibrator
from bear.snapshotter.config import SnapshotterConfig
from bear.snapshotter.reader import RegionReader, RegionSnapshot
from bear.snapshotter.region import RegionError
from bear.core.wire import engine_to_proto
from bear.snapshotter.wire import snapshot_to_proto, step_to_proto
from bear.v1 import calibration_pb2, snapshot_pb2

logger = logging.getLogger("bear.snapshotter")


class Publisher(Protocol):
    def offer_snapshot(self, snapshot: snapshot_pb2.InstanceSnapshot) -> None: ...
    def offer_coefficients(self, coefficients: calibration_pb2.BatchTimeCoefficients) -> None: ...
    def set_registration(self, registration: snapshot_pb2.InstanceRegistration) -> None: ...
    def withdraw_registration(self) -> None: ...


class Snapshotter:
    """Polled by one thread (`run`); read by any (`latest`, `wait_newer`, `coefficients`)."""

    def __init__(self, config: SnapshotterConfig, reader: RegionReader, publisher: Publisher | None,
                 calibrator: OnlineCalibrator, on_availability: Callable[[bool], None] = lambda available: None,
                 clock: Callable[[], float] = time.time, engine_healthy: Callable[[], bool] = lambda: True):
        self._config = config
        self._reader = reader
        self._publisher = publisher
        self._calibrator = calibrator
        self._on_availability = on_availability
        self._clock = clock
        self._engine_healthy = engine_healthy
        self._changed = threading.Condition()
        self._latest: snapshot_pb2.InstanceSnapshot | None = None
        self._offered_at_s = 0.0
        self._engine_created_at_s: float | None = None
        self._available: bool | None = None
        self.num_snapshots = 0
        self.num_region_errors = 0
        self.num_plugin_errors = 0  # exceptions the engine's plugin contained, as its latest state counts them
        self.num_missed_steps = 0  # executed steps that left the region's ring before they were read

    @property
    def num_torn_reads(self) -> int:
        """Copies of the region discarded because the engine wrote while they were taken."""
        return self._reader.num_torn

    # The poll loop ------------------------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        num_failures = 0
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - a bad read must not end the sidecar: log, go on with the next one
                num_failures += 1
                if num_failures == 1 or num_failures % 1000 == 0:
                    logger.exception("snapshotter poll failed (%d times)", num_failures)
            stop.wait(self._config.poll_interval_s)

    def poll_once(self) -> bool:
        """One read of the region; True if it held something new."""
        region = self._read(changed_only=True)
        now = self._clock()
        gone = self._why_no_engine(now)
        if gone:
            self._set_latest(None)
            self._set_available(False, gone)
            return False
        coming_back = self._available is False
        self._set_available(True)
        if region is None and coming_back:
            # The state as it is, changed or not: an idle engine's region may not change for a long while after its
            # server answers again, and nothing would be published until then.
            region = self._read(changed_only=False)
        if region is None:
            self._heartbeat(now)
            return False
        self.num_plugin_errors = region.num_errors
        self.num_missed_steps += region.num_missed_steps
        self._calibrate(region, now)
        if not region.valid:
            # A write that failed half-way: the engine's state is unknown until its next write. The last one is no
            # longer current, so it is not republished (the estimator then finds it stale and says so).
            self._set_latest(None)
            return True
        self._register_if_new_engine(region)
        self._set_latest(snapshot_to_proto(region, instance_id=self._config.instance_id, pool=self._config.pool,
                                           model=self._config.model, read_at_s=now,
                                           batch_time=self._calibrator.latest,
                                           step_time_ratio=self._calibrator.recent_time_ratio()))
        self._offer(now)
        return True

    def _read(self, changed_only: bool) -> RegionSnapshot | None:
        try:
            return self._reader.read(changed_only=changed_only)
        except RegionError as error:
            # Either no region can be read (the instance is withdrawn below) or the engine's latest state cannot:
            # the one before it is no longer current and is not republished.
            self._set_latest(None)
            self.num_region_errors += 1
            if self.num_region_errors == 1 or self.num_region_errors % 1000 == 0:
                logger.warning("snapshot region %s unreadable (%d times): %s", self._reader.path,
                               self.num_region_errors, error)
            return None

    def _calibrate(self, region: RegionSnapshot, now: float) -> None:
        executed = [step_to_proto(step) for step in region.executed if step.complete]
        self._calibrator.add(executed)
        fitted = self._calibrator.refit_if_due(now)
        if fitted is not None and self._publisher is not None:
            self._publisher.offer_coefficients(fitted)

    def _heartbeat(self, now: float) -> None:
        """An unchanged region: the latest snapshot is still current; say so every `refresh_s`."""
        latest = self._latest
        if latest is None or now - self._offered_at_s < self._config.refresh_s:
            return
        refreshed = snapshot_pb2.InstanceSnapshot()
        refreshed.CopyFrom(latest)
        refreshed.read_at_s = now
        self._set_latest(refreshed)
        self._offer(now)

    def _offer(self, now: float) -> None:
        self._offered_at_s = now
        if self._publisher is not None and self._latest is not None:
            self._publisher.offer_snapshot(self._latest)

    def _register_if_new_engine(self, region: RegionSnapshot) -> None:
        if region.created_at_s == self._engine_created_at_s:
            return
        self._engine_created_at_s = region.created_at_s
        config = self._config
        registration = snapshot_pb2.InstanceRegistration(
            instance_id=config.instance_id, pool=config.pool, model=config.model or region.engine.model,
            endpoint=config.endpoint, snapshotter_endpoint=config.advertised_endpoint,
            input_usd_per_million_tokens=config.input_usd_per_million_tokens,
            output_usd_per_million_tokens=config.output_usd_per_million_tokens,
            engine=engine_to_proto(region.engine))
        logger.info("engine found in %s (pid %d): %s", self._reader.path, region.writer_pid, region.engine)
        if self._publisher is not None:
            self._publisher.set_registration(registration)

    def _why_no_engine(self, now: float) -> str:
        """Why no live engine is behind the region ("" if one is)."""
        if not self._reader.attached:
            return "no region yet" if self._available is None else "region removed"
        alive_at_s, timeout_s = self._reader.alive_at_s(), self._config.engine_timeout_s
        if not now - timeout_s <= alive_at_s <= now + timeout_s:  # a NaN or far-future beat proves nothing either
            return (f"no heartbeat for {timeout_s:g} s" if alive_at_s < now else
                    f"its heartbeat says {alive_at_s!r}, not a time of now")
        if not self._engine_healthy():
            return f"its server does not answer {self._config.engine_health_url}"
        return ""

    def _set_available(self, available: bool, why: str = "") -> None:
        if available != self._available:
            # Not yet at start is no news (the sidecar often starts first); a live engine lost is.
            log = logger.warning if self._available else logger.info
            self._available = available
            if not available:
                log("no live engine behind %s (%s): waiting for one", self._reader.path, why)
                # Routers must stop sending it queries now, not when the registration's TTL runs out (it would not:
                # the heartbeat refreshes it); the next engine registers anew.
                self._engine_created_at_s = None
                if self._publisher is not None:
                    self._publisher.withdraw_registration()
            self._on_availability(available)

    def _set_latest(self, snapshot: snapshot_pb2.InstanceSnapshot | None) -> None:
        with self._changed:
            if snapshot is not None and (self._latest is None or
                                         snapshot.sequence_number != self._latest.sequence_number):
                self.num_snapshots += 1
            self._latest = snapshot
            self._changed.notify_all()

    # Readers (any thread) -----------------------------------------------------------------------------------------

    def latest(self) -> snapshot_pb2.InstanceSnapshot | None:
        return self._latest

    @property
    def available(self) -> bool:
        """A live engine writes the region."""
        return bool(self._available)

    def wait_newer(self, sequence_number: int, timeout_s: float) -> snapshot_pb2.InstanceSnapshot | None:
        """The latest snapshot once its sequence number passes `sequence_number`; None after `timeout_s`."""
        with self._changed:
            self._changed.wait_for(lambda: self._latest is not None and self._latest.sequence_number > sequence_number,
                                   timeout=timeout_s)
            latest = self._latest
        return latest if latest is not None and latest.sequence_number > sequence_number else None

    def coefficients(self) -> calibration_pb2.BatchTimeCoefficients | None:
        return self._calibrator.latest
