"""`bear serve snapshotter` (also `bear snapshotter`): the sidecar's flags over its environment settings."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from bear.common.config_sources import given_as, given_value
from bear.snapshotter.config import SnapshotterConfig

_FLAGS = {  # flag → (environment variable, type, help); a text flag given empty is refused (given_value)
    "--region": ("BEAR_SNAPSHOT_REGION", given_value, "snapshot region name in /dev/shm, or a path "
                 "(BEAR_SNAPSHOT_REGION)"),
    "--instance-id": ("BEAR_INSTANCE_ID", given_value, "this instance's id (BEAR_INSTANCE_ID; default: host name)"),
    "--pool": ("BEAR_POOL", given_value, "pool the instance belongs to (BEAR_POOL)"),
    "--model": ("BEAR_MODEL", given_value, "model name (BEAR_MODEL; default: the engine's served model name)"),
    "--endpoint": ("BEAR_INSTANCE_ENDPOINT", given_value, "the vLLM server's URL (BEAR_INSTANCE_ENDPOINT)"),
    "--engine-health-url": ("BEAR_ENGINE_HEALTH_URL", given_value, "the vLLM server's /health as this sidecar "
                            "reaches it: register once it answers, withdraw when it stops (BEAR_ENGINE_HEALTH_URL)"),
    "--grpc-port": ("BEAR_SNAPSHOTTER_GRPC_PORT", int, "gRPC port, 0 for any free one (BEAR_SNAPSHOTTER_GRPC_PORT)"),
    "--redis-url": ("BEAR_REDIS_URL", given_value, "Redis URL (BEAR_REDIS_URL; default: an embedded Redis)"),
    "--poll-interval-ms": ("BEAR_SNAPSHOTTER_POLL_INTERVAL_MS", float, "how often the region is read "
                           "(BEAR_SNAPSHOTTER_POLL_INTERVAL_MS, default 5)"),
    "--metrics-port": ("BEAR_SNAPSHOTTER_METRICS_PORT", given_value, "Prometheus /metrics port, 0 for any free one, "
                       "off for none (BEAR_SNAPSHOTTER_METRICS_PORT, default 9465)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, (_, kind, text) in _FLAGS.items():
        parser.add_argument(flag, type=kind, help=text)


def run(args: argparse.Namespace) -> int:
    from bear.common.service import ServiceStartError, announce, configure_logging  # grpc, redis: when it runs
    from bear.snapshotter import main

    configure_logging()
    try:
        config = config_from(args)
    except ValueError as error:
        print(f"bear snapshotter: {error}", file=sys.stderr)
        return 2
    try:
        main.run(config, on_ready=announce)
    except ServiceStartError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


def config_from(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> SnapshotterConfig:
    """The environment's settings with the flags given in their place (a flag overrides its variable before anything
    is parsed: a good flag is not refused for a bad variable it replaces)."""
    merged = dict(os.environ if environ is None else environ)
    given: dict[str, str] = {}
    for flag, (name, _, _) in _FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            merged[name] = str(value)
            given[name] = flag
    with given_as(given):
        return SnapshotterConfig.from_environ(merged)
