"""Publishing one instance to Redis (names in `bear.common.redis_keys`), from a thread of its own.

Offers never block: the poll loop hands over the latest snapshot or fit and goes back to reading the engine. The
publishing thread sends the latest of each (an older one still pending is dropped: only the latest matters), with
the key's TTL, the snapshot also on the pub/sub channel. Every heartbeat it refreshes the registration, the instance's
entry in the set of instances, and the coefficients. A registration withdrawn (the engine is gone) is deleted with
the instance's snapshot and its entry in the set at once, so that routers stop sending it queries, and no longer
refreshed. When Redis fails, the thread retries with back-off; offers keep replacing what is pending meanwhile, so it
resumes with the latest state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from bear.common import redis_keys
from bear.common.messages import described
from bear.snapshotter.backoff import Backoff
from bear.v1 import calibration_pb2, snapshot_pb2

if TYPE_CHECKING:
    import redis

logger = logging.getLogger("bear.snapshotter")


class RedisPublisher:
    def __init__(self, client: redis.Redis, instance_id: str, ttl_s: float, heartbeat_s: float,
                 backoff: Backoff | None = None, clock: Callable[[], float] = time.time):
        self._client = client
        self._channel = redis_keys.snapshots_channel(redis_keys.database_of(client))
        self._instance_id = instance_id
        self._ttl_ms = int(ttl_s * 1000)
        self._heartbeat_s = heartbeat_s
        self._backoff = backoff or Backoff()
        self._clock = clock
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._snapshot: snapshot_pb2.InstanceSnapshot | None = None  # pending
        self._coefficients: calibration_pb2.BatchTimeCoefficients | None = None  # latest (resent every heartbeat)
        self._coefficients_pending = False
        self._registration: snapshot_pb2.InstanceRegistration | None = None
        self._withdrawal_pending = False
        self._heartbeat_due_at = 0.0
        self.num_snapshots_published = 0
        self.num_failures = 0
        self.last_error: str | None = None

    # Offers (any thread; never block) -----------------------------------------------------------------------------

    def offer_snapshot(self, snapshot: snapshot_pb2.InstanceSnapshot) -> None:
        with self._wake:
            self._snapshot = snapshot
            self._wake.notify()

    def offer_coefficients(self, coefficients: calibration_pb2.BatchTimeCoefficients) -> None:
        with self._wake:
            self._coefficients, self._coefficients_pending = coefficients, True
            self._wake.notify()

    def set_registration(self, registration: snapshot_pb2.InstanceRegistration) -> None:
        """The registration to refresh every heartbeat (sent at once)."""
        with self._wake:
            self._registration, self._heartbeat_due_at = registration, 0.0
            self._withdrawal_pending = False
            self._wake.notify()

    def withdraw_registration(self) -> None:
        """The instance is gone: its registration, snapshot and entry in the set of instances are deleted (at once,
        and again after a Redis failure) and no longer refreshed, until `set_registration` names the next engine."""
        with self._wake:
            self._registration, self._snapshot, self._withdrawal_pending = None, None, True
            self._wake.notify()

    # The publishing thread ----------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bear-snapshot-publisher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0, *, withdraw: bool = False) -> None:
        """Ends the publishing thread; with `withdraw`, then deletes the instance's registration, snapshot and entry
        in the set of instances once (the sidecar is going away: routers drop the instance now, not when its TTL runs
        out, and a new pool under the same ids is not mistaken for it). A Redis failure there is logged, not raised."""
        with self._wake:
            self._stopping = True
            registered = self._registration is not None
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if withdraw and registered:
            try:
                self._withdraw()
            except Exception as error:  # noqa: BLE001 - redis.RedisError, OSError: the TTL removes it in time
                logger.warning("instance %s not withdrawn from Redis at shutdown (%s): it expires with its TTL",
                               self._instance_id, described(error))

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._has_work():
                    self._wake.wait(None if self._registration is None else self._heartbeat_due_at - self._clock())
                if self._stopping:
                    return
                snapshot, self._snapshot = self._snapshot, None
                coefficients_pending, self._coefficients_pending = self._coefficients_pending, False
                heartbeat = self._registration is not None and self._clock() >= self._heartbeat_due_at
                withdrawal, self._withdrawal_pending = self._withdrawal_pending, False
            try:
                if withdrawal:
                    self._withdraw()
                self._send(snapshot, coefficients_pending, heartbeat)
            except Exception as error:  # noqa: BLE001 - redis.RedisError, OSError: retry with back-off
                with self._wake:
                    self._withdrawal_pending = self._withdrawal_pending or (withdrawal and self._registration is None)
                self._failed(error, snapshot, coefficients_pending)
                continue
            if self._backoff.failures:
                logger.info("Redis reachable again after %d failed attempts", self._backoff.failures)
            self._backoff.succeeded()
            self.last_error = None
            self.num_snapshots_published += snapshot is not None
            if heartbeat:
                self._heartbeat_due_at = self._clock() + self._heartbeat_s

    def _has_work(self) -> bool:
        return (self._snapshot is not None or self._coefficients_pending or self._withdrawal_pending
                or (self._registration is not None and self._clock() >= self._heartbeat_due_at))

    def _withdraw(self) -> None:
        instance_id = self._instance_id
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(redis_keys.instance_key(instance_id), redis_keys.snapshot_key(instance_id))
        pipe.zrem(redis_keys.INSTANCES, instance_id)
        pipe.execute()
        logger.info("instance %s withdrawn from Redis", instance_id)

    def _send(self, snapshot: snapshot_pb2.InstanceSnapshot | None, coefficients_pending: bool,
              heartbeat: bool) -> None:
        instance_id, ttl_ms = self._instance_id, self._ttl_ms
        pipe = self._client.pipeline(transaction=False)
        if snapshot is not None:
            payload = snapshot.SerializeToString()
            pipe.set(redis_keys.snapshot_key(instance_id), payload, px=ttl_ms)
            pipe.publish(self._channel, payload)
        coefficients = self._coefficients
        if coefficients is not None and (coefficients_pending or heartbeat):
            pipe.set(redis_keys.coefficients_key(instance_id), coefficients.SerializeToString(), px=ttl_ms)
        if heartbeat and self._registration is not None:
            now = self._clock()
            registration = snapshot_pb2.InstanceRegistration()
            registration.CopyFrom(self._registration)
            registration.registered_at_s = now
            pipe.set(redis_keys.instance_key(instance_id), registration.SerializeToString(), px=ttl_ms)
            pipe.zadd(redis_keys.INSTANCES, {instance_id: now})
        pipe.execute()

    def _failed(self, error: Exception, snapshot: snapshot_pb2.InstanceSnapshot | None,
                coefficients_pending: bool) -> None:
        self.num_failures += 1
        self.last_error = described(error)
        delay_s = self._backoff.failed()
        if self._backoff.failures == 1 or self._backoff.failures % 20 == 0:
            logger.warning("Redis unavailable (%d failed attempts, retrying in %.2f s): %s", self._backoff.failures,
                           delay_s, described(error))
        with self._wake:
            if self._snapshot is None:  # nothing newer arrived: retry this one
                self._snapshot = snapshot
            self._coefficients_pending = self._coefficients_pending or coefficients_pending
            if not self._stopping:
                self._wake.wait_for(lambda: self._stopping, timeout=delay_s)
