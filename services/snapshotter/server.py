"""The gRPC face of the sidecar (bear.v1.Snapshotter, plus grpc.health.v1): thin, over `sidecar.Snapshotter`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bear.common.service import SERVER_OPTIONS, ServiceStartError, bind_problem
from bear.snapshotter.sidecar import Snapshotter
from bear.v1 import calibration_pb2, snapshot_pb2, snapshotter_pb2, snapshotter_pb2_grpc

SERVICE_NAME = snapshotter_pb2.DESCRIPTOR.services_by_name["Snapshotter"].full_name
WATCH_POLL_S = 0.5  # how often a waiting stream checks that its client is still there


class SnapshotterServicer(snapshotter_pb2_grpc.SnapshotterServicer):
    def __init__(self, source: Snapshotter):
        self._source = source

    def GetSnapshot(self, request: snapshotter_pb2.GetSnapshotRequest,
                    context: grpc.ServicerContext) -> snapshot_pb2.InstanceSnapshot:
        snapshot = self._source.latest()
        if snapshot is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "no snapshot yet: the engine has not written its region")
        return snapshot

    def WatchSnapshots(self, request: snapshotter_pb2.WatchSnapshotsRequest,
                       context: grpc.ServicerContext) -> Iterator[snapshot_pb2.InstanceSnapshot]:
        min_interval_s = request.min_interval_ms / 1000
        sequence_number, sent_at = -1, -float("inf")
        while context.is_active():
            snapshot = self._source.wait_newer(sequence_number, timeout_s=WATCH_POLL_S)
            if snapshot is None:
                continue
            wait_s = sent_at + min_interval_s - time.monotonic()
            if wait_s > 0:
                time.sleep(wait_s)
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
                max_workers: int = 16) -> tuple[grpc.Server, int]:
    """A server (not started yet) with both services; returns it and the port it bound."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="bear-snapshotter"),
                         options=SERVER_OPTIONS)
    snapshotter_pb2_grpc.add_SnapshotterServicer_to_server(SnapshotterServicer(source), server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
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
