"""A small stand-in for the Kubernetes API server: list and watch of pods in a namespace, on a loopback port.

What it speaks, as the real server does:
    GET /api/v1/namespaces/<ns>/pods?labelSelector=k=v,...                PodList with metadata.resourceVersion
    GET /api/v1/namespaces/<ns>/pods?watch=true&resourceVersion=N&...     chunked stream of JSON lines
        {"type": "ADDED" | "MODIFIED" | "DELETED", "object": pod}, {"type": "BOOKMARK", ...}; it ends after
        timeoutSeconds; a resourceVersion older than the compacted history gets 410 Gone, as an HTTP status or (like
        a real server) as an ERROR event carrying a Status with code 410.
Every change of a pod takes the next resourceVersion and is kept in the history until `compact()`.

Test controls: `add_pod`, `set_pod`, `delete_pod`, `compact`, `interrupt_watches` (ends open streams after a
BOOKMARK, as an API server restart would), `hold_watches` (new watches wait until released), `fail_next` (answer the
next requests with an error status), `watch_cap_s` (end every watch that early, as a faulty proxy would). Counters:
`lists`, `watches`, `gone`, `failures`, `open_watches`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class FakeKubeApi:
    def __init__(self, namespace: str = "bear", gone_as_event: bool = True):
        self.namespace = namespace
        self.gone_as_event = gone_as_event
        self.watch_cap_s: float | None = None  # a misbehaving server: ends every watch after this long, whatever asked
        self.lists = self.watches = self.gone = self.failures = self.open_watches = 0
        self._changed = threading.Condition()
        self._resource_version = 1000
        self._compacted = 1000  # a watch from a resourceVersion below this gets 410
        self._pods: dict[str, dict[str, Any]] = {}
        self._history: list[tuple[int, str, dict[str, Any]]] = []  # (resourceVersion, type, pod)
        self._interruptions = 0
        self._watch_gate = threading.Event()
        self._watch_gate.set()
        self._failures: list[int] = []
        self._stopping = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-kube-api",
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._watch_gate.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # --- pods -------------------------------------------------------------------------------------------------------

    def add_pod(self, name: str, labels: dict[str, str], *, phase: str = "Pending", ready: bool = False,
                ip: str | None = None) -> None:
        pod = {"metadata": {"name": name, "namespace": self.namespace, "labels": dict(labels), "uid": f"uid-{name}"},
               "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}, "status": {}}
        self._record("ADDED", pod, phase=phase, ready=ready, ip=ip)

    def set_pod(self, name: str, *, phase: str | None = None, ready: bool | None = None, ip: str | None = None,
                terminating: bool = False) -> None:
        with self._changed:
            pod = json.loads(json.dumps(self._pods[name]))
        status = pod["status"]
        self._record("MODIFIED", pod, phase=phase or status.get("phase", "Pending"),
                     ready=_is_ready(status) if ready is None else ready, ip=ip or status.get("podIP"),
                     terminating=terminating)

    def delete_pod(self, name: str) -> None:
        with self._changed:
            pod = self._pods.pop(name)
            self._resource_version += 1
            pod["metadata"]["resourceVersion"] = str(self._resource_version)
            self._history.append((self._resource_version, "DELETED", pod))
            self._changed.notify_all()

    def _record(self, kind: str, pod: dict[str, Any], *, phase: str, ready: bool, ip: str | None,
                terminating: bool = False) -> None:
        pod["status"] = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        if ip:
            pod["status"]["podIP"] = ip
        if terminating:
            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        with self._changed:
            self._resource_version += 1
            pod["metadata"]["resourceVersion"] = str(self._resource_version)
            self._pods[pod["metadata"]["name"]] = pod
            self._history.append((self._resource_version, kind, json.loads(json.dumps(pod))))
            self._changed.notify_all()

    # --- failures ---------------------------------------------------------------------------------------------------

    def compact(self) -> None:
        """Forgets the history: a new watch from any resourceVersion before now gets 410 Gone (open ones go on)."""
        with self._changed:
            self._compacted = self._resource_version

    def interrupt_watches(self) -> None:
        """Ends every open watch stream (after a BOOKMARK with the current resourceVersion)."""
        with self._changed:
            self._interruptions += 1
            self._changed.notify_all()

    @contextmanager
    def hold_watches(self) -> Iterator[None]:
        """New watch requests wait until the block exits."""
        self._watch_gate.clear()
        try:
            yield
        finally:
            self._watch_gate.set()

    def fail_next(self, status: int, count: int = 1) -> None:
        with self._changed:
            self._failures.extend([status] * count)

    # --- protocol ---------------------------------------------------------------------------------------------------

    def _take_failure(self) -> int | None:
        with self._changed:
            if self._failures:
                self.failures += 1
                return self._failures.pop(0)
        return None

    def _list(self, selector: dict[str, str]) -> dict[str, Any]:
        with self._changed:
            self.lists += 1
            items = [pod for pod in self._pods.values() if _matches(pod, selector)]
            return {"apiVersion": "v1", "kind": "PodList",
                    "metadata": {"resourceVersion": str(self._resource_version)}, "items": items}

    def _start_watch(self, since: int) -> int:
        """Counts a watch request and returns the interruption count it starts under; raises _Gone if `since` is
        older than the history kept."""
        with self._changed:
            self.watches += 1
            if since < self._compacted:
                self.gone += 1
                raise _Gone(since, self._compacted)
            self.open_watches += 1
            return self._interruptions

    def _stream(self, selector: dict[str, str], since: int, timeout_s: float,
                interruptions: int) -> Iterator[dict[str, Any]]:
        """Yields watch events after `since` until the timeout, an interruption or shutdown."""
        deadline_s = time.monotonic() + min(timeout_s, self.watch_cap_s if self.watch_cap_s is not None else timeout_s)
        try:
            yield from self._events_until_end(selector, since, deadline_s, interruptions)
        finally:
            with self._changed:
                self.open_watches -= 1

    def _events_until_end(self, selector: dict[str, str], since: int, deadline_s: float,
                          interruptions: int) -> Iterator[dict[str, Any]]:
        while True:
            with self._changed:
                pending = [(rv, kind, pod) for rv, kind, pod in self._history if rv > since and _matches(pod, selector)]
                if not pending:
                    if self._stopping or self._interruptions != interruptions:
                        yield {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {
                            "resourceVersion": str(self._resource_version)}}}
                        return
                    remaining_s = deadline_s - time.monotonic()
                    if remaining_s <= 0:
                        return
                    self._changed.wait(remaining_s)
                    continue
            for rv, kind, pod in pending:
                since = rv
                yield {"type": kind, "object": pod}


class _Gone(Exception):
    def __init__(self, since: int, compacted: int):
        super().__init__(f"too old resource version: {since} ({compacted})")


def _handler(api: FakeKubeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 2  # idle keep-alive connections close, so shutdown never waits on them

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            parts = urlsplit(self.path)
            query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
            if parts.path != f"/api/v1/namespaces/{api.namespace}/pods":
                return self._status(404, "NotFound", f"no route {parts.path}")
            failure = api._take_failure()
            if failure is not None:
                return self._status(failure, "InternalError", "injected failure")
            selector = _parse_selector(query.get("labelSelector", ""))
            if query.get("watch") not in ("true", "1"):
                return self._json(200, api._list(selector))
            api._watch_gate.wait()
            since = int(query.get("resourceVersion") or 0)
            try:
                interruptions = api._start_watch(since)
                events = api._stream(selector, since, float(query.get("timeoutSeconds") or 30), interruptions)
            except _Gone as gone:
                if not api.gone_as_event:
                    return self._status(410, "Expired", str(gone))
                events = iter([{"type": "ERROR", "object": _status_body(410, "Expired", str(gone))}])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            try:
                for event in events:
                    self._chunk(json.dumps(event).encode() + b"\n")
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _json(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._json(code, _status_body(code, reason, message))

        def log_message(self, *_: Any) -> None:
            pass

    return Handler


def _status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def _parse_selector(text: str) -> dict[str, str]:
    pairs = (term.replace("==", "=").split("=", 1) for term in text.split(",") if term)
    return {key.strip(): value.strip() for key, value in pairs}


def _matches(pod: dict[str, Any], selector: dict[str, str]) -> bool:
    labels = pod["metadata"].get("labels", {})
    return all(labels.get(key) == value for key, value in selector.items())


def _is_ready(status: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", ()))
