"""`bear serve estimator`: the wiring of the estimator service (configuration → domain, feed, servicer → server).

Module-level imports stay light (argparse and the configuration) because `bear` imports this module to build its
command line; the rest is imported when the service starts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from bear.common.config_sources import add_flags, flag_values
from bear.estimator.config import FLAGS, EstimatorConfig, load

if TYPE_CHECKING:
    from bear.common.service import RunningServer, ServerSettings
    from bear.discovery.instances import Discovery
    from bear.predictor.artifact import PredictorArtifact

logger = logging.getLogger("bear.estimator")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, FLAGS)


def run(args: argparse.Namespace) -> int:
    from bear.common.service import announce, configure_logging, run_event_loop
    from bear.discovery.pools import PoolsFileError
    from bear.predictor.artifact import ArtifactError

    configure_logging()
    try:
        config = load(flag_values(args, FLAGS), args.config)
    except ValueError as error:
        return _bad_input(str(error))
    try:
        run_event_loop(serve(config, on_ready=announce))
    except PoolsFileError as error:  # read when the service is built
        return _bad_input(f"--pools-file: {error}")
    except ArtifactError as error:
        return _bad_input(f"--predictor-model-dir: {error}")
    return 0


def _bad_input(message: str) -> int:
    print(f"bear serve estimator: {message}", file=sys.stderr)
    return 2


class EstimatorService:
    """Everything one estimator runs: the estimator, its Redis feed, remaining lengths, the servicer. Build it on
    the event loop that will run it. `discovery`: one its host runs already (the router, with the estimator in its
    process), which it reads but neither starts nor stops; by default its own, from the settings. `artifact`: the
    predictor artifact of `config.predictor_model_dir` where its host has loaded it already (not loaded again)."""

    def __init__(self, config: EstimatorConfig, clock: Callable[[], float] = time.time,
                 discovery: Discovery | None = None, artifact: PredictorArtifact | None = None) -> None:
        from bear.common import redis_keys
        from bear.common.redis_config import connect_async
        from bear.estimator.estimation import Estimator
        from bear.estimator.remaining import RemainingLengths
        from bear.estimator.request_ids import router_request_id
        from bear.estimator.server import EstimatorServicer
        from bear.estimator.snapshot_feed import FeedSettings, SnapshotFeed

        self.config = config
        source, mean_lengths, self._close_source = _remaining_source(config, artifact)
        self.remaining = RemainingLengths(source)
        self.estimator = Estimator(self.remaining.lookup, mean_lengths, max_snapshot_age_s=config.max_snapshot_age_s,
                                   dispatch_ttl_s=redis_keys.DISPATCH_TTL_S, request_key=router_request_id,
                                   default_output_tokens=config.default_output_tokens)
        self.redis = connect_async(config.redis)
        self._owns_discovery = discovery is None
        self.discovery = _discovery(config) if discovery is None else discovery
        self.feed = SnapshotFeed(
            self.estimator, self.redis, self.remaining,
            FeedSettings(resync_interval_s=config.resync_interval_s,
                         dispatch_poll_interval_s=config.dispatch_poll_interval_s,
                         redis_deadline_s=config.redis.timeout_s, forget_after_s=config.forget_after_s,
                         lps_window_s=config.lps_window_s),
            request_key=router_request_id, listed_instances=self._listed_instances, clock=clock)
        self.servicer = EstimatorServicer(self.estimator, clock, self.feed.record_dispatch)

    def settings(self, service_name: str = "bear-estimator") -> ServerSettings:
        from bear.common.service import ServerSettings

        c = self.config
        return ServerSettings(service_name, c.host, c.grpc_port, c.metrics_port, c.shutdown_grace_s)

    def register(self, server) -> list[str]:  # noqa: ANN001 - grpc.aio.Server
        from bear.estimator.server import register

        return register(self.servicer)(server)

    def start_discovery(self) -> None:
        """Starts discovery's watchers; a discovery that cannot start (kubernetes outside a cluster: no service
        account, no kubeconfig) is a ServiceStartError, as in the router: the setting asks for what cannot be."""
        from bear.common.service import ServiceStartError

        if self.discovery is None or not self._owns_discovery:
            return
        try:
            self.discovery.start()
        except Exception as error:  # noqa: BLE001 - e.g. kubernetes' ConfigException
            raise ServiceStartError(f"bear serve estimator: BEAR_DISCOVERY={self.config.discovery.mode}: discovery "
                                    f"cannot start ({type(error).__name__}: {error})") from None

    async def run_background(self) -> None:
        """The feed until cancelled (discovery's watchers run on their own threads)."""
        await self.feed.run()

    async def close(self) -> None:
        if self.discovery is not None and self._owns_discovery:
            self.discovery.stop()
        await self._close_source()
        await self.redis.aclose()

    def _listed_instances(self) -> dict[str, str]:
        if self.discovery is None:
            return {}
        return {i: instance.model for i, instance in self.discovery.instances().items()}


class StartedEstimator:
    """A running estimator (tests, `bear demo`): its port; `stop()` ends it."""

    def __init__(self, service: EstimatorService, running: RunningServer, feed_task: asyncio.Task[None]) -> None:
        self.service, self.running, self._feed_task = service, running, feed_task
        self.port = running.port

    async def stop(self) -> None:
        self._feed_task.cancel()
        await asyncio.gather(self._feed_task, return_exceptions=True)
        try:
            await self.running.stop()
        finally:  # its Redis connections close even if stopping the server failed
            await self.service.close()


async def start(config: EstimatorConfig, clock: Callable[[], float] = time.time) -> StartedEstimator:
    """Starts the server and the feed on the running loop (no signal handling, no /metrics server); `clock` is the
    wall clock (Unix seconds) snapshots are aged by."""
    from bear.common.service import start_server
    from bear.estimator.server import count_malformed

    service = EstimatorService(config, clock)
    try:
        service.start_discovery()
        running = await start_server(service.settings(), service.register, [service.servicer.streams.close],
                                     count_malformed)
    except BaseException:  # e.g. ServiceStartError: its Redis connections close all the same
        await service.close()
        raise
    return StartedEstimator(service, running, asyncio.create_task(service.run_background()))


async def serve(config: EstimatorConfig,
                on_ready: Callable[[int, int | None], None] = lambda port, metrics: None) -> None:
    """Serves until SIGTERM/SIGINT."""
    from bear.common.service import serve_until_stopped
    from bear.estimator.metrics import FeedCollector, register_feed
    from bear.estimator.server import count_malformed

    service = EstimatorService(config)
    try:
        service.start_discovery()
    except BaseException:
        await service.close()
        raise
    unregister = register_feed(FeedCollector(service.estimator, service.feed, service.remaining))
    logger.info("estimator: Redis %s, remaining lengths from %s, snapshots older than %.2f s fall back to LPS",
                config.redis.describe(), remaining_description(config), config.max_snapshot_age_s)
    try:
        await serve_until_stopped(service.settings(), service.register, on_ready, [service.run_background],
                                  [service.servicer.streams.close], count_malformed)
    finally:
        unregister()
        await service.close()


def _remaining_source(config: EstimatorConfig,  # noqa: ANN202 - (source | None, mean lengths, async close)
                      artifact: PredictorArtifact | None = None):
    """Where residents' remaining lengths come from: the artifact here, else the predictor service, else none (the
    stated fallback)."""
    from pathlib import Path

    from bear.estimator.remaining import artifact_source

    async def nothing_to_close() -> None:
        return None

    if config.predictor_model_dir:
        from bear.predictor.artifact import PredictorArtifact

        artifact = artifact or PredictorArtifact.load(Path(config.predictor_model_dir))
        mean_lengths = {name: baseline.output_tokens for name, baseline in artifact.baselines.items()}
        return artifact_source(artifact.length_distributions), mean_lengths, nothing_to_close
    if config.predictor_address:
        from bear.estimator.predictor_client import PredictorRemainingClient

        client = PredictorRemainingClient(config.predictor_address, config.predictor_timeout_s)
        return client, {}, client.close
    return None, {}, nothing_to_close


def remaining_description(config: EstimatorConfig) -> str:
    if config.predictor_model_dir:
        return f"the predictor artifact {config.predictor_model_dir}"
    if config.predictor_address:
        return f"the predictor service at {config.predictor_address}"
    return "no predictor (fallback: predicted length minus generated tokens)"


def _discovery(config: EstimatorConfig) -> Discovery | None:
    if config.discovery.mode == "static" and not config.discovery.pools_file:
        return None
    from bear.discovery.factory import open_discovery

    return open_discovery(config.discovery)
