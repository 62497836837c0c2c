"""The gRPC face of the sidecar (bear.v1.Snapshotter, plus grpc.health.v1): thin, over `sidecar.Snapshotter`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bear.common.service import NO_REUSEPORT, ServiceStartError, bind_problem, guarded
from bear.snapshotter.sidecar import Snapshotter
from bear.v1 import calibration_pb2, snapshot_pb2, snapshotter_pb2, snapshotter_pb2_grpc

SERVICE_NAME = snapshotter_pb2.DESCRIPTOR.services_by_name["Snapshotter"].full_name
WATCH_POLL_S = 0.5  # how often a waiting stream checks that its client is still there
MAX_WATCH_INTERVAL_MS = 60_000  # WatchSnapshots' min_interval_ms at most (a snapshot a minute)
MAX_WORKERS = 16  # the server's threads: each open WatchSnapshots stream holds one for as long as it lasts
RESERVED_WORKERS = 4  # threads no stream may take: GetSnapshot, GetCoefficients and the readiness probe's health


class SnapshotterServicer(snapshotter_pb2_grpc.SnapshotterServicer):
    """A WatchSnapshots stream holds one of the server's threads while it lasts: at most `max_watchers` at once (more
    are refused RESOURCE_EXHAUSTED), so that the readiness probe's health checks and the unary calls always find one."""

    def __init__(self, source: Snapshotter, max_watchers: int = MAX_WORKERS - RESERVED_WORKERS):
        self._source = source
        self._max_watchers = max_watchers
        self._watchers = 0
        self._lock = threading.Lock()

    def GetSnapshot(self, request: snapshotter_pb2.GetSnapshotRequest,
                    context: grpc.ServicerContext) -> snapshot_pb2.InstanceSnapshot:
        snapshot = self._source.latest()
        if snapshot is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "no snapshot yet: the engine has not written its region")
        return snapshot

    def WatchSnapshots(self, request: snapshotter_pb2.WatchSnapshotsRequest,
                       context: grpc.ServicerContext) -> Iterator[snapshot_pb2.InstanceSnapshot]:
        interval_ms = request.min_interval_ms
        if interval_ms > MAX_WATCH_INTERVAL_MS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"min_interval_ms must be at most {MAX_WATCH_INTERVAL_MS}, got {interval_ms}")
        with self._lock:
            if self._watchers >= self._max_watchers:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{self._watchers} WatchSnapshots streams are open, the most this sidecar serves: "
                              "close one, or read GetSnapshot or Redis instead")
            self._watchers += 1
        try:
            yield from self._watch(interval_ms / 1000, context)
        finally:
            with self._lock:
                self._watchers -= 1

    def _watch(self, min_interval_s: float, context: grpc.ServicerContext) -> Iterator[snapshot_pb2.InstanceSnapshot]:
        sequence_number, sent_at = -1, -float("inf")
        while context.is_active():
            snapshot = self._source.wait_newer(sequence_number, timeout_s=WATCH_POLL_S)
            if snapshot is None:
                continue
            # the interval's rest, in short waits: a client that leaves or a server that stops ends the stream now
            while (wait_s := sent_at + min_interval_s - time.monotonic()) > 0:
                if not context.is_active():
                    return
                time.sleep(min(wait_s, WATCH_POLL_S))
            snapshot = self._source.latest() or snapshot
            sequence_number, sent_at = snapshot.sequence_number, time.monotonic()
            yield snapshot

    def GetCoefficients(self, request: snapshotter_pb2.GetCoefficientsRequest,
                        context: grpc.ServicerContext) -> calibration_pb2.BatchTimeCoefficients:
        coefficients = self._source.coefficients()
        if coefficients is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not calibrated yet: too few executed steps")
        return coefficients


def make_server(source: Snapshotter, health_servicer: health.HealthServicer, host: str, port: int,
                max_workers: int = MAX_WORKERS) -> tuple[grpc.Server, int]:
    """A server (not started yet) with both services; returns it and the port it bound. Requests that do not
    decode are answered INVALID_ARGUMENT, as by the other services."""
    if max_workers <= RESERVED_WORKERS:
        raise ValueError(f"max_workers must exceed {RESERVED_WORKERS}, got {max_workers}")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="bear-snapshotter"),
                         options=NO_REUSEPORT)
    registration = guarded(server)
    snapshotter_pb2_grpc.add_SnapshotterServicer_to_server(
        SnapshotterServicer(source, max_watchers=max_workers - RESERVED_WORKERS), registration)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, registration)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # "Failed to bind to address ..."
        bound = 0
    if bound == 0:
        raise ServiceStartError("bear snapshotter: " + bind_problem(host, port, "BEAR_SNAPSHOTTER_GRPC_HOST"))
    return server, bound


def set_availability(health_servicer: health.HealthServicer, available: bool) -> None:
    """The process is serving either way; the Snapshotter service only while the engine's region is there."""
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING if available
                        else health_pb2.HealthCheckResponse.NOT_SERVING)
