"""Settings of the snapshotter, read once at start-up: the only place here that reads the environment.

Two processes read them: vLLM's EngineCore (the plugin: `PluginConfig`) and the sidecar (`SnapshotterConfig`). Both
name the region with BEAR_SNAPSHOT_REGION. This module imports only the standard library and `bear.common`'s
configuration (itself standard library only), so that the plugin stays light.
"""

from __future__ import annotations

import math
import os
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from bear.common.config_sources import grpc_target_problem, is_utf8, port_problem
from bear.common.prices import PRICE_RANGE, price_ok
from bear.common.redis_config import RedisConfig
from bear.snapshotter.region import MAX_ID_BYTES, MAX_RING_STEPS, MAX_WAITING_ROWS_LIMIT

DEFAULT_REGION = "bear-snapshot"


MAX_REGION_NAME_BYTES = 200  # the region file's name (the last part of a path): a DP rank's -dp<r> and the
# temporary file's .<pid>.tmp go on it, within the 255 bytes a file name may have
MAX_CALIBRATION_WINDOW = 100_000  # BEAR_CALIBRATION_WINDOW at most: steps kept in memory (~300 bytes each), refitted
MAX_POLL_INTERVAL_MS = 60_000.0  # BEAR_SNAPSHOTTER_POLL_INTERVAL_MS at most (a region read at least once a minute)
MAX_ENGINE_HEALTH_TIMEOUT_S = 60.0  # BEAR_ENGINE_HEALTH_TIMEOUT_S at most
MAX_SNAPSHOT_TTL_S = 86_400.0  # BEAR_SNAPSHOT_TTL_S at most: a stopped instance's keys are gone within a day
MIN_REFRESH_S = 0.01  # BEAR_SNAPSHOT_REFRESH_S at least: an idle engine's snapshot republished 100 times a second


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """The scheduler plugin's settings (environment of `vllm serve`)."""

    region: str = DEFAULT_REGION  # BEAR_SNAPSHOT_REGION: a file in /dev/shm, or a path (DP rank r > 0 adds -dp<r>)
    max_waiting_rows: int = 1024  # BEAR_SNAPSHOT_MAX_WAITING: rows for waiting requests (running ones: max_num_seqs)
    ring_steps: int = 128  # BEAR_SNAPSHOT_RING_STEPS: step records kept for calibration and the steps in flight
    # BEAR_SNAPSHOT_MAX_ID_BYTES: longer request ids are cut (and flagged). vLLM's id of a request is the router's
    # (at most 128 bytes) between a prefix and a random suffix: cmpl-<id>-<prompt index>-<8 hex> at most ~150 bytes.
    max_id_bytes: int = 160

    def __post_init__(self) -> None:
        problem = region_problem(self.region)
        _require(problem is None, problem or "")
        _require(0 <= self.max_waiting_rows <= MAX_WAITING_ROWS_LIMIT,
                 f"BEAR_SNAPSHOT_MAX_WAITING must be in [0, {MAX_WAITING_ROWS_LIMIT}]")
        _require(4 <= self.ring_steps <= MAX_RING_STEPS, f"BEAR_SNAPSHOT_RING_STEPS must be in [4, {MAX_RING_STEPS}]")
        _require(8 <= self.max_id_bytes <= MAX_ID_BYTES, f"BEAR_SNAPSHOT_MAX_ID_BYTES must be in [8, {MAX_ID_BYTES}]")

    @staticmethod
    def from_environ(environ: Mapping[str, str] = os.environ) -> PluginConfig:
        defaults = PluginConfig()
        return PluginConfig(
            region=_text(environ, "BEAR_SNAPSHOT_REGION") or defaults.region,
            max_waiting_rows=_int(environ, "BEAR_SNAPSHOT_MAX_WAITING", defaults.max_waiting_rows),
            ring_steps=_int(environ, "BEAR_SNAPSHOT_RING_STEPS", defaults.ring_steps),
            max_id_bytes=_int(environ, "BEAR_SNAPSHOT_MAX_ID_BYTES", defaults.max_id_bytes),
        )


@dataclass(frozen=True, slots=True)
class SnapshotterConfig:
    """The sidecar's settings (environment of `bear snapshotter`, overridable by its flags)."""

    region: str = DEFAULT_REGION  # BEAR_SNAPSHOT_REGION
    instance_id: str = ""  # BEAR_INSTANCE_ID (default: the host name, i.e. the pod name)
    pool: str = "default"  # BEAR_POOL
    model: str = ""  # BEAR_MODEL (default: the engine's served model name)
    endpoint: str = ""  # BEAR_INSTANCE_ENDPOINT: where the vLLM server answers, e.g. http://10.0.0.7:8000
    engine_health_url: str = ""  # BEAR_ENGINE_HEALTH_URL: the server's /health as the sidecar reaches it, e.g.
    # http://localhost:8000/health: the instance is registered once it answers 200 and withdrawn when it stops
    # (engine_health.py); empty: the region's heartbeat alone says the engine is alive
    engine_health_timeout_s: float = 3.0  # BEAR_ENGINE_HEALTH_TIMEOUT_S: a probe not answered in full by then failed
    input_usd_per_million_tokens: float = 0.0  # BEAR_INPUT_USD_PER_MTOK
    output_usd_per_million_tokens: float = 0.0  # BEAR_OUTPUT_USD_PER_MTOK
    poll_interval_s: float = 0.005  # BEAR_SNAPSHOTTER_POLL_INTERVAL_MS
    grpc_host: str = "[::]"  # BEAR_SNAPSHOTTER_GRPC_HOST
    grpc_port: int = 50071  # BEAR_SNAPSHOTTER_GRPC_PORT (0: any free port)
    metrics_port: int | None = 9465  # BEAR_SNAPSHOTTER_METRICS_PORT: Prometheus /metrics (0: any free port; off: none)
    advertised_endpoint: str = ""  # BEAR_SNAPSHOTTER_ENDPOINT: this sidecar's gRPC address, as others reach it
    snapshot_ttl_s: float = 10.0  # BEAR_SNAPSHOT_TTL_S: Redis keys of an instance vanish this long after it stops
    refresh_s: float = 0.5  # BEAR_SNAPSHOT_REFRESH_S: an unchanged (idle) snapshot is republished this often, so that
    # its age (from its read_at) stays below the estimator's limit
    engine_timeout_s: float = 5.0  # BEAR_SNAPSHOTTER_ENGINE_TIMEOUT_S: an engine without heartbeat this long is gone
    calibration_window: int = 2000  # BEAR_CALIBRATION_WINDOW: latest executed steps the eq. 12 fit uses
    calibration_min_samples: int = 50  # BEAR_CALIBRATION_MIN_SAMPLES: steps needed before the first fit
    calibration_refit_s: float = 2.0  # BEAR_CALIBRATION_REFIT_S: at most one fit per this many seconds, or per
    # calibration.FAST_REFIT_S while the latest steps' measured ÷ fitted time says the fit does not describe the
    # engine's batches
    calibration_recent_steps: int = 8  # BEAR_CALIBRATION_RECENT_STEPS: latest steps whose speed against the fit is
    # published with every snapshot (step_time_ratio, calibration.py); 0: none
    redis: RedisConfig = field(default_factory=RedisConfig)

    def __post_init__(self) -> None:
        for name, text in (("BEAR_SNAPSHOT_REGION (--region)", self.region),
                           ("BEAR_INSTANCE_ID (--instance-id)", self.instance_id), ("BEAR_POOL (--pool)", self.pool),
                           ("BEAR_MODEL (--model)", self.model), ("BEAR_INSTANCE_ENDPOINT (--endpoint)", self.endpoint),
                           ("BEAR_SNAPSHOTTER_GRPC_HOST", self.grpc_host)):
            _require(is_utf8(text), f"{name} is not UTF-8 text: got {text!r}")  # an undecodable byte of the
            # environment or the command line: it would fail later, in a registration or a server that never starts
        problem = region_problem(self.region)
        _require(problem is None, problem or "")
        _require(bool(self.instance_id), "BEAR_INSTANCE_ID must not be empty")
        _require(self.instance_id.isprintable() and not any(c.isspace() for c in self.instance_id),
                 f"BEAR_INSTANCE_ID must have no spaces or control characters (as a pools file's ids), got "
                 f"{self.instance_id!r}")
        _require(0 < len(self.pool) <= 253 and self.pool.isprintable() and not any(c.isspace() for c in self.pool),
                 f"BEAR_POOL (--pool) must be 1-253 characters without spaces or control characters (a pools file "
                 f"names a pool by a DNS label), got {self.pool[:80]!r}")
        _require(not self.endpoint or _is_url(self.endpoint),
                 f"BEAR_INSTANCE_ENDPOINT (--endpoint) must be the vLLM server's URL, e.g. http://10.0.0.7:8000, "
                 f"got {self.endpoint!r}")
        _require(not self.engine_health_url or _is_http_url(self.engine_health_url),
                 f"BEAR_ENGINE_HEALTH_URL (--engine-health-url) must be an http(s) URL of the vLLM server's health "
                 f"check, e.g. http://localhost:8000/health (ASCII, no spaces, no user or password, a port > 0), got "
                 f"{self.engine_health_url!r}")
        _require(0 < self.engine_health_timeout_s <= MAX_ENGINE_HEALTH_TIMEOUT_S,
                 f"BEAR_ENGINE_HEALTH_TIMEOUT_S must be > 0 and at most {MAX_ENGINE_HEALTH_TIMEOUT_S:g} (seconds), got "
                 f"{self.engine_health_timeout_s:g}")
        poll_interval_ms = self.poll_interval_s * 1e3
        _require(0 < poll_interval_ms <= MAX_POLL_INTERVAL_MS,  # comparisons: also refuse nan
                 f"BEAR_SNAPSHOTTER_POLL_INTERVAL_MS (--poll-interval-ms) must be > 0 and at most "
                 f"{MAX_POLL_INTERVAL_MS:g}, got {poll_interval_ms:g}")
        problem = port_problem("BEAR_SNAPSHOTTER_GRPC_PORT", self.grpc_port)
        _require(problem is None, problem or "")
        problem = grpc_target_problem("BEAR_SNAPSHOTTER_ENDPOINT", self.advertised_endpoint) \
            if self.advertised_endpoint else None
        _require(problem is None, problem or "")
        problem = port_problem("BEAR_SNAPSHOTTER_METRICS_PORT", self.metrics_port, off_allowed=True)
        _require(problem is None, problem or "")
        _require(1 <= self.snapshot_ttl_s <= MAX_SNAPSHOT_TTL_S,
                 f"BEAR_SNAPSHOT_TTL_S must be in [1, {MAX_SNAPSHOT_TTL_S:g}] (seconds), got {self.snapshot_ttl_s:g}")
        _require(MIN_REFRESH_S <= self.refresh_s < self.snapshot_ttl_s,
                 f"BEAR_SNAPSHOT_REFRESH_S must be at least {MIN_REFRESH_S:g} and below the TTL, got {self.refresh_s:g}")
        _require(2 <= self.engine_timeout_s < math.inf,
                 "BEAR_SNAPSHOTTER_ENGINE_TIMEOUT_S must be a finite number >= 2 (the engine beats every second)")
        _require(8 <= self.calibration_window <= MAX_CALIBRATION_WINDOW,
                 f"BEAR_CALIBRATION_WINDOW must be in [8, {MAX_CALIBRATION_WINDOW}], got {self.calibration_window}")
        _require(4 <= self.calibration_min_samples <= self.calibration_window,
                 "BEAR_CALIBRATION_MIN_SAMPLES must be in [4, BEAR_CALIBRATION_WINDOW]")
        _require(0 <= self.calibration_refit_s < math.inf, "BEAR_CALIBRATION_REFIT_S must be a finite number >= 0")
        _require(0 <= self.calibration_recent_steps <= self.calibration_window,
                 f"BEAR_CALIBRATION_RECENT_STEPS must be in [0, BEAR_CALIBRATION_WINDOW], got "
                 f"{self.calibration_recent_steps}")
        for name, price in (("BEAR_INPUT_USD_PER_MTOK", self.input_usd_per_million_tokens),
                            ("BEAR_OUTPUT_USD_PER_MTOK", self.output_usd_per_million_tokens)):
            _require(price_ok(price), f"{name} must be {PRICE_RANGE}, got {price:g}")

    @property
    def heartbeat_s(self) -> float:
        """How often the registration and the coefficients are republished, refreshing their TTL."""
        return self.snapshot_ttl_s / 3

    @staticmethod
    def from_environ(environ: Mapping[str, str] = os.environ) -> SnapshotterConfig:
        """The settings of `environ`, where a blank variable counts as unset (as for every other service)."""
        environ = {name: value for name, value in environ.items() if value.strip()}
        defaults = SnapshotterConfig(instance_id="-")
        return SnapshotterConfig(
            region=_text(environ, "BEAR_SNAPSHOT_REGION") or defaults.region,
            instance_id=_text(environ, "BEAR_INSTANCE_ID") or socket.gethostname(),
            pool=_text(environ, "BEAR_POOL") or defaults.pool,
            model=_text(environ, "BEAR_MODEL"),
            endpoint=_text(environ, "BEAR_INSTANCE_ENDPOINT"),
            engine_health_url=_text(environ, "BEAR_ENGINE_HEALTH_URL"),
            engine_health_timeout_s=_float(environ, "BEAR_ENGINE_HEALTH_TIMEOUT_S", defaults.engine_health_timeout_s),
            input_usd_per_million_tokens=_float(environ, "BEAR_INPUT_USD_PER_MTOK", 0.0),
            output_usd_per_million_tokens=_float(environ, "BEAR_OUTPUT_USD_PER_MTOK", 0.0),
            poll_interval_s=_float(environ, "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS", defaults.poll_interval_s * 1e3) / 1e3,
            grpc_host=_text(environ, "BEAR_SNAPSHOTTER_GRPC_HOST") or defaults.grpc_host,
            grpc_port=_int(environ, "BEAR_SNAPSHOTTER_GRPC_PORT", defaults.grpc_port),
            metrics_port=_optional_port(environ, "BEAR_SNAPSHOTTER_METRICS_PORT", defaults.metrics_port),
            advertised_endpoint=_text(environ, "BEAR_SNAPSHOTTER_ENDPOINT"),
            snapshot_ttl_s=_float(environ, "BEAR_SNAPSHOT_TTL_S", defaults.snapshot_ttl_s),
            refresh_s=_float(environ, "BEAR_SNAPSHOT_REFRESH_S", defaults.refresh_s),
            engine_timeout_s=_float(environ, "BEAR_SNAPSHOTTER_ENGINE_TIMEOUT_S", defaults.engine_timeout_s),
            calibration_window=_int(environ, "BEAR_CALIBRATION_WINDOW", defaults.calibration_window),
            calibration_min_samples=_int(environ, "BEAR_CALIBRATION_MIN_SAMPLES", defaults.calibration_min_samples),
            calibration_refit_s=_float(environ, "BEAR_CALIBRATION_REFIT_S", defaults.calibration_refit_s),
            calibration_recent_steps=_int(environ, "BEAR_CALIBRATION_RECENT_STEPS", defaults.calibration_recent_steps),
            redis=RedisConfig.from_environ(environ),
        )


def _text(environ: Mapping[str, str], name: str) -> str:
    """A text setting; blank counts as unset (""), as for every other service."""
    return environ.get(name, "").strip()


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "").strip()
    try:
        return int(text) if text else default
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None


def _optional_port(environ: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = environ.get(name, "").strip().lower()
    if text in ("off", "none", "false"):
        return None
    return _int(environ, name, default) if text else default  # type: ignore[arg-type]


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(name, "").strip()
    try:
        return float(text) if text else default
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None


def region_problem(region: str) -> str | None:
    """Why BEAR_SNAPSHOT_REGION cannot name a region file (None: it can): a name in /dev/shm, or a path (with a '/')
    whose last part names the file."""
    name = region.rsplit("/", 1)[-1]
    if not region:
        return "BEAR_SNAPSHOT_REGION must not be empty"
    if name in ("", ".", ".."):
        return f"BEAR_SNAPSHOT_REGION must name a file (in /dev/shm, or a path to one), got {region!r}"
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > MAX_REGION_NAME_BYTES:
        return (f"BEAR_SNAPSHOT_REGION's file name must be at most {MAX_REGION_NAME_BYTES} bytes, got {size} "
                f"({region[:40]!r}...)")
    return None


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _is_url(text: str) -> bool:
    """scheme://host[:port][/path] (http(s) for vLLM; the demo's simulated instances are sim://<id>)."""
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number or out of range
    except ValueError:
        return False
    return bool(parts.scheme) and bool(parts.hostname)


def _is_http_url(text: str) -> bool:
    """An http(s) URL urllib can send as it is: printable ASCII without spaces, a host, no credentials (they would be
    logged with it), no port 0."""
    if not _is_url(text) or not all("!" <= c <= "~" for c in text):
        return False
    parts = urllib.parse.urlsplit(text)
    return parts.scheme.lower() in ("http", "https") and "@" not in parts.netloc and parts.port != 0
