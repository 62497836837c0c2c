"""`bear serve snapshotter` (also `bear snapshotter`): the sidecar's flags over its environment settings."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from bear.common.config_sources import given_value
from bear.snapshotter.config import SnapshotterConfig

_FLAGS = {  # flag → (config field, type, help); a text flag given empty is refused (config_sources.given_value)
    "--region": ("region", given_value, "snapshot region name in /dev/shm, or a path (BEAR_SNAPSHOT_REGION)"),
    "--instance-id": ("instance_id", given_value, "this instance's id (BEAR_INSTANCE_ID; default: host name)"),
    "--pool": ("pool", given_value, "pool the instance belongs to (BEAR_POOL)"),
    "--model": ("model", given_value, "model name (BEAR_MODEL; default: the engine's served model name)"),
    "--endpoint": ("endpoint", given_value, "the vLLM server's URL (BEAR_INSTANCE_ENDPOINT)"),
    "--engine-health-url": ("engine_health_url", given_value, "the vLLM server's /health as this sidecar reaches it: "
                            "register once it answers, withdraw when it stops (BEAR_ENGINE_HEALTH_URL)"),
    "--grpc-port": ("grpc_port", int, "gRPC port, 0 for any free one (BEAR_SNAPSHOTTER_GRPC_PORT)"),
    "--redis-url": (None, given_value, "Redis URL (BEAR_REDIS_URL; default: an embedded Redis)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, (_, kind, text) in _FLAGS.items():
        parser.add_argument(flag, type=kind, help=text)
    parser.add_argument("--poll-interval-ms", type=float, help="how often the region is read "
                        "(BEAR_SNAPSHOTTER_POLL_INTERVAL_MS, default 5)")
    parser.add_argument("--metrics-port", type=given_value, help="Prometheus /metrics port, 0 for any free one, off "
                        "for none (BEAR_SNAPSHOTTER_METRICS_PORT, default 9465)")


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


def config_from(args: argparse.Namespace) -> SnapshotterConfig:
    config = SnapshotterConfig.from_environ()
    overrides = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _, _) in _FLAGS.items() if field}
    if args.poll_interval_ms is not None:
        overrides["poll_interval_s"] = args.poll_interval_ms / 1000
    if args.metrics_port is not None:
        text = args.metrics_port.strip().lower()
        if text in ("off", "none", "false"):
            config = dataclasses.replace(config, metrics_port=None)
        else:
            try:
                overrides["metrics_port"] = int(text)
            except ValueError:
                raise ValueError(f"--metrics-port must be a port number or off, got {args.metrics_port!r}") from None
    config = dataclasses.replace(config, **{k: v for k, v in overrides.items() if v is not None})
    if args.redis_url is not None:
        config = dataclasses.replace(config, redis=dataclasses.replace(config.redis, url=args.redis_url))
    return config
