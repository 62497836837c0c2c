"""Keeps the estimator current from Redis (key names: `bear.common.redis_keys`), on the service's event loop.

Four loops share the loop with the Estimate calls, which only ever read the estimator's memory:

- **subscription** to `bear:snapshots` (`bear:snapshots:db<N>` on database N > 0: channels span databases): every
  published snapshot is offered; a snapshot not yet adopted is replaced by a newer one of the same instance (only the
  latest matters). A snapshot the estimator cannot trust (its times not plausible, or more rows than the snapshotter
  writes: `admission.refusal`) is refused when offered, before any work on its rows, and counted with those the
  replay cannot use; the instance keeps the snapshot it has.
- **adoption**: the offered snapshots are adopted together. First, in one round trip, the dispatch records
  (`bear:dispatch:<request id>`) of residents the estimator has none for, found through the engine's request ids
  (`request_key`); then their remaining lengths (`RemainingLengths.resolve`, one call per model); then each snapshot
  is prepared for the replay, its eq. 12 coefficients (`batch_time`, their per-step and decode-attention terms
  scaled by the engine's recent speed against them, `step_time_ratio`, when known) and θ become the instance's
  calibration, and the instance's LPS measurements (`LpsTracker`) take it in. Redis or the predictor failing here costs precision
  (mean lengths, the stated fallback), never the snapshot.
- **resync**, at start and every `resync_interval_s`: the instances refreshed in `bear:instances` within
  `instances_window_s`, their registrations (instance → model) and latest snapshots (which also covers what the
  subscription missed); instances with neither for `forget_after_s` and not listed by discovery are forgotten. The
  LPS parameters are refreshed here too, so that the arrival rate of an instance gone quiet decays.
- **dispatch poll**, every `dispatch_poll_interval_s`: the request ids routed to each instance since its snapshot
  (`bear:dispatches:<id>`), and their records, which the replay adds as arrivals ahead of the query. A router also
  sends its latest dispatches along with each Estimate call (`record_dispatch`), so that a query routed right after
  another does not wait for the poll to see the first.

Every Redis call has a deadline (`redis_deadline_s`); a failing Redis is retried with back-off while the estimator
keeps answering from what it holds (snapshots then age into the LPS fallback). A value in Redis that does not decode
(a registration, a snapshot, a member that is not UTF-8) is skipped and counted, the others used; it is logged the
first time and every 100th time after (`bear.common.log_throttle`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from redis.exceptions import RedisError

from bear.common import redis_keys
from bear.common.redis_config import honour_cancellation
from bear.core.state import InvalidState
from bear.common.log_throttle import LogThrottle
from bear.common.messages import described
from bear.estimator.admission import RedisValues, refusal
from bear.estimator.estimation import MAX_CLOCK_AHEAD_S, Calibration, Dispatch, Estimator, supersedes
from bear.estimator.lps_tracker import LpsTracker
from bear.estimator.remaining import RemainingLengths, Rows
from bear.estimator.request_ids import router_request_id
from bear.estimator.wire import coefficients_from_message, dispatch_from_record
from bear.snapshotter.backoff import Backoff
from bear.v1 import calibration_pb2, router_pb2, snapshot_pb2

if TYPE_CHECKING:
    import redis.asyncio

logger = logging.getLogger("bear.estimator")

_REDIS_ERRORS = (RedisError, OSError, TimeoutError)
MISSING_DISPATCH_RETRY_S = 5.0  # a resident without a dispatch record is looked up again after this long
DISPATCH_LOOKBACK_S = 10.0  # dispatches read for an instance without a snapshot


@dataclass(frozen=True, slots=True)
class FeedSettings:
    resync_interval_s: float = 1.0
    dispatch_poll_interval_s: float = 0.05
    redis_deadline_s: float = 1.0
    forget_after_s: float = 60.0
    instances_window_s: float = redis_keys.INSTANCES_WINDOW_S
    lps_window_s: float = 60.0


@dataclass
class FeedStats:
    snapshots_received: int = 0
    snapshots_adopted: int = 0
    snapshots_rejected: int = 0  # refused (`admission.refusal`) or the replay cannot use them (InvalidState)
    undecodable_values: int = 0  # values and members read from Redis that were skipped: not ours, or not UTF-8
    dispatches_recorded: int = 0
    dispatches_unusable: int = 0  # records (from Redis or a caller) that cannot be a dispatch: a router's bug or skew
    redis_failures: int = 0
    resyncs: int = 0
    subscribed: bool = False
    last_resync_s: float = 0.0  # wall-clock time of the last successful resync (0: none yet)


@dataclass
class _Tracked:
    """What the feed keeps per instance besides the estimator's state."""

    lps: LpsTracker
    last_seen_s: float  # in Redis or on the channel
    batch_time: calibration_pb2.BatchTimeCoefficients | None = None
    step_time_ratio: float = 0.0  # the latest snapshot's; 0: unknown
    prefill_tokens_per_s: float | None = None  # the latest positive θ
    missing_dispatches: dict[str, float] = field(default_factory=dict)  # request key → when it was not found


class SnapshotFeed:
    def __init__(self, estimator: Estimator, client: redis.asyncio.Redis, remaining: RemainingLengths,
                 settings: FeedSettings = FeedSettings(), *,
                 request_key: Callable[[str], str] = router_request_id,
                 listed_instances: Callable[[], Mapping[str, str]] = dict,
                 clock: Callable[[], float] = time.time) -> None:
        self._estimator = estimator
        self._client = client
        self._channel = redis_keys.snapshots_channel(redis_keys.database_of(client))
        self._remaining = remaining
        self._settings = settings
        self._request_key = request_key
        self._listed = listed_instances  # instance id → model from discovery: known whatever Redis says
        self._clock = clock
        self._tracked: dict[str, _Tracked] = {}
        self._pending: dict[str, snapshot_pb2.InstanceSnapshot] = {}
        self._offered = asyncio.Event()
        self._resync_now = asyncio.Event()
        self.stats = FeedStats()
        self._values = RedisValues(self.stats, logger)
        self._refused = LogThrottle()  # by instance id
        self._unusable = LogThrottle()  # dispatch records, by instance id

    # The loops ----------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Runs every loop until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._subscribe_forever())
            group.create_task(self._adopt_forever())
            group.create_task(self._every(self._settings.resync_interval_s, self.resync_once, self._resync_now))
            group.create_task(self._every(self._settings.dispatch_poll_interval_s, self.poll_dispatches_once))

    async def _every(self, interval_s: float, step: Callable[[], Awaitable[None]],
                     wake: asyncio.Event | None = None) -> None:
        backoff = Backoff(base_s=max(interval_s, 0.05), cap_s=max(5.0, interval_s))
        while True:
            try:
                await step()
                backoff.succeeded()
                delay_s = interval_s
            except _REDIS_ERRORS as error:
                delay_s = self._redis_failed(backoff, step.__name__, error)
            except Exception:  # noqa: BLE001 - a bug must not stop the feed: log it, go on
                logger.exception("estimator feed: %s failed", step.__name__)
                delay_s = backoff.failed()
            honour_cancellation()
            if wake is None:
                await asyncio.sleep(delay_s)
                continue
            try:
                await asyncio.wait_for(wake.wait(), delay_s)
            except TimeoutError:
                pass
            wake.clear()

    async def _subscribe_forever(self) -> None:
        backoff = Backoff(base_s=0.1, cap_s=5.0)
        while True:
            pubsub = self._client.pubsub()
            try:
                await asyncio.wait_for(pubsub.subscribe(self._channel), self._settings.redis_deadline_s)
                self.stats.subscribed = True
                self._estimator.feed_cut_off = False
                if backoff.failures:
                    self._resync_now.set()  # what was published while the channel was down
                backoff.succeeded()
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        self._receive(message["data"])
                    honour_cancellation()
            except _REDIS_ERRORS as error:
                self.stats.subscribed = False
                self._estimator.feed_cut_off = True
                honour_cancellation()
                await asyncio.sleep(self._redis_failed(backoff, "subscription", error))
            except Exception:  # noqa: BLE001 - a bug or a failure no check foresaw must not end the feed for good
                self.stats.subscribed = False
                self._estimator.feed_cut_off = True
                logger.exception("estimator feed: the subscription failed")
                honour_cancellation()
                await asyncio.sleep(backoff.failed())
            finally:
                self.stats.subscribed = False
                try:
                    await asyncio.wait_for(pubsub.aclose(), self._settings.redis_deadline_s)
                except Exception:  # noqa: BLE001 - the connection is dropped either way
                    pass

    async def _adopt_forever(self) -> None:
        while True:
            await self._offered.wait()
            self._offered.clear()
            try:
                await self.adopt_pending()
            except Exception:  # noqa: BLE001 - a bug must not stop the feed
                logger.exception("estimator feed: adopting snapshots failed")

    # One pass of each (also what the tests drive) -----------------------------------------------------------------

    def offer(self, snapshot: snapshot_pb2.InstanceSnapshot) -> None:
        """Queues a snapshot for adoption (a newer one, or the same state read later, replaces it before then);
        refuses one `admission.refusal` finds fault with (the instance keeps what it has)."""
        instance_id = snapshot.instance_id
        if not instance_id:
            return
        self.stats.snapshots_received += 1
        now = self._clock()
        fault = refusal(snapshot, now)
        if fault is not None:
            self._reject(snapshot, "refused", fault)
            return
        pending = self._pending.get(instance_id)
        if pending is None or supersedes(snapshot, pending, now) or (
                snapshot.taken_at_s == pending.taken_at_s and snapshot.read_at_s > pending.read_at_s):
            self._pending[instance_id] = snapshot
        self._offered.set()

    async def adopt_pending(self) -> None:
        pending, self._pending = self._pending, {}
        now = self._clock()
        fresh = []
        for snapshot in pending.values():
            tracked = self._track(snapshot.instance_id, snapshot.model, now)
            tracked.last_seen_s = now
            current = self._estimator.snapshot(snapshot.instance_id)
            if current is None or supersedes(snapshot, current, now):
                fresh.append(snapshot)
                continue
            try:
                self._estimator.update_snapshot(snapshot, now)  # the same state, found current later
            except InvalidState as error:  # its times stopped being plausible since the offer (the clock went back)
                self._reject(snapshot, "rejected", str(error))
        if not fresh:
            return
        wanted = self._residents_without_dispatch(fresh, now)
        if wanted:  # most snapshots have none: their residents' records were read with an earlier snapshot
            try:
                await asyncio.wait_for(self._record_residents_dispatches(wanted, now), self._settings.redis_deadline_s)
            except _REDIS_ERRORS as error:
                self.stats.redis_failures += 1
                logger.debug("dispatch records of residents unavailable: %s", described(error))
        await self._remaining.resolve(self._resident_rows(fresh))
        for snapshot in fresh:
            self._adopt(snapshot, now)

    async def resync_once(self) -> None:
        now = self._clock()
        client, deadline_s = self._client, self._settings.redis_deadline_s
        raw_ids = await asyncio.wait_for(
            client.zrangebyscore(redis_keys.INSTANCES, now - self._settings.instances_window_s, "+inf"), deadline_s)
        ids = self._values.texts(raw_ids, redis_keys.INSTANCES)
        pipe = client.pipeline(transaction=False)
        for instance_id in ids:
            pipe.get(redis_keys.instance_key(instance_id))
            pipe.get(redis_keys.snapshot_key(instance_id))
        values = await asyncio.wait_for(pipe.execute(), deadline_s) if ids else []
        for instance_id, registration_value, snapshot_value in zip(ids, values[::2], values[1::2], strict=True):
            registration = self._values.message(snapshot_pb2.InstanceRegistration, registration_value,
                                                redis_keys.instance_key(instance_id), instance_id)
            snapshot = self._values.message(snapshot_pb2.InstanceSnapshot, snapshot_value,
                                            redis_keys.snapshot_key(instance_id), instance_id)
            if registration is None and snapshot is None:
                continue
            self._track(instance_id, registration.model if registration is not None else "", now).last_seen_s = now
            if snapshot is not None:
                self.offer(snapshot)
        for instance_id, model in self._listed().items():
            self._track(instance_id, model, now).last_seen_s = now
        self._forget_gone(now)
        for instance_id in self._tracked:
            self._refresh_calibration(instance_id, now)
        self.stats.resyncs += 1
        self.stats.last_resync_s = now

    async def poll_dispatches_once(self) -> None:
        ids = self._estimator.instance_ids()
        if not ids:
            return
        now, client, deadline_s = self._clock(), self._client, self._settings.redis_deadline_s
        pipe = client.pipeline(transaction=False)
        for instance_id in ids:
            snapshot = self._estimator.snapshot(instance_id)
            since_s = snapshot.taken_at_s if snapshot is not None else now - DISPATCH_LOOKBACK_S
            if not math.isfinite(since_s):  # Redis refuses the whole pipeline over one bound that is not a number
                since_s = now - DISPATCH_LOOKBACK_S
            pipe.zrangebyscore(redis_keys.dispatches_key(instance_id), since_s, "+inf")
        routed = await asyncio.wait_for(pipe.execute(), deadline_s)
        wanted = [(instance_id, request_id) for instance_id, request_ids in zip(ids, routed, strict=True)
                  for request_id in self._values.texts(request_ids, redis_keys.dispatches_key(instance_id))]
        wanted = [(i, r) for i, r in wanted if not self._estimator.has_dispatch(i, r)]
        if wanted:
            records = await asyncio.wait_for(client.mget([redis_keys.dispatch_key(r) for _, r in wanted]), deadline_s)
            for (instance_id, _), record in zip(wanted, records, strict=True):
                if record is not None:
                    self._record(record, instance_id)

    # Adoption -------------------------------------------------------------------------------------------------------

    def _residents_without_dispatch(self, snapshots: list[snapshot_pb2.InstanceSnapshot], now: float
                                    ) -> list[tuple[str, str]]:
        """(instance, request key) of the residents the estimator has no dispatch record for (and has not looked
        for in the last MISSING_DISPATCH_RETRY_S). Each instance's list of records looked for in vain keeps only
        its residents of now: requests not routed by BEAR come and go for as long as the instance lives."""
        wanted: list[tuple[str, str]] = []
        for snapshot in snapshots:  # at most one per instance
            instance_id = snapshot.instance_id
            tracked = self._tracked[instance_id]
            missing, tracked.missing_dispatches = tracked.missing_dispatches, {}
            for request in (*snapshot.running, *snapshot.waiting):
                key = self._request_key(request.request_id)
                if self._estimator.has_dispatch(instance_id, key):
                    continue
                looked_at = missing.get(key)
                if looked_at is not None and now - looked_at < MISSING_DISPATCH_RETRY_S:
                    tracked.missing_dispatches[key] = looked_at
                    continue
                wanted.append((instance_id, key))
        return wanted

    async def _record_residents_dispatches(self, wanted: list[tuple[str, str]], now: float) -> None:
        """Reads the dispatch records of `wanted` residents in one round trip."""
        records = await self._client.mget([redis_keys.dispatch_key(key) for _, key in wanted])
        for (instance_id, key), record in zip(wanted, records, strict=True):
            tracked = self._tracked.get(instance_id)  # None: forgotten meanwhile
            if tracked is None:
                continue
            if record is None or not self._record(record, instance_id):
                tracked.missing_dispatches[key] = now
            else:
                tracked.missing_dispatches.pop(key, None)

    def _resident_rows(self, snapshots: list[snapshot_pb2.InstanceSnapshot]) -> dict[str, Rows]:
        parts: dict[str, list[Rows]] = {}
        for snapshot in snapshots:
            if not self._estimator.knows(snapshot.instance_id):
                continue
            for model, rows in self._estimator.resident_lengths(snapshot).items():
                parts.setdefault(model, []).append(rows)
        return {model: tuple(np.concatenate(column) for column in zip(*rows))  # type: ignore[misc]
                for model, rows in parts.items()}

    def _adopt(self, snapshot: snapshot_pb2.InstanceSnapshot, now: float) -> None:
        instance_id = snapshot.instance_id
        tracked = self._tracked.get(instance_id)
        if tracked is None:  # forgotten while its residents' lengths were resolved
            return
        try:
            adopted = self._estimator.update_snapshot(snapshot, now, self._remaining.lookup)
        except (InvalidState, ValueError) as error:
            self._reject(snapshot, "rejected", str(error))
            return
        if not adopted:
            return
        self.stats.snapshots_adopted += 1
        self._refused.ok(instance_id)
        tracked.lps.observe_snapshot(snapshot)
        if snapshot.HasField("batch_time") and coefficients_from_message(snapshot.batch_time) is not None:
            tracked.batch_time = snapshot.batch_time
            tracked.step_time_ratio = snapshot.step_time_ratio
            if 0 < snapshot.batch_time.prefill_tokens_per_s < math.inf:  # 0: not measured yet
                tracked.prefill_tokens_per_s = snapshot.batch_time.prefill_tokens_per_s
        self._refresh_calibration(instance_id, now)

    def _refresh_calibration(self, instance_id: str, now: float) -> None:
        tracked = self._tracked[instance_id]
        coefficients = None if tracked.batch_time is None else coefficients_from_message(tracked.batch_time)
        if coefficients is None:
            return
        lps = tracked.lps.parameters(tracked.prefill_tokens_per_s, now)
        self._estimator.set_calibration(instance_id, Calibration(coefficients.at_speed(tracked.step_time_ratio),
                                                                 tracked.prefill_tokens_per_s, lps))

    # Instances and dispatches ---------------------------------------------------------------------------------------

    def _track(self, instance_id: str, model: str, now: float) -> _Tracked:
        tracked = self._tracked.get(instance_id)
        if tracked is None:
            tracked = self._tracked[instance_id] = _Tracked(LpsTracker(self._settings.lps_window_s), now)
        if model or not self._estimator.knows(instance_id):
            self._estimator.add_instance(instance_id, model)
        return tracked

    def _forget_gone(self, now: float) -> None:
        listed = self._listed()
        for instance_id, tracked in list(self._tracked.items()):
            if instance_id not in listed and now - tracked.last_seen_s > self._settings.forget_after_s:
                logger.info("instance %s gone from Redis for %.0f s: forgotten", instance_id,
                            now - tracked.last_seen_s)
                del self._tracked[instance_id]
                self._pending.pop(instance_id, None)
                self._estimator.remove_instance(instance_id)

    def record_dispatch(self, record: router_pb2.DispatchRecord) -> bool:
        """Records a dispatch a router sent along with its Estimate call (the same record reaches Redis later and is
        then skipped); False if it is unusable, already known, or to an instance the estimator does not know."""
        if not record.instance_id or not self._estimator.knows(record.instance_id):
            return False
        if self._estimator.has_dispatch(record.instance_id, record.request_id):
            return False
        return self._adopt_dispatch(record, record.instance_id)

    def _record(self, payload: bytes, instance_id: str) -> bool:
        """Records a dispatch read from Redis; False if the record is unusable."""
        if not self._estimator.knows(instance_id):
            return False
        try:
            record = router_pb2.DispatchRecord.FromString(payload)
        except Exception:  # noqa: BLE001 - google.protobuf.message.DecodeError: a foreign value under our key
            self.stats.undecodable_values += 1
            return False
        return self._adopt_dispatch(record, instance_id)

    def _adopt_dispatch(self, record: router_pb2.DispatchRecord, instance_id: str) -> bool:
        dispatch: Dispatch | None = dispatch_from_record(record, instance_id, self._estimator.model(instance_id))
        if dispatch is None or dispatch.dispatched_at_s > self._clock() + MAX_CLOCK_AHEAD_S:
            self.stats.dispatches_unusable += 1
            if self._unusable.should_log(instance_id):
                logger.warning("dispatch record of %r to instance %s unusable (%d times): no request id, no prompt "
                               "tokens, a length that is not a number, or a time that is not one or is more than "
                               "%g s ahead of this clock (the replay goes on without it)", record.request_id[:64],
                               instance_id, self._unusable.count(instance_id), MAX_CLOCK_AHEAD_S)
            return False
        if not self._estimator.knows(dispatch.instance_id):
            return False
        self._estimator.record_dispatch(dispatch)
        tracked = self._tracked.get(dispatch.instance_id)
        if tracked is not None:
            tracked.lps.observe_dispatch(dispatch.dispatched_at_s)
        self.stats.dispatches_recorded += 1
        return True

    def _reject(self, snapshot: snapshot_pb2.InstanceSnapshot, verb: str, why: str) -> None:
        """Counts a snapshot the instance does not adopt (it keeps the one it has); logs the first since the
        instance's last adopted one, then every 100th."""
        self.stats.snapshots_rejected += 1
        instance_id = snapshot.instance_id
        self._estimator.note_refused(instance_id, why)
        if self._refused.should_log(instance_id):
            logger.warning("snapshot %d of %s %s (%d since its last adopted one): %s", snapshot.sequence_number,
                           instance_id, verb, self._refused.count(instance_id), why)

    def _receive(self, payload: bytes) -> None:
        try:
            snapshot = snapshot_pb2.InstanceSnapshot.FromString(payload)
        except Exception:  # noqa: BLE001 - DecodeError: not a snapshot; skip it
            logger.debug("undecodable message on %s", self._channel)
            return
        self.offer(snapshot)

    def _redis_failed(self, backoff: Backoff, what: str, error: BaseException) -> float:
        self.stats.redis_failures += 1
        delay_s = backoff.failed()
        if backoff.failures == 1 or backoff.failures % 20 == 0:
            logger.warning("Redis unavailable for the %s (%d failures, retrying in %.2f s): %s", what,
                           backoff.failures, delay_s, described(error))
        return delay_s

    # Readers --------------------------------------------------------------------------------------------------------

    def instance_ids(self) -> list[str]:
        return list(self._tracked)

