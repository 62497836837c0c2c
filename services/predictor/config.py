"""Settings of the predictor service (`bear serve predictor`), read once at start-up: the only place in the predictor
that reads the environment.

Flags over the environment over an optional YAML file (`bear.common.config_sources`; in the file, the names below
without BEAR_, in lower case):

    BEAR_PREDICTOR_MODEL_DIR             the artifact (`bear predictor train --out DIR`), required  --model-dir
    BEAR_PREDICTOR_HOST                  listen address (default [::])                               --host
    BEAR_PREDICTOR_GRPC_PORT             gRPC port, 0 for any free one (default 50053)               --grpc-port
    BEAR_PREDICTOR_METRICS_PORT          Prometheus /metrics port, 0 for any, off for none (9464)    --metrics-port
    BEAR_PREDICTOR_WORKERS               threads that run Predict (tokenising, LightGBM; default 4, at most 1024)
    BEAR_PREDICTOR_MAX_PROMPT_CHARS      longer prompts are INVALID_ARGUMENT (default 1,000,000, at most 64 Mi)
    BEAR_PREDICTOR_MAX_REMAINING_QUERIES most queries in one ExpectedRemaining call (default 100,000)
    BEAR_SHUTDOWN_GRACE_S                calls in flight may finish this long after SIGTERM (default 5)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from bear.common.config_sources import (env_float, env_int, env_optional_port, load_layered, port_problem,
                                        shutdown_grace_problem)

MAX_PROMPT_CHARS_LIMIT = 64 * 1024 * 1024
# One ExpectedRemaining query on the wire at most: a model name (~100 bytes for the longest Hugging Face ids), a double,
# two varints, tags and lengths. The server's message limit makes room for BEAR_PREDICTOR_MAX_REMAINING_QUERIES of
# them, and that many must fit in one gRPC message (< 2 GiB).
REMAINING_QUERY_BYTES = 256
MAX_REMAINING_QUERIES_LIMIT = 4_000_000
# BEAR_PREDICTOR_WORKERS at most: each is a thread with its own stack; far more than any machine has cores, far fewer
# than would exhaust its memory or thread limit (QA: 100,000,000 was taken)
MAX_WORKERS = 1024
ENVIRONMENT = (
    "BEAR_PREDICTOR_MODEL_DIR", "BEAR_PREDICTOR_HOST", "BEAR_PREDICTOR_GRPC_PORT", "BEAR_PREDICTOR_METRICS_PORT",
    "BEAR_PREDICTOR_WORKERS", "BEAR_PREDICTOR_MAX_PROMPT_CHARS", "BEAR_PREDICTOR_MAX_REMAINING_QUERIES",
    "BEAR_SHUTDOWN_GRACE_S",
)
FLAGS = {  # flag → (environment variable, help)
    "--model-dir": ("BEAR_PREDICTOR_MODEL_DIR", "the predictor artifact directory (bear predictor train --out)"),
    "--grpc-port": ("BEAR_PREDICTOR_GRPC_PORT", "gRPC port, 0 for any free one (default 50053)"),
    "--metrics-port": ("BEAR_PREDICTOR_METRICS_PORT", "Prometheus /metrics port, 0 for any, off for none (9464)"),
    "--host": ("BEAR_PREDICTOR_HOST", "listen address (default [::])"),
}


@dataclass(frozen=True, slots=True)
class PredictorServiceConfig:
    model_dir: str
    host: str = "[::]"
    grpc_port: int = 50053
    metrics_port: int | None = 9464
    workers: int = 4
    max_prompt_chars: int = 1_000_000
    max_remaining_queries: int = 100_000
    shutdown_grace_s: float = 5.0

    def __post_init__(self) -> None:
        _require(bool(self.model_dir), "BEAR_PREDICTOR_MODEL_DIR (--model-dir) is required: the artifact to serve")
        for problem in (port_problem("BEAR_PREDICTOR_GRPC_PORT", self.grpc_port),
                        port_problem("BEAR_PREDICTOR_METRICS_PORT", self.metrics_port, off_allowed=True)):
            _require(problem is None, problem or "")
        _require(1 <= self.workers <= MAX_WORKERS,
                 f"BEAR_PREDICTOR_WORKERS must be in [1, {MAX_WORKERS}] (threads), got {self.workers}")
        _require(1 <= self.max_prompt_chars <= MAX_PROMPT_CHARS_LIMIT,
                 f"BEAR_PREDICTOR_MAX_PROMPT_CHARS must be in [1, {MAX_PROMPT_CHARS_LIMIT}] "
                 "(gRPC's messages stay under 2 GiB)")
        _require(1 <= self.max_remaining_queries <= MAX_REMAINING_QUERIES_LIMIT,
                 f"BEAR_PREDICTOR_MAX_REMAINING_QUERIES must be in [1, {MAX_REMAINING_QUERIES_LIMIT}] (one gRPC "
                 f"message carries them), got {self.max_remaining_queries}")
        grace = shutdown_grace_problem(self.shutdown_grace_s)
        _require(grace is None, grace or "")

    @staticmethod
    def from_environ(environ: Mapping[str, str]) -> PredictorServiceConfig:
        d = PredictorServiceConfig(model_dir="-")
        return PredictorServiceConfig(
            model_dir=environ.get("BEAR_PREDICTOR_MODEL_DIR", "").strip(),
            host=environ.get("BEAR_PREDICTOR_HOST") or d.host,
            grpc_port=env_int(environ, "BEAR_PREDICTOR_GRPC_PORT", d.grpc_port),
            metrics_port=env_optional_port(environ, "BEAR_PREDICTOR_METRICS_PORT", d.metrics_port),
            workers=env_int(environ, "BEAR_PREDICTOR_WORKERS", d.workers),
            max_prompt_chars=env_int(environ, "BEAR_PREDICTOR_MAX_PROMPT_CHARS", d.max_prompt_chars),
            max_remaining_queries=env_int(environ, "BEAR_PREDICTOR_MAX_REMAINING_QUERIES", d.max_remaining_queries),
            shutdown_grace_s=env_float(environ, "BEAR_SHUTDOWN_GRACE_S", d.shutdown_grace_s),
        )


def load(flags: Mapping[str, object], config_file: str | None = None,
         environ: Mapping[str, str] = os.environ) -> PredictorServiceConfig:
    """The settings from the flags given (by environment variable; None: not given), the environment and the file."""
    return load_layered(PredictorServiceConfig.from_environ, environ, config_file, flags, ENVIRONMENT, FLAGS)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
