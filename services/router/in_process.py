"""The predictor and the estimator inside the router's process (BEAR_ROUTER_IN_PROCESS): the same services as
`bear serve predictor` and `bear serve estimator` (their servicers answer the same request messages, they read their
own settings from the environment, the estimator's snapshot feed runs on the router's event loop), called without
gRPC. Each Route call then handles one gRPC message in and one out instead of three of each, at the price of every
router replica holding the predictor artifact and following every instance's snapshots itself.

Failures are those of the gRPC neighbours: a refusal, a deadline missed or an unexpected error is
`DependencyUnavailable`, and the router degrades alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bear.common.call_streams import CallFailed
from bear.router import wire
from bear.router.decision import DispatchRecord
from bear.router.signals import DependencyUnavailable, InstanceEstimate, ModelPrediction
from bear.router.upstream import DispatchProtos, first_clause

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from bear.estimator.main import EstimatorService
    from bear.predictor.main import PredictorService
    from bear.router.config import RouterConfig

logger = logging.getLogger("bear.router")


class InProcessPredictor:
    def __init__(self, service: PredictorService, timeout_s: float) -> None:
        self._service, self._timeout_s = service, timeout_s

    async def predict(self, prompt: str) -> dict[str, ModelPrediction]:
        answer = self._service.servicer.answer
        reply = await _called("predictor", lambda: answer(wire.predict_request(prompt)), self._timeout_s)
        return wire.predictions_from_proto(reply)

    async def close(self) -> None:
        await asyncio.to_thread(self._service.close)


class InProcessEstimator:
    def __init__(self, service: EstimatorService, timeout_s: float) -> None:
        self._service, self._timeout_s = service, timeout_s
        self._recent = DispatchProtos()

    async def estimate(self, query_id: str, prompt_tokens: int, output_tokens: float, instance_ids: Sequence[str],
                       horizon_ms: float, recent: Sequence[DispatchRecord] = (),
                       prefix_hashes: bytes = b"") -> dict[str, InstanceEstimate]:
        request = self._recent.estimate_request(query_id, prompt_tokens, output_tokens, instance_ids, horizon_ms,
                                                recent, prefix_hashes)
        answer = self._service.servicer.answer
        reply = await _called("estimator", lambda: answer(request), self._timeout_s)
        return wire.estimates_from_proto(reply)

    async def close(self) -> None:
        await self._service.close()


async def _called(service: str, call: Callable[[], Awaitable], timeout_s: float):  # noqa: ANN202 - the reply
    try:
        async with asyncio.timeout(timeout_s):
            return await call()
    except CallFailed as error:
        raise DependencyUnavailable(service, error.code.name, first_clause(error.message)) from None
    except TimeoutError:
        raise DependencyUnavailable(service, "DEADLINE_EXCEEDED", f"no answer within {timeout_s * 1000:g} ms") from None
    except Exception as error:  # noqa: BLE001 - a bug there must not fail the Route call: the router degrades
        logger.exception("the in-process %s failed", service)
        raise DependencyUnavailable(service, "INTERNAL", first_clause(f"{type(error).__name__}: {error}")) from None


@dataclass
class InProcess:
    """What the router runs in its own process: the adapters it calls, the feed to run, the metrics to unregister."""

    predictor: InProcessPredictor | None = None
    estimator: InProcessEstimator | None = None
    background: tuple[Callable[[], Awaitable[None]], ...] = ()
    unregister: Callable[[], None] = lambda: None


async def start(config: RouterConfig, environ: Mapping[str, str] = os.environ,
                registry: CollectorRegistry | None = None) -> InProcess:
    """Builds the services `config.in_process` names, with their settings from `environ` (Redis and discovery are the
    router's own). A setting or an artifact they cannot use is a ValueError naming it. Call on the router's loop."""
    built = InProcess()
    if "predictor" in config.in_process:
        built.predictor = InProcessPredictor(_predictor_service(environ), config.predictor_timeout_s)
    if "estimator" in config.in_process:
        try:
            service = await _estimator_service(config, environ)
        except BaseException:
            if built.predictor is not None:
                await built.predictor.close()
            raise
        built.estimator = InProcessEstimator(service, config.estimator_timeout_s)
        built.background = (service.run_background,)
        if registry is None:  # the process's default registry, where the estimator's own metrics are
            from bear.estimator.metrics import FeedCollector, register_feed

            built.unregister = register_feed(FeedCollector(service.estimator, service.feed, service.remaining))
    return built


def _predictor_service(environ: Mapping[str, str]) -> PredictorService:
    from bear.predictor.artifact import ArtifactError
    from bear.predictor.config import load
    from bear.predictor.main import PredictorService

    try:
        return PredictorService(load({}, None, environ))
    except (ValueError, ArtifactError, OSError) as error:
        raise ValueError(f"BEAR_ROUTER_IN_PROCESS=predictor: {error}") from None


async def _estimator_service(config: RouterConfig, environ: Mapping[str, str]) -> EstimatorService:
    from bear.estimator.config import load
    from bear.estimator.main import EstimatorService
    from bear.predictor.artifact import ArtifactError

    try:
        settings = dataclasses.replace(load({}, None, environ), redis=config.redis, discovery=config.discovery)
        service = EstimatorService(settings)
    except (ValueError, ArtifactError, OSError) as error:
        raise ValueError(f"BEAR_ROUTER_IN_PROCESS=estimator: {error}") from None
    try:
        service.start_discovery()
    except BaseException:  # e.g. ServiceStartError: its Redis connections close all the same
        await service.close()
        raise
    return service
