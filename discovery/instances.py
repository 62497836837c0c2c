"""Ready instances and their changes: what every discovery source maintains and what its users read.

Threading: a source updates its `InstanceTable` from its own thread(s) (one watcher thread per pool for Kubernetes).
Readers call `instances()` from any thread: it returns an immutable snapshot, swapped whole on every change, so a
reader never takes a lock and never sees half a change. Listeners get each `Change` after it is applied, one at a
time and in order (never concurrently), on the source's thread; an asyncio service registers with its event loop
(`add_listener(callback, loop=loop)`) and is then called on that loop through `call_soon_threadsafe`. A listener that
raises is logged and keeps its registration.

One id, one pool: each pool claims the instances it found, and an id claimed by two pools (two pools' selectors
match one pod, a pod is named like another pool's static instance) belongs to the pool that claimed it first, for as
long as that pool claims it. The other claim is ignored, with one WARNING per id and pair of pools, and takes the id
over (an `updated` change) as soon as the holder lets it go. So `instances` always has every id once, and every
change is the diff between two of its snapshots.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from bear.discovery.pools import PoolSpec

logger = logging.getLogger("bear.discovery")


@dataclass(frozen=True, slots=True)
class Instance:
    """One ready model instance (a vLLM server with its snapshotter sidecar)."""

    instance_id: str  # the pod name (Kubernetes) or the pools file's id (static)
    pool: str
    model: str
    endpoint: str  # where its OpenAI-compatible server answers, e.g. http://10.0.0.7:8000
    snapshotter_address: str  # host:port of its snapshotter's gRPC server ("" if unknown)


@dataclass(frozen=True, slots=True)
class Change:
    """What one update did. `instances` is the whole ready set after it."""

    added: tuple[Instance, ...]
    removed: tuple[Instance, ...]
    updated: tuple[Instance, ...]  # same id, new endpoint or address (a pod back with a new IP), or another pool
    instances: Mapping[str, Instance]


Listener = Callable[[Change], None]


class Discovery(Protocol):
    """What the router and the estimator use, whichever the source."""

    pools: tuple[PoolSpec, ...]

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def wait_until_synced(self, timeout_s: float) -> bool:
        """True once every pool has been listed at least once (at once for a static source)."""
        ...

    def instances(self) -> Mapping[str, Instance]:
        """The ready instances now, by id (an immutable snapshot)."""
        ...

    def add_listener(self, listener: Listener, loop: asyncio.AbstractEventLoop | None = None) -> None: ...


class InstanceTable:
    """The ready instances of every pool, replaced pool by pool, with change notifications."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards everything below but the listeners' delivery
        self._notify_lock = threading.Lock()  # one change delivered at a time, in order
        self._claims: dict[str, dict[str, Instance]] = {}  # pool → the instances it found ready
        self._claimants: dict[str, list[str]] = {}  # instance id → the pools claiming it, the holder first
        self._warned: dict[str, set[tuple[str, str]]] = {}  # instance id → (holder, ignored pool) pairs logged
        self._snapshot: Mapping[str, Instance] = MappingProxyType({})
        self._listeners: list[tuple[Listener, asyncio.AbstractEventLoop | None]] = []

    def instances(self) -> Mapping[str, Instance]:
        return self._snapshot

    def add_listener(self, listener: Listener, loop: asyncio.AbstractEventLoop | None = None) -> None:
        with self._lock:
            self._listeners.append((listener, loop))

    def set_pool(self, pool: str, ready: Mapping[str, Instance]) -> Change | None:
        """Makes `ready` the pool's claims; notifies the listeners and returns the change, if the ready set changed."""
        with self._notify_lock:
            with self._lock:
                change, ignored = self._replace_claims(pool, ready)
                listeners = list(self._listeners)
            for instance_id, holder in ignored:
                logger.warning("instance %s is claimed by pools %s and %s: pool %s keeps it (its claim came first), "
                               "pool %s's claim is ignored while it does (two pools' selectors match the pod, or a "
                               "pod is named like a static instance)", instance_id, holder, pool, holder, pool)
            if change is not None:
                for listener, loop in listeners:
                    self._deliver(listener, loop, change)
            return change

    def _replace_claims(self, pool: str, ready: Mapping[str, Instance]) -> tuple[Change | None, list[tuple[str, str]]]:
        """The change, and the (id, holder) claims of `pool` newly ignored. Invariant: the snapshot holds every claimed
        id once, as its holder (its earliest claimant still claiming it) found it."""
        before = self._claims.get(pool, {})
        touched = sorted(i for i in ready.keys() | before.keys() if ready.get(i) != before.get(i))
        self._claims[pool] = dict(ready)
        merged = dict(self._snapshot)
        added, removed, updated, ignored = [], [], [], []
        for instance_id in touched:
            claimed = instance_id in ready
            holder = self._update_claimants(instance_id, pool, claimed)
            if claimed and holder != pool and self._first_time_ignored(instance_id, holder, pool):
                ignored.append((instance_id, holder))
            old = merged.pop(instance_id, None)
            new = self._claims[holder][instance_id] if holder is not None else None
            if new is not None:
                merged[instance_id] = new
            if old is None and new is not None:
                added.append(new)
            elif old is not None and new is None:
                removed.append(old)
            elif old != new:
                updated.append(new)
        if not (added or removed or updated):
            return None, ignored
        self._snapshot = MappingProxyType(merged)
        return Change(tuple(added), tuple(removed), tuple(updated), self._snapshot), ignored

    def _update_claimants(self, instance_id: str, pool: str, claimed: bool) -> str | None:
        """Records whether `pool` claims the id; returns the id's holder (the earliest claimant still claiming)."""
        claimants = self._claimants.setdefault(instance_id, [])
        if claimed and pool not in claimants:
            claimants.append(pool)
        elif not claimed and pool in claimants:
            claimants.remove(pool)
        if not claimants:
            del self._claimants[instance_id]
            self._warned.pop(instance_id, None)
            return None
        return claimants[0]

    def _first_time_ignored(self, instance_id: str, holder: str, pool: str) -> bool:
        """True the first time `pool`'s claim on the id is ignored for `holder` (while the id stays claimed)."""
        warned = self._warned.setdefault(instance_id, set())
        if (holder, pool) in warned:
            return False
        warned.add((holder, pool))
        return True

    @staticmethod
    def _deliver(listener: Listener, loop: asyncio.AbstractEventLoop | None, change: Change) -> None:
        try:
            if loop is None:
                listener(change)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(listener, change)
        except Exception:  # a listener's bug must not stop discovery
            logger.exception("discovery listener %r failed", listener)
