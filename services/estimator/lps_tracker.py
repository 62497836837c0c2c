"""The LPS parameters of one instance (eq. 13–15), measured from the stream of its snapshots and dispatches.

The closed form needs α (arrivals per second), μ (completions per second at saturation), k (requests served at once)
and θ (prefill tokens per second, from the calibration). Over a sliding window of `window_s`:

- between two consecutive snapshots, the requests that left the running list without going back to the waiting
  queue (a preemption) completed; the interval counts as busy when the earlier snapshot had a running request;
- μ = completions ÷ busy time: the instance's throughput while it serves, so that ρ = α/μ is the busy fraction and
  stays below 1 in a steady state (an instance never pushed to saturation shows a μ below its capacity, which makes
  the closed form pessimistic rather than blind);
- k = the busy-time average of the number of running requests (at least 1);
- α = the dispatches routers recorded for the instance in the window ÷ the window (or the time since tracking began,
  if shorter), or, when routers recorded none, the requests first seen in its snapshots; c_a² = the squared
  coefficient of variation of their gaps (`bear.core.lps.arrival_statistics`, 1 with fewer than three); c_s² = 1.

Snapshots further apart than `max_gap_s` (the estimator missed some: Redis was down) are not compared. μ and k keep
their last measured values when the window holds no completion, so that an instance that went quiet still has an
estimate; α then decays to 0 with the window.

An engine publishes a snapshot per step (a hundred or more a second), so the window holds thousands of intervals:
their sums are kept as they enter and leave it (integers exact, the float sums re-added from scratch every
RESUM_EVERY intervals, so that rounding cannot pile up), and α's gap statistics are kept until a time enters or leaves.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

from bear.core.lps import LpsParameters, arrival_statistics
from bear.estimator.estimation import MAX_CLOCK_AHEAD_S
from bear.v1 import snapshot_pb2

MIN_COMPLETIONS = 3  # μ from fewer completions is noise
RESUM_EVERY = 4096  # intervals expired between two exact re-summations of the window


@dataclass(frozen=True, slots=True)
class _Interval:
    end_s: float
    busy_s: float
    running_time: float  # Σ running requests × seconds
    completions: int


class LpsTracker:
    """One instance's measurements. Not thread-safe."""

    def __init__(self, window_s: float = 60.0, max_gap_s: float = 5.0) -> None:
        self._window_s = window_s
        self._max_gap_s = max_gap_s
        self._intervals: deque[_Interval] = deque()
        self._dispatches_s: list[float] = []  # sorted
        self._arrivals_s: list[float] = []  # sorted
        self._started_at_s: float | None = None
        self._seen_ids: set[str] = set()
        self._previous: tuple[float, frozenset[str]] | None = None  # (taken_at_s, running ids) of the last snapshot
        self._service_rate_qps: float | None = None
        self._concurrency: float | None = None
        self._busy_s = 0.0  # Σ over self._intervals
        self._running_time = 0.0
        self._completions = 0
        self._expired_since_resum = 0
        self._arrival_scv: float | None = None  # c_a² of the arrival times, until one enters or leaves

    def observe_snapshot(self, snapshot: snapshot_pb2.InstanceSnapshot) -> None:
        """A newer snapshot of the instance (an older or repeated one is ignored)."""
        taken_at = snapshot.taken_at_s
        running = frozenset(r.request_id for r in snapshot.running)
        waiting = frozenset(r.request_id for r in snapshot.waiting)
        previous = self._previous
        if previous is not None and taken_at <= previous[0]:
            return
        self._previous = (taken_at, running)
        self._start(taken_at)
        for request in (*snapshot.running, *snapshot.waiting):
            if request.request_id not in self._seen_ids:
                self._seen_ids.add(request.request_id)
                arrival = request.arrival_time_s
                # An arrival time that is no time before the snapshot (none given, or not a number) counts as the
                # snapshot's: one that never left the window would keep the instance busy for ever.
                plausible = 0.0 < arrival <= taken_at + MAX_CLOCK_AHEAD_S
                bisect.insort(self._arrivals_s, arrival if plausible else taken_at)
                self._arrival_scv = None
        self._seen_ids &= running | waiting  # a request is new once; the set stays as small as the instance
        if previous is None:
            return
        before_s, before = previous
        elapsed = taken_at - before_s
        if elapsed <= self._max_gap_s and before:
            completed = len(before - running - waiting)
            interval = _Interval(taken_at, elapsed, len(before) * elapsed, completed)
            self._intervals.append(interval)
            self._busy_s += interval.busy_s
            self._running_time += interval.running_time
            self._completions += interval.completions
        self._expire(taken_at)
        self._measure()

    def observe_dispatch(self, dispatched_at_s: float) -> None:
        """A dispatch routers recorded (its time a number no more than MAX_CLOCK_AHEAD_S ahead of the caller's
        clock); the window moves on with dispatches too, whether or not snapshots come."""
        self._start(dispatched_at_s)
        bisect.insort(self._dispatches_s, dispatched_at_s)
        self._arrival_scv = None
        self._expire(dispatched_at_s - MAX_CLOCK_AHEAD_S)

    def parameters(self, prefill_tokens_per_s: float | None, now_s: float) -> LpsParameters | None:
        """The closed form's parameters now, or None while μ, k or θ is unknown."""
        self._expire(now_s)
        self._measure()
        if self._service_rate_qps is None or self._concurrency is None or not prefill_tokens_per_s:
            return None
        arrival_rate, arrival_scv = self._arrivals(now_s)
        return LpsParameters(arrival_rate_qps=arrival_rate, service_rate_qps=self._service_rate_qps,
                             concurrency=self._concurrency, prefill_tokens_per_s=prefill_tokens_per_s,
                             arrival_scv=arrival_scv)

    def _measure(self) -> None:
        """μ and k from the window, when it holds enough completions (else they keep their last values)."""
        if self._completions >= MIN_COMPLETIONS and self._busy_s > 0:
            self._service_rate_qps = self._completions / self._busy_s
            self._concurrency = max(1.0, self._running_time / self._busy_s)

    def _arrivals(self, now_s: float) -> tuple[float, float]:
        times = self._dispatches_s or self._arrivals_s
        span_s = min(self._window_s, now_s - (self._started_at_s if self._started_at_s is not None else now_s))
        rate = len(times) / span_s if span_s > 0 else 0.0
        if self._arrival_scv is None:
            distinct = sorted(set(times))
            scv = arrival_statistics(distinct)[1] if len(distinct) >= 3 else 1.0
            self._arrival_scv = scv if math.isfinite(scv) else 1.0
        return rate, self._arrival_scv

    def _start(self, at_s: float) -> None:
        if self._started_at_s is None or at_s < self._started_at_s:
            self._started_at_s = at_s

    def _expire(self, now_s: float) -> None:
        cutoff = now_s - self._window_s
        intervals = self._intervals
        while intervals and intervals[0].end_s < cutoff:
            gone = intervals.popleft()
            self._busy_s -= gone.busy_s
            self._running_time -= gone.running_time
            self._completions -= gone.completions
            self._expired_since_resum += 1
        if self._expired_since_resum >= RESUM_EVERY or not intervals:
            self._busy_s = math.fsum(i.busy_s for i in intervals)
            self._running_time = math.fsum(i.running_time for i in intervals)
            self._expired_since_resum = 0
        for times in (self._dispatches_s, self._arrivals_s):
            expired = bisect.bisect_left(times, cutoff)
            if expired:
                del times[:expired]
                self._arrival_scv = None
