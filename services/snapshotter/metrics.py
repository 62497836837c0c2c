"""The sidecar's Prometheus metrics, read from its parts at scrape time (served on /metrics by `main`).

    bear_snapshotter_engine_available                  1 while a live engine writes the region (and its server
                                                       answers the health probe, where one is set), else 0
    bear_snapshotter_engine_health_probes_total        health probes of the vLLM server (with a health URL only)
    bear_snapshotter_engine_health_failures_total      those that failed (refused, timed out, not 200)
    bear_snapshotter_snapshots_total                   new engine states read from the region
    bear_snapshotter_region_errors_total               reads of a region this version cannot read
    bear_snapshotter_torn_reads_total                  copies of the region dropped: the engine wrote meanwhile
    bear_snapshotter_plugin_errors_total               exceptions the scheduler plugin contained inside vLLM
    bear_snapshotter_missed_steps_total                executed steps that left the region's ring unread (the
                                                       calibration misses them: the sidecar polls too slowly)
    bear_snapshotter_snapshot_age_seconds              now − when the latest snapshot was read or refreshed, as
                                                       the estimator counts it (an idle engine's stays under
                                                       BEAR_SNAPSHOT_REFRESH_S while the sidecar runs)
    bear_snapshotter_engine_state_age_seconds          now − when the engine last wrote its state (grows while
                                                       the engine is idle)
    bear_snapshotter_residents{queue}                  requests in the latest state (running, waiting)
    bear_snapshotter_published_total                   snapshots sent to Redis
    bear_snapshotter_redis_failures_total              failed Redis round trips (each retried with back-off)
    bear_snapshotter_calibration_mape                  eq. 12 fit's error on its window, as a fraction
    bear_snapshotter_calibration_samples               steps in that fit
    bear_snapshotter_calibration_age_seconds           now − when the fit was made
    bear_snapshotter_step_time_ratio                   the engine's speed over its latest steps against the fit
                                                       (the factor on its per-step and decode-attention terms that
                                                       gives each step its measured time, median; the snapshot's
                                                       step_time_ratio)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from bear.snapshotter.engine_health import EngineHealthProbe
from bear.snapshotter.publisher import RedisPublisher
from bear.snapshotter.sidecar import Snapshotter


class SnapshotterCollector(Collector):
    def __init__(self, snapshotter: Snapshotter, publisher: RedisPublisher, clock: Callable[[], float] = time.time,
                 probe: EngineHealthProbe | None = None):
        self._snapshotter, self._publisher, self._clock, self._probe = snapshotter, publisher, clock, probe

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s, now = self._snapshotter, self._clock()
        latest, fit = s.latest(), s.coefficients()
        yield GaugeMetricFamily("bear_snapshotter_engine_available", "1 while a live engine writes the region",
                                value=1.0 if s.available else 0.0)
        if self._probe is not None:
            yield CounterMetricFamily("bear_snapshotter_engine_health_probes", "Health probes of the vLLM server",
                                      value=self._probe.num_probes)
            yield CounterMetricFamily("bear_snapshotter_engine_health_failures", "Health probes of the vLLM server "
                                      "that failed (refused, timed out, not 200)", value=self._probe.num_failures)
        yield CounterMetricFamily("bear_snapshotter_snapshots", "New engine states read from the region",
                                  value=s.num_snapshots)
        yield CounterMetricFamily("bear_snapshotter_region_errors", "Reads of a region this version cannot read",
                                  value=s.num_region_errors)
        yield CounterMetricFamily("bear_snapshotter_torn_reads", "Copies of the region dropped because the engine "
                                  "wrote meanwhile", value=s.num_torn_reads)
        yield CounterMetricFamily("bear_snapshotter_plugin_errors", "Exceptions the scheduler plugin contained "
                                  "inside vLLM", value=s.num_plugin_errors)
        yield CounterMetricFamily("bear_snapshotter_missed_steps", "Executed steps that left the region's ring "
                                  "before the sidecar read them", value=s.num_missed_steps)
        yield CounterMetricFamily("bear_snapshotter_published", "Snapshots sent to Redis",
                                  value=self._publisher.num_snapshots_published)
        yield CounterMetricFamily("bear_snapshotter_redis_failures", "Failed Redis round trips",
                                  value=self._publisher.num_failures)
        if latest is not None:
            yield GaugeMetricFamily("bear_snapshotter_snapshot_age_seconds", "Now minus when the latest snapshot "
                                    "was read or refreshed (the age the estimator sees)",
                                    value=max(0.0, now - max(latest.taken_at_s, latest.read_at_s)))
            yield GaugeMetricFamily("bear_snapshotter_engine_state_age_seconds", "Now minus when the engine last "
                                    "wrote its state (grows while it is idle)", value=max(0.0, now - latest.taken_at_s))
            if latest.step_time_ratio > 0:
                yield GaugeMetricFamily("bear_snapshotter_step_time_ratio", "The factor on eq. 12's per-step and "
                                        "decode-attention terms that gives the engine's latest steps their measured "
                                        "durations, median", value=latest.step_time_ratio)
            residents = GaugeMetricFamily("bear_snapshotter_residents", "Requests in the latest state",
                                          labels=["queue"])
            residents.add_metric(["running"], len(latest.running))
            residents.add_metric(["waiting"], len(latest.waiting) + latest.num_omitted_waiting)
            yield residents
        if fit is not None:
            yield GaugeMetricFamily("bear_snapshotter_calibration_mape", "Eq. 12 fit's error on its window",
                                    value=fit.mape)
            yield GaugeMetricFamily("bear_snapshotter_calibration_samples", "Steps in the eq. 12 fit",
                                    value=fit.num_samples)
            if fit.fitted_at_s > 0:
                yield GaugeMetricFamily("bear_snapshotter_calibration_age_seconds", "Now minus when the fit was made",
                                        value=now - fit.fitted_at_s)
