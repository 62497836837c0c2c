"""Pods as the Kubernetes client gives them (V1Pod), in one line each, and a fake pod API to watch them with."""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import Any

from kubernetes import client


def make_pod(name: str = "pod-0", *, phase: str = "Running", ready: bool = True, ip: str | None = "10.0.0.7",
             terminating: bool = False, labels: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name, labels=labels or {}, resource_version="1",
            deletion_timestamp=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) if terminating else None),
        spec=client.V1PodSpec(containers=[client.V1Container(name="vllm", image="vllm")]),
        status=client.V1PodStatus(phase=phase, pod_ip=ip, conditions=[
            client.V1PodCondition(type="Ready", status="True" if ready else "False")]),
    )


def make_pod_list(*pods: client.V1Pod, resource_version: str = "1") -> client.V1PodList:
    return client.V1PodList(metadata=client.V1ListMeta(resource_version=resource_version), items=list(pods))


def watch_line(kind: str, pod: client.V1Pod) -> bytes:
    """One line of a pod watch's body, as the API server streams it."""
    return json.dumps({"type": kind, "object": client.ApiClient().sanitize_for_serialization(pod)}).encode() + b"\n"


class FakeSocket:
    """The watch connection's socket: records its read timeout; shutting it down ends the response's reads."""

    def __init__(self) -> None:
        self.timeout_s: float | None = None
        self.shut_down = threading.Event()

    def settimeout(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s

    def shutdown(self, how: int) -> None:
        self.shut_down.set()


class FakeWatchResponse:
    """A watch's streaming HTTP response (what urllib3 returns with preload_content=False): yields `lines`, then stays
    open, silent, until its socket is shut down or `end` is set."""

    def __init__(self, *lines: bytes) -> None:
        self.status = 200
        self.connection = SimpleNamespace(sock=FakeSocket())
        self.end = threading.Event()
        self._lines = lines

    def stream(self, amt: int | None = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self._lines
        while not (self.connection.sock.shut_down.is_set() or self.end.is_set()):
            time.sleep(0.005)

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class FakePodApi:
    """CoreV1Api.list_namespaced_pod: a list answers the `pods` its label selector matches at once; each watch
    answers with the next of `watches` (else a silent FakeWatchResponse), and only once `answer` is set;
    `watch_calls` holds each watch call's arguments."""

    def __init__(self, *pods: client.V1Pod, watches: Iterable[FakeWatchResponse] = ()) -> None:
        self.pods = pods
        self.answer = threading.Event()
        self.answer.set()
        self.watch_requested = threading.Event()
        self.watch_calls: list[dict[str, Any]] = []
        self._watches = list(watches)

    def list_namespaced_pod(self, namespace: str, label_selector: str = "", **kwargs: Any) -> Any:
        """What kubernetes.watch reads to know what it watches:
        :rtype: V1PodList
        """
        if not kwargs.get("watch"):
            wanted = dict(term.split("=", 1) for term in label_selector.split(",") if term)
            return make_pod_list(*(pod for pod in self.pods if wanted.items() <= pod.metadata.labels.items()))
        self.watch_calls.append(kwargs)
        self.watch_requested.set()
        self.answer.wait()
        return self._watches.pop(0) if self._watches else FakeWatchResponse()
