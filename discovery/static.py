"""Static discovery (the local default): the pools file's instances, all of them ready, for as long as it runs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping

from bear.discovery.instances import Instance, InstanceTable, Listener
from bear.discovery.pools import PoolSpec


class StaticDiscovery:
    def __init__(self, pools: tuple[PoolSpec, ...]):
        self.pools = pools
        self._table = InstanceTable()
        self._started = threading.Event()

    def start(self) -> None:
        for pool in self.pools:
            self._table.set_pool(pool.name, {
                static.instance_id: Instance(static.instance_id, pool.name, pool.model, static.endpoint,
                                             static.snapshotter_address)
                for static in pool.instances})
        self._started.set()

    def stop(self) -> None:
        pass

    def wait_until_synced(self, timeout_s: float) -> bool:
        return self._started.wait(timeout_s)

    def instances(self) -> Mapping[str, Instance]:
        return self._table.instances()

    def add_listener(self, listener: Listener, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._table.add_listener(listener, loop)
