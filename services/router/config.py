"""Settings of the router, read once at start-up: the only place of the router that reads the environment.

Flags over the environment over an optional YAML file (`bear.common.config_sources`; in the file, the names below
without BEAR_, in lower case, e.g. `default_policy: bear`):

    BEAR_ROUTER_HOST                   listen address (default [::])
    BEAR_ROUTER_GRPC_PORT              gRPC port, 0 for any free one (default 50051)             --grpc-port
    BEAR_ROUTER_METRICS_PORT           Prometheus /metrics port, 0 for any, off for none (9464)  --metrics-port
    BEAR_ESTIMATOR_ADDRESS             host:port of the estimator (default localhost:50052)     --estimator-address
    BEAR_PREDICTOR_ADDRESS             host:port of the predictor (default localhost:50053)     --predictor-address
    BEAR_DEFAULT_POLICY                policy of requests that name none (default bear)         --default-policy
    BEAR_FALLBACK_POLICY               policy when the predictor or the estimator is unavailable (default
                                       shortest-queue; round-robin when no queue lengths are known) --fallback-policy
    BEAR_ROUTER_POLICY_PARAMS          policies' parameters, JSON: {"bear": {"safety": 1.1, "fallback": "shed"}}
    BEAR_ROUTER_ESTIMATOR_TIMEOUT_MS   deadline of each Estimate call (default 100, at most 60000)
    BEAR_ROUTER_PREDICTOR_TIMEOUT_MS   deadline of each Predict call (default 100, at most 60000)
    BEAR_ROUTER_REDIS_TIMEOUT_MS       deadline of the router's Redis calls (default 50, at most 60000); after a
                                       failure Redis is left alone for 0.5 s
    BEAR_LAMBDA_PER_MICRO_USD          cost weight λ of eq. 4 for requests that give none (default 5e-4)
    BEAR_ROUTER_HORIZON_FACTOR         replays stop at this × the TTFT target + 1 s (default 4, at most 1000)
    BEAR_ROUTER_MAX_TTFT_SLO_MS        largest TTFT target accepted (default 600000, at most 86400000)
    BEAR_ROUTER_MAX_PROMPT_BYTES       largest prompt text accepted, UTF-8 bytes (default 1000000, at most 256 MiB;
                                       the server takes messages of twice that, so a larger prompt is refused by
                                       name, not by gRPC's own message limit)
    BEAR_ROUTER_MAX_PROMPT_TOKENS      largest prompt accepted, tokens (default 262144)
    BEAR_ROUTER_DEFAULT_OUTPUT_TOKENS  predicted length without a prediction (default 256)
    BEAR_ROUTER_TOKENIZER              counts prompt tokens for the estimator: qwen (default) or pretokens
    BEAR_ROUTER_REFRESH_S              how often instance registrations are re-read from Redis (default 1)
    BEAR_ROUTER_FORGET_AFTER_S         after Redis came back empty, its instances are still routed to this long
                                       (default 15)
    BEAR_ROUTER_FALLBACK_SNAPSHOT_AGE_S snapshots older than this give the fallback no queue lengths (default 10)
                                       (these three at most 86400: a day)
    BEAR_ROUTER_TTFT_FEEDBACK_WINDOW   outcomes per instance whose median observed − estimated TTFT is added to the
                                       estimator's TTFTs (default 0: off; 64 is a good window; see the router's README)
    BEAR_ROUTER_RECENT_DISPATCHES_MS   this router's dispatches of the last this many ms (at most 32) go along with
                                       each Estimate call, ahead of Redis (default 250; 0: off)
    BEAR_ROUTER_CALL_STREAMS           on (default): Predict and Estimate calls go over long-lived streams of calls
                                       (bear.common.call_streams); off: unary calls                --call-streams
    BEAR_ROUTER_UPSTREAM_STREAMS       streams of calls open to each of the predictor and the estimator, calls
                                       taken in turn (default 1, at most 64): with replicas behind one name (a
                                       headless Service) the streams are spread over them round-robin; a few per
                                       replica (the chart gives 4) share the calls about evenly
    BEAR_ROUTER_IN_PROCESS             predictor, estimator or both (predictor,estimator): run them inside the
                                       router instead of calling them over gRPC, with their own settings from the
                                       environment (BEAR_PREDICTOR_MODEL_DIR, BEAR_MAX_SNAPSHOT_AGE_S, ...; their
                                       addresses and ports unused); saves two gRPC hops per Route call (default
                                       none)                                                      --in-process
    BEAR_SHUTDOWN_GRACE_S              calls in flight may finish this long after SIGTERM (default 5)

plus Redis (`bear.common.redis_config`: BEAR_REDIS_URL, ...) and discovery (`bear.discovery.config`:
BEAR_DISCOVERY, BEAR_NAMESPACE, BEAR_POOLS_FILE, ...). Tracing follows the standard OTEL_* variables.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bear.common import strict_json
from bear.common.config_sources import (
    env_bool,
    env_float,
    env_int,
    env_optional_port,
    grpc_target_problem,
    load_layered,
    port_problem,
    shutdown_grace_problem,
)
from bear.common.redis_config import ENVIRONMENT as REDIS_ENVIRONMENT
from bear.common.redis_config import RedisConfig
from bear.discovery.config import ENVIRONMENT as DISCOVERY_ENVIRONMENT
from bear.discovery.config import DiscoveryConfig
from bear.routing.contract import MAX_WEIGHT

TOKENIZERS = ("qwen", "pretokens")
IN_PROCESS_SERVICES = ("predictor", "estimator")  # what BEAR_ROUTER_IN_PROCESS may name
MAX_PROMPT_BYTES_LIMIT = 256 * 1024 * 1024
MAX_HORIZON_FACTOR = 1000.0
MAX_TTFT_SLO_LIMIT_MS = 86_400_000.0  # BEAR_ROUTER_MAX_TTFT_SLO_MS at most: a day
MAX_DURATION_S = 86_400.0  # BEAR_ROUTER_REFRESH_S, _FORGET_AFTER_S and _FALLBACK_SNAPSHOT_AGE_S at most
MAX_UPSTREAM_STREAMS = 64  # BEAR_ROUTER_UPSTREAM_STREAMS at most
MAX_TIMEOUT_S = 60.0  # the deadlines of the calls to the predictor, the estimator and Redis at most
ENVIRONMENT = (
    "BEAR_ROUTER_HOST", "BEAR_ROUTER_GRPC_PORT", "BEAR_ROUTER_METRICS_PORT", "BEAR_ESTIMATOR_ADDRESS",
    "BEAR_PREDICTOR_ADDRESS", "BEAR_DEFAULT_POLICY", "BEAR_FALLBACK_POLICY", "BEAR_ROUTER_POLICY_PARAMS",
    "BEAR_ROUTER_ESTIMATOR_TIMEOUT_MS", "BEAR_ROUTER_PREDICTOR_TIMEOUT_MS", "BEAR_ROUTER_REDIS_TIMEOUT_MS",
    "BEAR_LAMBDA_PER_MICRO_USD", "BEAR_ROUTER_HORIZON_FACTOR", "BEAR_ROUTER_MAX_TTFT_SLO_MS",
    "BEAR_ROUTER_MAX_PROMPT_BYTES", "BEAR_ROUTER_MAX_PROMPT_TOKENS", "BEAR_ROUTER_DEFAULT_OUTPUT_TOKENS",
    "BEAR_ROUTER_TOKENIZER", "BEAR_ROUTER_REFRESH_S", "BEAR_ROUTER_FORGET_AFTER_S",
    "BEAR_ROUTER_FALLBACK_SNAPSHOT_AGE_S", "BEAR_ROUTER_TTFT_FEEDBACK_WINDOW",
    "BEAR_ROUTER_RECENT_DISPATCHES_MS", "BEAR_ROUTER_CALL_STREAMS", "BEAR_ROUTER_UPSTREAM_STREAMS",
    "BEAR_ROUTER_IN_PROCESS", "BEAR_SHUTDOWN_GRACE_S",
    *REDIS_ENVIRONMENT, *DISCOVERY_ENVIRONMENT,
)
FLAGS = {  # flag → (environment variable, help)
    "--host": ("BEAR_ROUTER_HOST", "listen address (default [::])"),
    "--grpc-port": ("BEAR_ROUTER_GRPC_PORT", "gRPC port, 0 for any free one (default 50051)"),
    "--metrics-port": ("BEAR_ROUTER_METRICS_PORT", "Prometheus /metrics port, 0 for any, off for none (9464)"),
    "--estimator-address": ("BEAR_ESTIMATOR_ADDRESS", "the estimator, host:port (default localhost:50052)"),
    "--predictor-address": ("BEAR_PREDICTOR_ADDRESS", "the predictor, host:port (default localhost:50053)"),
    "--default-policy": ("BEAR_DEFAULT_POLICY", "policy of requests that name none (default bear)"),
    "--fallback-policy": ("BEAR_FALLBACK_POLICY", "policy when a dependency is down (default shortest-queue)"),
    "--redis-url": ("BEAR_REDIS_URL", "Redis URL (default: an embedded Redis)"),
    "--pools-file": ("BEAR_POOLS_FILE", "the pools file (bear.discovery)"),
    "--call-streams": ("BEAR_ROUTER_CALL_STREAMS", "on (default): Predict and Estimate over streams of calls; off: "
                       "unary calls"),
    "--in-process": ("BEAR_ROUTER_IN_PROCESS", "predictor, estimator or both (predictor,estimator) run inside the "
                     "router, with their settings from the environment (default none)"),
}


@dataclass(frozen=True, slots=True)
class RouterConfig:
    host: str = "[::]"
    grpc_port: int = 50051
    metrics_port: int | None = 9464  # None: no /metrics
    estimator_address: str = "localhost:50052"
    predictor_address: str = "localhost:50053"
    default_policy: str = "bear"
    fallback_policy: str = "shortest-queue"
    policy_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # policy name → its parameters
    estimator_timeout_s: float = 0.1
    predictor_timeout_s: float = 0.1
    redis_timeout_s: float = 0.05
    lambda_per_micro_usd: float = 5e-4
    horizon_factor: float = 4.0
    max_ttft_slo_ms: float = 600_000.0
    max_prompt_bytes: int = 1_000_000
    max_prompt_tokens: int = 262_144
    default_output_tokens: float = 256.0
    tokenizer: str = "qwen"
    refresh_interval_s: float = 1.0
    forget_after_s: float = 15.0
    fallback_snapshot_max_age_s: float = 10.0
    ttft_feedback_window: int = 0
    recent_dispatches_s: float = 0.25
    call_streams: bool = True
    upstream_streams: int = 1  # per neighbour (predictor, estimator)
    in_process: frozenset[str] = frozenset()  # of IN_PROCESS_SERVICES
    shutdown_grace_s: float = 5.0
    redis: RedisConfig = field(default_factory=RedisConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)

    def __post_init__(self) -> None:
        for problem in (port_problem("BEAR_ROUTER_GRPC_PORT", self.grpc_port),
                        port_problem("BEAR_ROUTER_METRICS_PORT", self.metrics_port, off_allowed=True)):
            _require(problem is None, problem or "")
        for name, target in (("BEAR_ESTIMATOR_ADDRESS", self.estimator_address),
                             ("BEAR_PREDICTOR_ADDRESS", self.predictor_address)):
            problem = grpc_target_problem(name, target)
            _require(problem is None, problem or "")
        for name, value in (("BEAR_ROUTER_ESTIMATOR_TIMEOUT_MS", self.estimator_timeout_s),
                            ("BEAR_ROUTER_PREDICTOR_TIMEOUT_MS", self.predictor_timeout_s),
                            ("BEAR_ROUTER_REDIS_TIMEOUT_MS", self.redis_timeout_s),
                            ("BEAR_ROUTER_HORIZON_FACTOR", self.horizon_factor),
                            ("BEAR_ROUTER_MAX_TTFT_SLO_MS", self.max_ttft_slo_ms),
                            ("BEAR_ROUTER_REFRESH_S", self.refresh_interval_s),
                            ("BEAR_ROUTER_FORGET_AFTER_S", self.forget_after_s),
                            ("BEAR_ROUTER_FALLBACK_SNAPSHOT_AGE_S", self.fallback_snapshot_max_age_s)):
            shown = value * 1000 if name.endswith("_TIMEOUT_MS") else value  # as it was given (those in seconds here)
            _require(math.isfinite(value) and value > 0, f"{name} must be > 0, got {shown!r}")
        # The replay's horizon, horizon_factor × the target + 1 s, must stay a finite number of milliseconds.
        _require(self.horizon_factor <= MAX_HORIZON_FACTOR,
                 f"BEAR_ROUTER_HORIZON_FACTOR must be at most {MAX_HORIZON_FACTOR:g}, got {self.horizon_factor!r}")
        _require(self.max_ttft_slo_ms <= MAX_TTFT_SLO_LIMIT_MS, f"BEAR_ROUTER_MAX_TTFT_SLO_MS must be at most "
                 f"{MAX_TTFT_SLO_LIMIT_MS:g} (a day), got {self.max_ttft_slo_ms!r}")
        for name, value in (("BEAR_ROUTER_ESTIMATOR_TIMEOUT_MS", self.estimator_timeout_s),
                            ("BEAR_ROUTER_PREDICTOR_TIMEOUT_MS", self.predictor_timeout_s),
                            ("BEAR_ROUTER_REDIS_TIMEOUT_MS", self.redis_timeout_s)):
            # A deadline on the Route path; gRPC fails a call at once whose timeout overflows its clock (~1e10 s).
            _require(value <= MAX_TIMEOUT_S, f"{name} must be at most {MAX_TIMEOUT_S * 1000:g}, got {value * 1000:g}")
        for name, value in (("BEAR_ROUTER_REFRESH_S", self.refresh_interval_s),
                            ("BEAR_ROUTER_FORGET_AFTER_S", self.forget_after_s),
                            ("BEAR_ROUTER_FALLBACK_SNAPSHOT_AGE_S", self.fallback_snapshot_max_age_s)):
            # Past a day a registration would never be re-read, a lost instance never forgotten, any snapshot current
            _require(value <= MAX_DURATION_S, f"{name} must be at most {MAX_DURATION_S:g} (a day), got {value!r}")
        _require(self.refresh_interval_s >= 0.01, f"BEAR_ROUTER_REFRESH_S must be at least 0.01 (a reread of every "
                 f"registration in Redis each time), got {self.refresh_interval_s!r}")
        _require(1 <= self.default_output_tokens <= 1_000_000,
                 f"BEAR_ROUTER_DEFAULT_OUTPUT_TOKENS must be in [1, 1000000], got {self.default_output_tokens!r}")
        _require(math.isfinite(self.lambda_per_micro_usd) and 0 <= self.lambda_per_micro_usd <= MAX_WEIGHT,
                 f"BEAR_LAMBDA_PER_MICRO_USD must be in [0, {MAX_WEIGHT:g}], got {self.lambda_per_micro_usd!r}")
        _require(0 < self.max_prompt_bytes <= MAX_PROMPT_BYTES_LIMIT,
                 f"BEAR_ROUTER_MAX_PROMPT_BYTES must be in [1, {MAX_PROMPT_BYTES_LIMIT}] "
                 "(gRPC's messages stay under 2 GiB)")
        _require(self.max_prompt_tokens > 0, "BEAR_ROUTER_MAX_PROMPT_TOKENS must be > 0")
        _require(self.tokenizer in TOKENIZERS,
                 f"BEAR_ROUTER_TOKENIZER must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        grace = shutdown_grace_problem(self.shutdown_grace_s)
        _require(grace is None, grace or "")
        _require(0 <= self.ttft_feedback_window <= 100_000,
                 f"BEAR_ROUTER_TTFT_FEEDBACK_WINDOW must be in [0, 100000], got {self.ttft_feedback_window!r}")
        unknown = sorted(set(self.in_process) - set(IN_PROCESS_SERVICES))
        _require(not unknown, f"BEAR_ROUTER_IN_PROCESS: unknown service {unknown[0] if unknown else ''!r}; name "
                 "predictor, estimator, both (predictor,estimator) or none")
        _require(1 <= self.upstream_streams <= MAX_UPSTREAM_STREAMS, f"BEAR_ROUTER_UPSTREAM_STREAMS must be in "
                 f"[1, {MAX_UPSTREAM_STREAMS}], got {self.upstream_streams!r}")
        _require(math.isfinite(self.recent_dispatches_s) and 0 <= self.recent_dispatches_s <= 60,
                 f"BEAR_ROUTER_RECENT_DISPATCHES_MS must be in [0, 60000], got {1000 * self.recent_dispatches_s!r}")

    @staticmethod
    def from_environ(environ: Mapping[str, str]) -> RouterConfig:
        d = RouterConfig()
        return RouterConfig(
            host=environ.get("BEAR_ROUTER_HOST") or d.host,
            grpc_port=env_int(environ, "BEAR_ROUTER_GRPC_PORT", d.grpc_port),
            metrics_port=env_optional_port(environ, "BEAR_ROUTER_METRICS_PORT", d.metrics_port),
            estimator_address=environ.get("BEAR_ESTIMATOR_ADDRESS", "").strip() or d.estimator_address,
            predictor_address=environ.get("BEAR_PREDICTOR_ADDRESS", "").strip() or d.predictor_address,
            default_policy=environ.get("BEAR_DEFAULT_POLICY", "").strip() or d.default_policy,
            fallback_policy=environ.get("BEAR_FALLBACK_POLICY", "").strip() or d.fallback_policy,
            policy_params=_policy_params(environ.get("BEAR_ROUTER_POLICY_PARAMS", "")),
            estimator_timeout_s=_ms(environ, "BEAR_ROUTER_ESTIMATOR_TIMEOUT_MS", d.estimator_timeout_s),
            predictor_timeout_s=_ms(environ, "BEAR_ROUTER_PREDICTOR_TIMEOUT_MS", d.predictor_timeout_s),
            redis_timeout_s=_ms(environ, "BEAR_ROUTER_REDIS_TIMEOUT_MS", d.redis_timeout_s),
            lambda_per_micro_usd=env_float(environ, "BEAR_LAMBDA_PER_MICRO_USD", d.lambda_per_micro_usd),
            horizon_factor=env_float(environ, "BEAR_ROUTER_HORIZON_FACTOR", d.horizon_factor),
            max_ttft_slo_ms=env_float(environ, "BEAR_ROUTER_MAX_TTFT_SLO_MS", d.max_ttft_slo_ms),
            max_prompt_bytes=env_int(environ, "BEAR_ROUTER_MAX_PROMPT_BYTES", d.max_prompt_bytes),
            max_prompt_tokens=env_int(environ, "BEAR_ROUTER_MAX_PROMPT_TOKENS", d.max_prompt_tokens),
            default_output_tokens=env_float(environ, "BEAR_ROUTER_DEFAULT_OUTPUT_TOKENS", d.default_output_tokens),
            tokenizer=environ.get("BEAR_ROUTER_TOKENIZER", "").strip() or d.tokenizer,
            refresh_interval_s=env_float(environ, "BEAR_ROUTER_REFRESH_S", d.refresh_interval_s),
            forget_after_s=env_float(environ, "BEAR_ROUTER_FORGET_AFTER_S", d.forget_after_s),
            fallback_snapshot_max_age_s=env_float(environ, "BEAR_ROUTER_FALLBACK_SNAPSHOT_AGE_S",
                                                  d.fallback_snapshot_max_age_s),
            ttft_feedback_window=env_int(environ, "BEAR_ROUTER_TTFT_FEEDBACK_WINDOW", d.ttft_feedback_window),
            recent_dispatches_s=_ms(environ, "BEAR_ROUTER_RECENT_DISPATCHES_MS", d.recent_dispatches_s),
            call_streams=env_bool(environ, "BEAR_ROUTER_CALL_STREAMS", d.call_streams),
            upstream_streams=env_int(environ, "BEAR_ROUTER_UPSTREAM_STREAMS", d.upstream_streams),
            in_process=in_process_services(environ.get("BEAR_ROUTER_IN_PROCESS", "")),
            shutdown_grace_s=env_float(environ, "BEAR_SHUTDOWN_GRACE_S", d.shutdown_grace_s),
            redis=RedisConfig.from_environ(environ),
            discovery=DiscoveryConfig.from_environ(environ),
        )


def load(flags: Mapping[str, object], config_file: str | None = None,
         environ: Mapping[str, str] = os.environ) -> RouterConfig:
    """The settings from the flags given (by environment variable; None: not given), the environment and the file."""
    return load_layered(RouterConfig.from_environ, environ, config_file, flags, ENVIRONMENT, FLAGS)


def _policy_params(text: str) -> dict[str, dict[str, Any]]:
    if not text.strip():
        return {}
    try:
        params = strict_json.loads(text)
    except strict_json.JsonError as error:
        raise ValueError(f"BEAR_ROUTER_POLICY_PARAMS: {error}") from None
    if not isinstance(params, dict) or not all(isinstance(p, dict) for p in params.values()):
        raise ValueError('BEAR_ROUTER_POLICY_PARAMS must map policy names to parameters, e.g. {"bear": {"safety": 1.1}}')
    return params


def in_process_services(text: str) -> frozenset[str]:
    """'predictor,estimator' (any order and case, spaces allowed), one of them, or '' / 'none' for neither."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    if names == ["none"]:
        return frozenset()
    if "none" in names:
        raise ValueError(f"BEAR_ROUTER_IN_PROCESS: none stands alone (it names neither service), got {text!r}")
    unknown = [name for name in names if name not in IN_PROCESS_SERVICES]
    if unknown:
        raise ValueError(f"BEAR_ROUTER_IN_PROCESS: unknown service {unknown[0]!r}; name predictor, estimator, both "
                         "(predictor,estimator) or none")
    return frozenset(names)


def _ms(environ: Mapping[str, str], name: str, default_s: float) -> float:
    return env_float(environ, name, default_s * 1e3) / 1e3


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
