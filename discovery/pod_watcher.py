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

Stopping: `request_stop()` shuts the open watch's connection down, so its read ends at once. A list or a new watch
the server has not answered yet cannot be interrupted (the client exposes no connection before the answer): the
thread ends when the answer comes or the request times out (ANSWER_TIMEOUT_S per try, after CONNECT_TIMEOUT_S to
connect), and applies nothing once stopping.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
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
ANSWER_TIMEOUT_S = 30.0  # how long a list, or a new watch, may wait for the server's answer
WATCH_READ_MARGIN_S = 30.0  # a watch whose server stays silent this long past its timeoutSeconds is dead
STOP_WAIT_S = 1.0  # how long stopping waits for the threads; only an unanswered request outlasts it
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
        self._response: Any = None  # the open watch's HTTP response (urllib3), from the server's answer on
        self._routable: dict[str, Instance] = {}
        self._thread = threading.Thread(target=self._run, name=f"bear-discovery-{pool.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        """Returns at once: the thread stops, at once unless it waits for an answer (see the module's doc)."""
        self._stopping.set()
        _shut_down(self._response)

    def join(self, timeout_s: float) -> bool:
        """True once the thread has ended."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def stop(self, timeout_s: float = STOP_WAIT_S) -> bool:
        self.request_stop()
        return self.join(timeout_s)

    def _run(self) -> None:
        while not self._stopping.is_set():
            doing = "listing"
            try:
                resource_version = self._list()
                doing = "watching"
                while not self._stopping.is_set():
                    resource_version = self._watch_from(resource_version)
            except Exception as error:  # the watch must outlive every API or network failure
                if self._stopping.is_set():
                    break
                delay_s = self._backoff.failed()
                if isinstance(error, client.ApiException) and error.status == HTTP_GONE:
                    logger.info("pool %s: resource version expired, listing again", self.pool.name)
                else:
                    logger.warning("pool %s: %s pods in namespace %s failed (%s); listing again in %.2f s",
                                   self.pool.name, doing, self._namespace, _describe(error), delay_s)
                self._stopping.wait(delay_s)

    def _list(self) -> str:
        pods = self._api.list_namespaced_pod(self._namespace, label_selector=self.pool.label_selector,
                                             _request_timeout=(CONNECT_TIMEOUT_S, ANSWER_TIMEOUT_S))
        if self._stopping.is_set():  # stopped while the server was answering: apply nothing more
            return str(pods.metadata.resource_version)
        self._routable = {pod.metadata.name: instance_of(pod, self.pool) for pod in pods.items if is_routable(pod)}
        self._table.set_pool(self.pool.name, self._routable)
        self.synced.set()
        return str(pods.metadata.resource_version)

    def _watch_from(self, resource_version: str) -> str:
        """Applies events until the server ends the watch; returns the last resourceVersion seen."""
        stream = watch.Watch(return_type="V1Pod").stream(
            self._open_watch, self._namespace, label_selector=self.pool.label_selector,
            resource_version=resource_version, allow_watch_bookmarks=True,
            timeout_seconds=max(1, int(self._watch_timeout_s)),
            _request_timeout=(CONNECT_TIMEOUT_S, ANSWER_TIMEOUT_S))
        started_s, received = time.monotonic(), False
        try:
            for event in stream:
                if self._stopping.is_set():
                    break
                resource_version = self._apply(event) or resource_version
                received = True
                self._backoff.succeeded()
        finally:
            stream.close()
            self._response = None
        if not received and not self._stopping.is_set() and time.monotonic() - started_s < self._watch_timeout_s / 2:
            raise WatchEndedEarly("the server ended the watch early without an event")
        self._backoff.succeeded()
        return resource_version

    def _open_watch(self, *args: Any, **kwargs: Any) -> Any:
        """The watch request, as Watch.stream makes it. Once the server has answered, the stream may stay silent for
        as long as the watch lasts; its response is kept, for request_stop() to shut its connection down."""
        response = self._api.list_namespaced_pod(*args, **kwargs)
        connection = _socket_of(response)
        if connection is not None:
            connection.settimeout(self._watch_timeout_s + WATCH_READ_MARGIN_S)
        self._response = response
        if self._stopping.is_set():  # request_stop() came before the response was kept: it could not shut it
            _shut_down(response)
        return response

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


def _socket_of(response: Any) -> socket.socket | None:
    return getattr(getattr(response, "connection", None), "sock", None)


def _shut_down(response: Any) -> None:
    """Ends the response's reads at once, from any thread (closing it from here could wait on the reader's locks)."""
    connection = _socket_of(response)
    if connection is not None:
        with contextlib.suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)


def _describe(error: Exception) -> str:
    """The error, with the API server's own explanation where it sent one (a Status object: for a missing
    permission, which service account may not list pods where)."""
    if not isinstance(error, client.ApiException):
        return f"{type(error).__name__}: {error}"
    text = f"HTTP {error.status} {error.reason}"
    try:
        message = json.loads(error.body).get("message") if error.body else None
    except (ValueError, TypeError, AttributeError):  # no JSON object: a proxy's page, bytes that are no text
        message = None
    return f"{text}: {message[:500]}" if isinstance(message, str) and message else text
