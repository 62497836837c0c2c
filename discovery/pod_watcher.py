"""One pool's pods, followed with the Kubernetes list + watch protocol in a daemon thread.

    loop until stopped:
        list the pool's pods (label selector)      → the routable ones become the pool's instances; remember the
                                                      list's resourceVersion
        watch from that resourceVersion            → apply each ADDED / MODIFIED / DELETED event; BOOKMARK events
                                                      only move the resourceVersion; when the server ends the watch
                                                      (timeoutSeconds), watch again from the last resourceVersion
        410 Gone (the resourceVersion is too old, as an HTTP status or an ERROR event), any other API or
        connection error                           → wait (exponential back-off with full jitter), then list again

Invariant: after every applied list or event, the table holds exactly the routable pods (bear.discovery.pods) among
those the watcher has seen, so a pod that stops being ready stops being routed to within one event. The back-off is
reset only by a watch that delivered an event or ran for at least half its timeout, so a server that lists but cannot
watch is not hammered.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kubernetes import client, watch

from bear.discovery.instances import Instance, InstanceTable
from bear.discovery.pods import instance_of, is_routable
from bear.discovery.pools import PoolSpec
from bear.snapshotter.backoff import Backoff

logger = logging.getLogger("bear.discovery")

CONNECT_TIMEOUT_S = 5.0
LIST_TIMEOUT_S = 30.0
WATCH_READ_MARGIN_S = 30.0  # a watch whose server stays silent this long past its timeoutSeconds is dead
HTTP_GONE = 410


class WatchEndedEarly(RuntimeError):
    """A watch that ended long before its timeout with nothing in it: treated as an error, so retries back off."""


class PodWatcher:
    def __init__(self, api: client.CoreV1Api, namespace: str, pool: PoolSpec, table: InstanceTable,
                 watch_timeout_s: float, backoff: Backoff):
        self.pool = pool
        self.synced = threading.Event()  # set once the first list has been applied
        self._api, self._namespace, self._table = api, namespace, table
        self._watch_timeout_s = watch_timeout_s
        self._backoff = backoff
        self._stopping = threading.Event()
        self._watch: watch.Watch | None = None
        self._routable: dict[str, Instance] = {}
        self._thread = threading.Thread(target=self._run, name=f"bear-discovery-{pool.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        deadline_s = time.monotonic() + timeout_s
        while self._thread.is_alive() and time.monotonic() < deadline_s:
            current = self._watch
            if current is not None:
                current.stop()  # shuts the streaming socket down (once its response has begun): the read ends
            self._thread.join(0.05)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                resource_version = self._list()
                while not self._stopping.is_set():
                    resource_version = self._watch_from(resource_version)
            except Exception as error:  # the watch must outlive every API or network failure
                if self._stopping.is_set():
                    break
                delay_s = self._backoff.failed()
                if isinstance(error, client.ApiException) and error.status == HTTP_GONE:
                    logger.info("pool %s: resource version expired, listing again", self.pool.name)
                else:
                    logger.warning("pool %s: pod watch failed (%s); listing again in %.2f s", self.pool.name,
                                   _describe(error), delay_s)
                self._stopping.wait(delay_s)

    def _list(self) -> str:
        pods = self._api.list_namespaced_pod(self._namespace, label_selector=self.pool.label_selector,
                                             _request_timeout=(CONNECT_TIMEOUT_S, LIST_TIMEOUT_S))
        self._routable = {pod.metadata.name: instance_of(pod, self.pool) for pod in pods.items if is_routable(pod)}
        self._table.set_pool(self.pool.name, self._routable)
        self.synced.set()
        return str(pods.metadata.resource_version)

    def _watch_from(self, resource_version: str) -> str:
        """Applies events until the server ends the watch; returns the last resourceVersion seen."""
        self._watch = current = watch.Watch()
        stream = current.stream(
            self._api.list_namespaced_pod, self._namespace, label_selector=self.pool.label_selector,
            resource_version=resource_version, allow_watch_bookmarks=True,
            timeout_seconds=max(1, int(self._watch_timeout_s)),
            _request_timeout=(CONNECT_TIMEOUT_S, self._watch_timeout_s + WATCH_READ_MARGIN_S))
        started_s, received = time.monotonic(), False
        try:
            for event in stream:
                resource_version = self._apply(event) or resource_version
                received = True
                self._backoff.succeeded()
                if self._stopping.is_set():
                    break
        finally:
            stream.close()
            self._watch = None
        if not received and not self._stopping.is_set() and time.monotonic() - started_s < self._watch_timeout_s / 2:
            raise WatchEndedEarly("the server ended the watch early without an event")
        self._backoff.succeeded()
        return resource_version

    def _apply(self, event: dict[str, Any]) -> str | None:
        if event["type"] == "BOOKMARK":
            return str(event["raw_object"]["metadata"]["resourceVersion"])
        pod = event["object"]
        name = pod.metadata.name
        if event["type"] != "DELETED" and is_routable(pod):
            self._routable[name] = instance_of(pod, self.pool)
        else:
            self._routable.pop(name, None)
        self._table.set_pool(self.pool.name, self._routable)
        return str(pod.metadata.resource_version)


def _describe(error: Exception) -> str:
    if isinstance(error, client.ApiException):
        return f"HTTP {error.status} {error.reason}"
    return f"{type(error).__name__}: {error}"
