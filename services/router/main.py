"""`bear serve router`: the wiring. Configuration → discovery, Redis, predictor and estimator channels, policies,
tokenizer, telemetry → the Router and its gRPC server (bear.common.service: health, reflection, tracing, /metrics,
graceful shutdown).

Imports here stay light (the CLI imports this module to list its flags); the service's own modules are imported when
it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc
    import numpy as np
    from opentelemetry import trace
    from prometheus_client import CollectorRegistry

    from bear.common.service import RunningServer, ServerSettings
    from bear.router.config import RouterConfig
    from bear.router.router import Router

logger = logging.getLogger("bear.router")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bear.common.config_sources import add_flags
    from bear.router.config import FLAGS

    add_flags(parser, FLAGS)


def run(args: argparse.Namespace) -> int:
    from bear.discovery.pools import PoolsFileError
    from bear.common.config_sources import flag_values
    from bear.router.config import FLAGS, load
    from bear.common.service import configure_logging, run_event_loop

    configure_logging()
    try:
        config = load(flag_values(args, FLAGS), args.config)
        run_event_loop(serve(config))
    except PoolsFileError as error:
        print(f"bear serve router: --pools-file: {error}", file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"bear serve router: {error}", file=sys.stderr)
        return 2
    return 0


@dataclass
class RouterApp:
    """A built router, not serving yet: register it on a server, run `background`, `close` at the end."""

    router: Router
    register: Callable[[grpc.aio.Server], list[str]]
    background: list[Callable[[], Awaitable[None]]]
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # as the server stops: end streams
    on_malformed: Callable[[str], None] | None = None  # a request that did not decode, by its full method name

    async def close(self) -> None:
        await _close_all(self.closers)


async def build(config: RouterConfig, registry: CollectorRegistry | None = None,
                tracer: trace.Tracer | None = None) -> RouterApp:
    """Everything the router needs, built from its settings (call from the event loop that will serve it)."""
    from opentelemetry import trace as otel_trace
    from prometheus_client import REGISTRY
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from bear.common.redis_config import connect_async
    from bear.common.service import ServiceStartError
    from bear.discovery.factory import open_discovery
    from bear.router import in_process, server, upstream
    from bear.router.pool import InstancePool
    from bear.router.query import Limits
    from bear.router.router import Estimates, Predictions, Router, RouterSettings
    from bear.router.store import RedisStore
    from bear.router.telemetry import RouterMetrics, Telemetry

    policies, fallback = build_policies(config)
    tokenize = prompt_tokenizer(config.tokenizer)
    discovery = open_discovery(config.discovery)
    try:
        discovery.start()
    except Exception as error:  # noqa: BLE001 - e.g. kubernetes outside a cluster: no service account, no kubeconfig
        raise ServiceStartError(f"bear serve router: BEAR_DISCOVERY={config.discovery.mode}: discovery "
                                f"cannot start ({type(error).__name__}: {error})") from None
    closers: list[Callable[[], Awaitable[None]]] = [lambda: asyncio.to_thread(discovery.stop)]
    try:  # whatever was built is closed again if a later part fails
        await asyncio.to_thread(discovery.wait_until_synced, 10.0)
        # Before Redis: the embedded one would start first, and outlive a start-up interrupted while artifacts load.
        local = await in_process.start(config, discovery, registry=registry)
        closers.append(local.close)
        client = connect_async(config.redis)
        client.set_retry(Retry(NoBackoff(), 0))  # one attempt per deadline; the store backs off
        store = RedisStore(client, config.redis_timeout_s)
        closers.append(store.close)
        telemetry = Telemetry(tracer or otel_trace.get_tracer("bear.router"),
                              RouterMetrics(REGISTRY if registry is None else registry))
        predictor: Predictions = local.predictor or _closed_with(
            closers, upstream.GrpcPredictor(config.predictor_address, config.predictor_timeout_s,
                                            config.call_streams, telemetry.tracing, config.upstream_streams))
        estimator: Estimates = local.estimator or _closed_with(
            closers, upstream.GrpcEstimator(config.estimator_address, config.estimator_timeout_s,
                                            config.call_streams, telemetry.tracing, config.upstream_streams))
        settings = RouterSettings(config.default_policy, config.lambda_per_micro_usd, config.horizon_factor,
                                  config.default_output_tokens,
                                  Limits(config.max_ttft_slo_ms, config.max_prompt_bytes, config.max_prompt_tokens),
                                  config.fallback_snapshot_max_age_s, config.ttft_feedback_window,
                                  config.recent_dispatches_s)
        router = Router(settings, InstancePool(discovery.instances, discovery.pools, config.forget_after_s),
                        predictor, estimator, store, policies, fallback, telemetry, tokenize)
        closers.append(router.close)
    except BaseException:
        await _close_all(closers)
        raise
    logger.info("router: predictor %s, estimator %s, Redis %s, %d pool(s) (%s discovery), default policy %s, "
                "fallback %s", _where(config, "predictor"), _where(config, "estimator"), config.redis.describe(),
                len(discovery.pools), config.discovery.mode, config.default_policy, config.fallback_policy)
    servicer = server.RouterServicer(router)
    return RouterApp(router, lambda grpc_server: server.register(grpc_server, servicer),
                     [lambda: router.refresh_forever(config.refresh_interval_s), *local.background], closers,
                     [servicer.streams.close], servicer.malformed)


def _closed_with(closers: list[Callable[[], Awaitable[None]]], neighbour: Any) -> Any:  # noqa: ANN401
    """`neighbour`, its `close` added to `closers`."""
    closers.append(neighbour.close)
    return neighbour


def _where(config: RouterConfig, service: str) -> str:
    if service in config.in_process:
        return "in-process"
    return config.predictor_address if service == "predictor" else config.estimator_address


async def _close_all(closers: list[Callable[[], Awaitable[None]]]) -> None:
    for close in reversed(closers):
        try:
            await close()
        except Exception:  # noqa: BLE001 - closing the rest matters more
            logger.exception("closing the router")


def build_policies(config: RouterConfig) -> tuple[dict[str, Any], Any]:
    """One instance of every registered policy (with the configured parameters) and the fallback's own instance."""
    from bear.routing.registry import build_policy, policy_names

    names = policy_names()
    unknown = sorted(set(config.policy_params) - set(names))
    if unknown:
        raise ValueError(f"BEAR_ROUTER_POLICY_PARAMS: unknown policy {unknown[0]!r}; choose among: {', '.join(names)}")
    for setting, name in (("BEAR_DEFAULT_POLICY", config.default_policy),
                          ("BEAR_FALLBACK_POLICY", config.fallback_policy)):
        if name not in names:
            raise ValueError(f"{setting}: unknown policy {name!r}; choose one of: {', '.join(names)}")
    policies = {name: _built_policy(build_policy, name, config.policy_params.get(name)) for name in names}
    fallback = _built_policy(build_policy, config.fallback_policy, config.policy_params.get(config.fallback_policy))
    return policies, fallback


def _built_policy(build_policy: Callable[..., Any], name: str, params: dict[str, Any] | None) -> Any:
    """One policy with its BEAR_ROUTER_POLICY_PARAMS; a ValueError naming the variable, the policy and the parameter
    when they do not make one."""
    try:
        return build_policy(name, params)
    except (TypeError, ValueError) as error:
        named = str(error).startswith(f"policy {name!r}")
        raise ValueError(f"BEAR_ROUTER_POLICY_PARAMS: {'' if named else f'policy {name!r}: '}{error}") from None


def prompt_tokenizer(name: str) -> Callable[[str], np.ndarray]:
    """A prompt's token keys (the estimator needs a length and the prefix blocks before the predictor answers)."""
    from bear.predictor.tokenizers import get_tokenizer

    return get_tokenizer(name).token_keys


async def serve(config: RouterConfig) -> None:
    from bear.common.service import announce, configure_tracing, serve_until_stopped

    configure_tracing("bear-router")
    app = await build(config)
    settings = server_settings(config, config.metrics_port)
    try:
        await serve_until_stopped(settings, app.register, on_ready=announce, background=app.background,
                                  on_stop=app.on_stop, on_malformed=app.on_malformed)
    finally:
        await app.close()


@dataclass
class RunningRouter:
    """A router serving on a loop already running (tests, benchmarks): its port, its router, and `stop`."""

    app: RouterApp
    server: RunningServer
    tasks: list[asyncio.Task[None]]

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def router(self) -> Router:
        return self.app.router

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        try:
            await self.server.stop()
        finally:  # its Redis connections and channels close even if stopping the server failed
            await self.app.close()


async def start(config: RouterConfig, registry: CollectorRegistry | None = None,
                tracer: trace.Tracer | None = None) -> RunningRouter:
    from bear.common.service import start_server

    app = await build(config, registry, tracer)
    settings = server_settings(config, None)
    try:
        running = await start_server(settings, app.register, app.on_stop, app.on_malformed)
    except BaseException:  # e.g. ServiceStartError: its Redis connections and channels close all the same
        await app.close()
        raise
    tasks = [asyncio.create_task(task()) for task in app.background]
    return RunningRouter(app, running, tasks)


def server_settings(config: RouterConfig, metrics_port: int | None) -> ServerSettings:
    from bear.common.service import ServerSettings, receive_limit

    return ServerSettings("bear-router", config.host, config.grpc_port, metrics_port, config.shutdown_grace_s,
                          receive_limit(config.max_prompt_bytes))
