"""Kubernetes discovery: every pool's ready pods, one `PodWatcher` thread per pool, in one `InstanceTable`.

A pool without a selector is not looked up in the API: its static instances (pools file) are used as they are, so a
cluster pool and an external server can be routed over together. In a pod, the client authenticates with the pod's
service account (the chart's Role allows get/list/watch on pods, nothing else); elsewhere with the kubeconfig.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping

from kubernetes import client, config

from bear.discovery.instances import Instance, InstanceTable, Listener
from bear.discovery.pod_watcher import ANSWER_TIMEOUT_S, STOP_WAIT_S, PodWatcher
from bear.discovery.pools import PoolSpec
from bear.snapshotter.backoff import Backoff

logger = logging.getLogger("bear.discovery")


def load_api_client() -> client.ApiClient:
    """The pod's service account when running in a cluster, else the current kubeconfig context."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


class KubernetesDiscovery:
    def __init__(self, pools: tuple[PoolSpec, ...], namespace: str, api_client: client.ApiClient | None = None, *,
                 watch_timeout_s: float = 300.0, backoff_base_s: float = 0.2, backoff_cap_s: float = 10.0):
        """`api_client`: the connection to use (owned by the caller); None: `load_api_client()` at start, closed at
        stop."""
        self.pools = pools
        self._namespace = namespace
        self._api_client, self._owns_client = api_client, api_client is None
        self._watch_timeout_s = watch_timeout_s
        self._backoff = (backoff_base_s, backoff_cap_s)
        self._table = InstanceTable()
        self._watchers: list[PodWatcher] = []

    def start(self) -> None:
        if self._api_client is None:
            self._api_client = load_api_client()
        api = client.CoreV1Api(self._api_client)
        for pool in self.pools:
            if not pool.selector:
                self._table.set_pool(pool.name, {
                    static.instance_id: Instance(static.instance_id, pool.name, pool.model, static.endpoint,
                                                 static.snapshotter_address)
                    for static in pool.instances})
                continue
            backoff = Backoff(*self._backoff, rng=random.Random())
            self._watchers.append(PodWatcher(api, self._namespace, pool, self._table, self._watch_timeout_s, backoff))
        for watcher in self._watchers:
            watcher.start()

    def stop(self) -> None:
        """Stops every watcher at once and waits for their threads, STOP_WAIT_S at most in all."""
        for watcher in self._watchers:
            watcher.request_stop()
        deadline_s = time.monotonic() + STOP_WAIT_S
        waiting = [watcher.pool.name for watcher in self._watchers
                   if not watcher.join(max(0.0, deadline_s - time.monotonic()))]
        if waiting:
            logger.info("pool(s) %s: stopped while waiting for the API server's answer; the watcher thread ends when "
                        "it comes or the request times out (%.0f s per try), and applies nothing", ", ".join(waiting),
                        ANSWER_TIMEOUT_S)
        self._watchers.clear()
        if self._owns_client and self._api_client is not None:
            self._api_client.close()
            self._api_client = None

    def wait_until_synced(self, timeout_s: float) -> bool:
        deadline_s = time.monotonic() + timeout_s
        return all(watcher.synced.wait(max(0.0, deadline_s - time.monotonic())) for watcher in self._watchers)

    def instances(self) -> Mapping[str, Instance]:
        return self._table.instances()

    def add_listener(self, listener: Listener, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._table.add_listener(listener, loop)
