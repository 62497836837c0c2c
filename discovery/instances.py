"""Ready instances and their changes: what every discovery source maintains and what its users read.

Threading: a source updates its `InstanceTable` from its own thread(s) (one watcher thread per pool for Kubernetes).
Readers call `instances()` from any thread: it returns an immutable snapshot, swapped whole on every change, so a
reader never takes a lock and never sees half a change. Listeners get each `Change` after it is applied, one at a
time and in order (never concurrently), on the source's thread; an asyncio service registers with its event loop
(`add_listener(callback, loop=loop)`) and is then called on that loop through `call_soon_threadsafe`. A listener that
raises is logged and keeps its registration.
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
    updated: tuple[Instance, ...]  # same id, new endpoint or address (a pod that came back with a new IP)
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
        self._lock = threading.Lock()  # guards _by_pool and _snapshot
        self._notify_lock = threading.Lock()  # one change delivered at a time, in order
        self._by_pool: dict[str, dict[str, Instance]] = {}
        self._snapshot: Mapping[str, Instance] = MappingProxyType({})
        self._listeners: list[tuple[Listener, asyncio.AbstractEventLoop | None]] = []

    def instances(self) -> Mapping[str, Instance]:
        return self._snapshot

    def add_listener(self, listener: Listener, loop: asyncio.AbstractEventLoop | None = None) -> None:
        with self._lock:
            self._listeners.append((listener, loop))

    def set_pool(self, pool: str, ready: Mapping[str, Instance]) -> Change | None:
        """Makes `ready` the pool's instances; notifies the listeners and returns the change, if anything changed."""
        with self._notify_lock:
            with self._lock:
                before = self._by_pool.get(pool, {})
                added = tuple(ready[i] for i in sorted(ready.keys() - before.keys()))
                removed = tuple(before[i] for i in sorted(before.keys() - ready.keys()))
                updated = tuple(ready[i] for i in sorted(ready.keys() & before.keys()) if ready[i] != before[i])
                if not (added or removed or updated):
                    return None
                self._by_pool[pool] = dict(ready)
                merged = {i: instance for instances in self._by_pool.values() for i, instance in instances.items()}
                self._snapshot = MappingProxyType(merged)
                change = Change(added, removed, updated, self._snapshot)
                listeners = list(self._listeners)
            for listener, loop in listeners:
                self._deliver(listener, loop, change)
            return change

    @staticmethod
    def _deliver(listener: Listener, loop: asyncio.AbstractEventLoop | None, change: Change) -> None:
        try:
            if loop is None:
                listener(change)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(listener, change)
        except Exception:  # a listener's bug must not stop discovery
            logger.exception("discovery listener %r failed", listener)
