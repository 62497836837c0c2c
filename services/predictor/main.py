"""`bear serve predictor`: the wiring of the predictor service (configuration → artifact → servicer → server).

Module-level imports stay light (argparse and the configuration) because `bear` imports this module to build its
command line; the artifact, LightGBM and gRPC are imported when the service starts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bear.common.config_sources import add_flags, flag_values
from bear.predictor.config import FLAGS, PredictorServiceConfig, load

if TYPE_CHECKING:
    from bear.common.service import RunningServer, ServerSettings

logger = logging.getLogger("bear.predictor")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, FLAGS)


def run(args: argparse.Namespace) -> int:
    from bear.predictor.artifact import ArtifactError
    from bear.common.service import announce, configure_logging, run_event_loop

    configure_logging()
    try:
        config = load(flag_values(args, FLAGS), args.config)
        service = PredictorService(config)
    except (ValueError, ArtifactError, OSError) as error:
        print(f"bear serve predictor: {error}", file=sys.stderr)
        return 2
    run_event_loop(service.serve(on_ready=announce))
    return 0


class PredictorService:
    """The loaded artifact and its servicer. Loading fails with ArtifactError for a directory it cannot use."""

    def __init__(self, config: PredictorServiceConfig) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from bear.predictor.predictor import load_predictor
        from bear.predictor.server import PredictorServicer

        self.config = config
        self.predictor = load_predictor(Path(config.model_dir))
        self._executor = ThreadPoolExecutor(config.workers, thread_name_prefix="bear-predictor")
        self.servicer = PredictorServicer(self.predictor, self._executor, max_prompt_chars=config.max_prompt_chars,
                                          max_remaining_queries=config.max_remaining_queries)
        logger.info("predictor artifact %s: models %s", config.model_dir, ", ".join(self.predictor.catalog.names))

    def settings(self) -> ServerSettings:
        from bear.common.service import ServerSettings, receive_limit
        from bear.predictor.config import REMAINING_QUERY_BYTES

        c = self.config
        largest_field = max(4 * c.max_prompt_chars,  # UTF-8: up to 4 bytes a character
                            REMAINING_QUERY_BYTES * c.max_remaining_queries)
        return ServerSettings("bear-predictor", c.host, c.grpc_port, c.metrics_port, c.shutdown_grace_s,
                              receive_limit(largest_field))

    def register(self, server) -> list[str]:  # noqa: ANN001 - grpc.aio.Server
        from bear.predictor.server import register

        return register(self.servicer)(server)

    async def serve(self, on_ready: Callable[[int, int | None], None] = lambda port, metrics: None) -> None:
        """Serves until SIGTERM/SIGINT."""
        from bear.common.service import serve_until_stopped
        from bear.predictor.server import count_malformed

        try:
            await serve_until_stopped(self.settings(), self.register, on_ready,
                                      on_stop=[self.servicer.streams.close], on_malformed=count_malformed)
        finally:
            self.close()

    async def start(self) -> RunningServer:
        """Starts the server on the running loop (tests, `bear demo`): no signal handling, no /metrics server; stop
        it with `await running.stop()`, then `close()`."""
        from bear.common.service import start_server
        from bear.predictor.server import count_malformed

        return await start_server(self.settings(), self.register, [self.servicer.streams.close], count_malformed)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.predictor.close()
