"""The estimator's Prometheus metrics (the default registry, served by `bear.common.service` on /metrics).

    bear_estimator_estimate_seconds            histogram: time to answer one Estimate call
    bear_estimator_estimates_total{method}     counter: instance estimates by method (replay, lps, none)
    bear_estimator_errors_total{code}          counter: Estimate calls answered with an error status
    bear_estimator_caller_dispatches_total     counter: dispatches first learnt from an Estimate call (before Redis)
    bear_estimator_snapshot_age_seconds{instance}  gauge: age of each instance's snapshot (now − taken or read at);
                                               an instance withdrawn from Redis keeps its series, its age growing,
                                               until it is forgotten (BEAR_ESTIMATOR_FORGET_AFTER_S, 60 s: a Redis
                                               that restarts empty must not make the estimator forget its pool)
    bear_estimator_feed_*                      counters and gauges of the Redis feed and of the remaining lengths
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from bear.estimator.estimation import Estimator
from bear.estimator.remaining import RemainingLengths
from bear.estimator.snapshot_feed import SnapshotFeed

ESTIMATE_SECONDS = Histogram(
    "bear_estimator_estimate_seconds", "Time to answer one Estimate call",
    buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0))
ESTIMATES = Counter("bear_estimator_estimates", "Instance estimates by method", ["method"])
ERRORS = Counter("bear_estimator_errors", "Estimate calls answered with an error status", ["code"])
DISPATCHES_FROM_CALLERS = Counter("bear_estimator_caller_dispatches",
                                  "Dispatches first learnt from an Estimate call's recent_dispatches (before Redis)")


class FeedCollector(Collector):
    """Reads the feed's state at scrape time (registered while a service runs)."""

    def __init__(self, estimator: Estimator, feed: SnapshotFeed, remaining: RemainingLengths,
                 clock: Callable[[], float] = time.time) -> None:
        self._estimator, self._feed, self._remaining, self._clock = estimator, feed, remaining, clock

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = self._clock()
        ages = GaugeMetricFamily("bear_estimator_snapshot_age_seconds",
                                 "Age of each instance's latest snapshot (now minus when it was last found current)",
                                 labels=["instance"])
        for instance_id in self._estimator.instance_ids():
            snapshot = self._estimator.snapshot(instance_id)
            if snapshot is not None:
                ages.add_metric([instance_id], max(0.0, now - max(snapshot.taken_at_s, snapshot.read_at_s)))
        yield ages
        stats = self._feed.stats
        yield GaugeMetricFamily("bear_estimator_feed_subscribed", "1 while subscribed to the snapshots channel",
                                value=float(stats.subscribed))
        yield GaugeMetricFamily("bear_estimator_instances", "Instances the estimator knows",
                                value=len(self._estimator.instance_ids()))
        for name, text, value in (
                ("snapshots_received", "Snapshots received from Redis", stats.snapshots_received),
                ("snapshots_adopted", "Snapshots prepared for the replay", stats.snapshots_adopted),
                ("snapshots_rejected", "Snapshots refused (times not plausible, too many rows) or the replay cannot "
                 "use", stats.snapshots_rejected),
                ("undecodable_values", "Values and members read from Redis skipped as undecodable",
                 stats.undecodable_values),
                ("dispatches_recorded", "Dispatch records read from Redis", stats.dispatches_recorded),
                ("dispatches_unusable", "Dispatch records, from Redis or an Estimate call, that cannot be a dispatch "
                 "(no request id, no prompt tokens, a time or length that is not a number)", stats.dispatches_unusable),
                ("redis_failures", "Failed Redis calls", stats.redis_failures),
                ("resyncs", "Full rereads of Redis", stats.resyncs)):
            yield CounterMetricFamily(f"bear_estimator_feed_{name}", text, value=value)
        remaining = self._remaining.stats
        rows = CounterMetricFamily("bear_estimator_remaining_rows", "Residents' remaining lengths by where they came "
                                   "from", labels=["source"])
        rows.add_metric(["predictor"], remaining.rows_resolved)
        rows.add_metric(["cache"], remaining.rows_cached)
        rows.add_metric(["fallback"], remaining.rows_fallback)
        yield rows
        yield CounterMetricFamily("bear_estimator_remaining_source_failures",
                                  "Failed calls for residents' remaining lengths", value=remaining.source_failures)


def register_feed(collector: FeedCollector) -> Callable[[], None]:
    """Registers the collector; returns how to unregister it."""
    REGISTRY.register(collector)
    return lambda: REGISTRY.unregister(collector)
