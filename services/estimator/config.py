"""Settings of the estimator service, read once at start-up: the only place here that reads the environment.

Flags over the environment over an optional YAML file (`bear.common.config_sources`; in the file, the names below
without BEAR_, in lower case):

    BEAR_ESTIMATOR_HOST                 listen address (default [::])
    BEAR_ESTIMATOR_GRPC_PORT            gRPC port, 0 for any free one (default 50052)           --grpc-port
    BEAR_ESTIMATOR_METRICS_PORT         Prometheus /metrics port, 0 for any, off for none (9464) --metrics-port
    BEAR_MAX_SNAPSHOT_AGE_S             older snapshots fall back to LPS (default 2)             --max-snapshot-age-s
    BEAR_PREDICTOR_MODEL_DIR            a predictor artifact: residents' remaining lengths computed here (preferred)
    BEAR_PREDICTOR_ADDRESS              else host:port of the predictor service (bear.v1.Predictor/ExpectedRemaining)
    BEAR_ESTIMATOR_PREDICTOR_TIMEOUT_MS deadline of each ExpectedRemaining call (default 100)
    BEAR_ESTIMATOR_DEFAULT_OUTPUT_TOKENS predicted length of a resident no router recorded (default 256)
    BEAR_ESTIMATOR_RESYNC_S             full reread of the instances and snapshots in Redis (default 1)
    BEAR_ESTIMATOR_DISPATCH_POLL_MS     reread of the dispatches routed since each snapshot (default 50)
    BEAR_ESTIMATOR_FORGET_AFTER_S       an instance absent from Redis this long is forgotten (default 60)
    BEAR_LPS_WINDOW_S                   window of the LPS measurements (default 60)
    BEAR_SHUTDOWN_GRACE_S               calls in flight may finish this long after SIGTERM (default 5)

plus Redis (`bear.common.redis_config`: BEAR_REDIS_URL, ...; BEAR_REDIS_TIMEOUT_S is also the deadline of every
Redis call) and discovery (`bear.discovery.config`: BEAR_DISCOVERY, BEAR_NAMESPACE, BEAR_POOLS_FILE, ...): the
instances discovery lists are known even before their snapshotter registers, and never forgotten while listed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from bear.common.config_sources import (env_float, env_int, env_optional_port, folder_problem, grpc_target_problem,
                                        load_layered, port_problem, shutdown_grace_problem)
from bear.common.redis_config import ENVIRONMENT as REDIS_ENVIRONMENT
from bear.common.redis_config import RedisConfig
from bear.discovery.config import ENVIRONMENT as DISCOVERY_ENVIRONMENT
from bear.discovery.config import DiscoveryConfig

ENVIRONMENT = (
    "BEAR_ESTIMATOR_HOST", "BEAR_ESTIMATOR_GRPC_PORT", "BEAR_ESTIMATOR_METRICS_PORT", "BEAR_MAX_SNAPSHOT_AGE_S",
    "BEAR_PREDICTOR_MODEL_DIR", "BEAR_PREDICTOR_ADDRESS", "BEAR_ESTIMATOR_PREDICTOR_TIMEOUT_MS",
    "BEAR_ESTIMATOR_DEFAULT_OUTPUT_TOKENS", "BEAR_ESTIMATOR_RESYNC_S", "BEAR_ESTIMATOR_DISPATCH_POLL_MS",
    "BEAR_ESTIMATOR_FORGET_AFTER_S", "BEAR_LPS_WINDOW_S", "BEAR_SHUTDOWN_GRACE_S",
    *REDIS_ENVIRONMENT, *DISCOVERY_ENVIRONMENT,
)
FLAGS = {  # flag → (environment variable, help)
    "--grpc-port": ("BEAR_ESTIMATOR_GRPC_PORT", "gRPC port, 0 for any free one (default 50052)"),
    "--metrics-port": ("BEAR_ESTIMATOR_METRICS_PORT", "Prometheus /metrics port, 0 for any, off for none (9464)"),
    "--host": ("BEAR_ESTIMATOR_HOST", "listen address (default [::])"),
    "--max-snapshot-age-s": ("BEAR_MAX_SNAPSHOT_AGE_S", "older snapshots fall back to LPS (default 2)"),
    "--predictor-model-dir": ("BEAR_PREDICTOR_MODEL_DIR", "predictor artifact for residents' remaining lengths"),
    "--predictor-address": ("BEAR_PREDICTOR_ADDRESS", "else the predictor service, host:port"),
    "--redis-url": ("BEAR_REDIS_URL", "Redis URL (default: an embedded Redis)"),
    "--pools-file": ("BEAR_POOLS_FILE", "the pools file (bear.discovery)"),
}


MAX_OUTPUT_TOKENS = 1_000_000  # BEAR_ESTIMATOR_DEFAULT_OUTPUT_TOKENS at most (a typo beyond any model's context)

@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    host: str = "[::]"
    grpc_port: int = 50052
    metrics_port: int | None = 9464
    max_snapshot_age_s: float = 2.0
    predictor_model_dir: str = ""
    predictor_address: str = ""
    predictor_timeout_s: float = 0.1
    default_output_tokens: float = 256.0
    resync_interval_s: float = 1.0
    dispatch_poll_interval_s: float = 0.05
    forget_after_s: float = 60.0
    lps_window_s: float = 60.0
    shutdown_grace_s: float = 5.0
    redis: RedisConfig = field(default_factory=RedisConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)

    def __post_init__(self) -> None:
        for problem in (port_problem("BEAR_ESTIMATOR_GRPC_PORT", self.grpc_port),
                        port_problem("BEAR_ESTIMATOR_METRICS_PORT", self.metrics_port, off_allowed=True)):
            _require(problem is None, problem or "")
        # Finite bounds where a value beyond them is a typo with a cost: a resync every microsecond kept an idle
        # estimator busy with 7,000 Redis commands a second; an infinite limit never applies.
        for name, value, low, high, unit in (
                ("BEAR_MAX_SNAPSHOT_AGE_S", self.max_snapshot_age_s, 0.0, 3600.0, 1.0),
                ("BEAR_ESTIMATOR_PREDICTOR_TIMEOUT_MS", self.predictor_timeout_s, 0.0, 60.0, 1e3),
                ("BEAR_ESTIMATOR_RESYNC_S", self.resync_interval_s, 0.01, 3600.0, 1.0),
                ("BEAR_ESTIMATOR_DISPATCH_POLL_MS", self.dispatch_poll_interval_s, 0.001, 60.0, 1e3),
                ("BEAR_ESTIMATOR_FORGET_AFTER_S", self.forget_after_s, 0.0, 86_400.0, 1.0),
                ("BEAR_LPS_WINDOW_S", self.lps_window_s, 0.1, 86_400.0, 1.0)):
            _require(low < value <= high if low == 0 else low <= value <= high,
                     f"{name} must be {'> ' if low == 0 else 'at least '}{low * unit:g} and at most {high * unit:g}, "
                     f"got {value * unit:g}")
        problem = grpc_target_problem("BEAR_PREDICTOR_ADDRESS", self.predictor_address) if self.predictor_address else None
        _require(problem is None, problem or "")
        _require(1 <= self.default_output_tokens <= MAX_OUTPUT_TOKENS,
                 f"BEAR_ESTIMATOR_DEFAULT_OUTPUT_TOKENS must be in [1, {MAX_OUTPUT_TOKENS}], got "
                 f"{self.default_output_tokens:g}")
        _require(self.forget_after_s >= self.resync_interval_s,
                 "BEAR_ESTIMATOR_FORGET_AFTER_S must be >= BEAR_ESTIMATOR_RESYNC_S")
        grace = shutdown_grace_problem(self.shutdown_grace_s)
        _require(grace is None, grace or "")
        model_dir = self.predictor_model_dir and folder_problem("BEAR_PREDICTOR_MODEL_DIR", self.predictor_model_dir)
        _require(not model_dir, model_dir or "")

    @staticmethod
    def from_environ(environ: Mapping[str, str]) -> EstimatorConfig:
        d = EstimatorConfig()
        return EstimatorConfig(
            host=environ.get("BEAR_ESTIMATOR_HOST") or d.host,
            grpc_port=env_int(environ, "BEAR_ESTIMATOR_GRPC_PORT", d.grpc_port),
            metrics_port=env_optional_port(environ, "BEAR_ESTIMATOR_METRICS_PORT", d.metrics_port),
            max_snapshot_age_s=env_float(environ, "BEAR_MAX_SNAPSHOT_AGE_S", d.max_snapshot_age_s),
            predictor_model_dir=environ.get("BEAR_PREDICTOR_MODEL_DIR", "").strip(),
            predictor_address=environ.get("BEAR_PREDICTOR_ADDRESS", "").strip(),
            predictor_timeout_s=env_float(environ, "BEAR_ESTIMATOR_PREDICTOR_TIMEOUT_MS",
                                          d.predictor_timeout_s * 1e3) / 1e3,
            default_output_tokens=env_float(environ, "BEAR_ESTIMATOR_DEFAULT_OUTPUT_TOKENS", d.default_output_tokens),
            resync_interval_s=env_float(environ, "BEAR_ESTIMATOR_RESYNC_S", d.resync_interval_s),
            dispatch_poll_interval_s=env_float(environ, "BEAR_ESTIMATOR_DISPATCH_POLL_MS",
                                               d.dispatch_poll_interval_s * 1e3) / 1e3,
            forget_after_s=env_float(environ, "BEAR_ESTIMATOR_FORGET_AFTER_S", d.forget_after_s),
            lps_window_s=env_float(environ, "BEAR_LPS_WINDOW_S", d.lps_window_s),
            shutdown_grace_s=env_float(environ, "BEAR_SHUTDOWN_GRACE_S", d.shutdown_grace_s),
            redis=RedisConfig.from_environ(environ),
            discovery=DiscoveryConfig.from_environ(environ),
        )


def load(flags: Mapping[str, object], config_file: str | None = None,
         environ: Mapping[str, str] = os.environ) -> EstimatorConfig:
    """The settings from the flags given (by environment variable; None: not given), the environment and the file."""
    return load_layered(EstimatorConfig.from_environ, environ, config_file, flags, ENVIRONMENT, FLAGS)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
