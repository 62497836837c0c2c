"""Wiring of the sidecar: configuration → region reader, calibration, Redis publisher, gRPC server → poll loop."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from grpc_health.v1 import health

from bear.common.redis_config import connect
from bear.common.service import ServiceStartError, set_on_signals
from bear.snapshotter.calibration import OnlineCalibrator
from bear.snapshotter.config import SnapshotterConfig
from bear.snapshotter.engine_health import EngineHealthProbe
from bear.snapshotter.metrics import SnapshotterCollector
from bear.snapshotter.publisher import RedisPublisher
from bear.snapshotter.reader import RegionReader
from bear.snapshotter.region import region_path
from bear.snapshotter.server import make_server, set_availability
from bear.snapshotter.sidecar import Snapshotter

logger = logging.getLogger("bear.snapshotter")


def run(config: SnapshotterConfig, stop: threading.Event | None = None,
        on_ready: Callable[[int, int | None], None] | None = None) -> None:
    """Serves until `stop` is set (or SIGTERM / SIGINT when called from the main thread). `on_ready` gets the bound
    gRPC port and the /metrics port (None: not served) once the servers listen."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        set_on_signals(stop, (signal.SIGTERM, signal.SIGINT))
    path = region_path(config.region)
    if os.path.isdir(path):  # a missing region is waited for (the engine creates it); a folder never becomes one
        raise ServiceStartError(f"bear snapshotter: --region {config.region}: {path} is a folder, not the engine's "
                                f"snapshot region (a file in /dev/shm, or a path to one)")
    reader = RegionReader(path)
    client = connect(config.redis)
    publisher = RedisPublisher(client, config.instance_id, config.snapshot_ttl_s, config.heartbeat_s)
    calibrator = OnlineCalibrator(config.calibration_window, config.calibration_min_samples,
                                  config.calibration_refit_s, config.calibration_recent_steps)
    health_servicer = health.HealthServicer()
    probe = EngineHealthProbe(config.engine_health_url, timeout_s=config.engine_health_timeout_s) \
        if config.engine_health_url else None
    snapshotter = Snapshotter(config, reader, publisher, calibrator,
                              on_availability=lambda available: set_availability(health_servicer, available),
                              engine_healthy=probe.healthy if probe is not None else lambda: True)
    try:
        server, port = make_server(snapshotter, health_servicer, config.grpc_host, config.grpc_port)
    except ServiceStartError:
        reader.close()
        client.close()
        raise
    set_availability(health_servicer, False)
    server.start()
    publisher.start()
    try:
        metrics_server, metrics_port = _serve_metrics(config.metrics_port, config.grpc_host,
                                                     SnapshotterCollector(snapshotter, publisher, probe=probe))
    except OSError as error:
        server.stop(None).wait()
        publisher.stop()
        reader.close()
        client.close()
        raise ServiceStartError(f"bear snapshotter: --metrics-port {config.metrics_port}: cannot serve /metrics on "
                                f"port {config.metrics_port}: {error.strerror or error}") from None
    logger.info("snapshotter of instance %s: region %s, Redis %s, gRPC on port %d, metrics on %s, engine health %s",
                config.instance_id, reader.path, config.redis.describe(), port, metrics_port,
                config.engine_health_url or "from the region's heartbeat alone")
    if probe is not None:
        probe.start()
    if on_ready is not None:
        on_ready(port, metrics_port)
    try:
        snapshotter.run(stop)
    finally:
        if probe is not None:
            probe.stop()
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        server.stop(grace=1.0).wait()
        publisher.stop(withdraw=True)
        reader.close()
        client.close()


def _serve_metrics(port: int | None, host: str, collector: SnapshotterCollector) -> tuple[Any, int | None]:
    """Prometheus /metrics of this sidecar alone (a registry of its own: a process may run several sidecars), on the
    gRPC server's host."""
    if port is None:
        return None, None
    from prometheus_client import CollectorRegistry

    from bear.common.service import metrics_http_server

    registry = CollectorRegistry()
    registry.register(collector)
    server = metrics_http_server(port, host, registry)
    return server, server.server_port
