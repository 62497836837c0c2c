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
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from bear.common.call_streams import CallFailed
from bear.router import wire
from bear.router.decision import DispatchRecord
from bear.router.router import MAX_RECENT_DISPATCHES
from bear.router.signals import DependencyUnavailable, InstanceEstimate, ModelPrediction
from bear.router.upstream import DispatchProtos, first_clause

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from bear.discovery.instances import Discovery
    from bear.estimator.main import EstimatorService
    from bear.predictor.artifact import PredictorArtifact
    from bear.predictor.main import PredictorService
    from bear.router.config import RouterConfig

logger = logging.getLogger("bear.router")
PASSED_IDS = 4 * MAX_RECENT_DISPATCHES  # remembered: more than the dispatches recent enough to go along with a call


class InProcessPredictor:
    def __init__(self, service: PredictorService, timeout_s: float) -> None:
        from bear.predictor.server import count_predict_error

        self._service, self._timeout_s, self._on_error = service, timeout_s, count_predict_error

    @property
    def artifact(self) -> PredictorArtifact:
        return self._service.predictor.artifact

    async def predict(self, prompt: str) -> dict[str, ModelPrediction]:
        answer = self._service.servicer.answer
        reply = await _called("predictor", lambda: answer(wire.predict_request(prompt)), self._timeout_s,
                              self._on_error)
        return wire.predictions_from_proto(reply)

    async def close(self) -> None:
        await asyncio.to_thread(self._service.close)


class InProcessEstimator:
    """The router's latest dispatches go along with a call once each: the estimator here is the only one they are
    for, and records them as the standalone service does (not again for every call made while they are recent)."""

    def __init__(self, service: EstimatorService, timeout_s: float) -> None:
        from bear.estimator.server import count_error

        self._service, self._timeout_s, self._on_error = service, timeout_s, count_error
        self._recent = DispatchProtos()
        self._passed: OrderedDict[str, None] = OrderedDict()  # request ids of the latest dispatches passed on

    async def estimate(self, query_id: str, prompt_tokens: int, output_tokens: float, instance_ids: Sequence[str],
                       horizon_ms: float, recent: Sequence[DispatchRecord] = (),
                       prefix_hashes: bytes = b"") -> dict[str, InstanceEstimate]:
        request = self._recent.estimate_request(query_id, prompt_tokens, output_tokens, instance_ids, horizon_ms,
                                                self._not_passed(recent), prefix_hashes)
        answer = self._service.servicer.answer
        reply = await _called("estimator", lambda: answer(request), self._timeout_s, self._on_error)
        return wire.estimates_from_proto(reply)

    def _not_passed(self, recent: Sequence[DispatchRecord]) -> list[DispatchRecord]:
        new = [record for record in recent if record.request_id not in self._passed]
        for record in new:
            self._passed[record.request_id] = None
        while len(self._passed) > PASSED_IDS:
            self._passed.popitem(last=False)
        return new

    async def close(self) -> None:
        await self._service.close()


async def _called(service: str, call: Callable[[], Awaitable], timeout_s: float,  # noqa: ANN202 - the reply
                  on_error: Callable[[grpc.StatusCode], None]):
    """The reply of `call`; its failures counted as the service's gRPC face counts them (`on_error`) and raised as
    DependencyUnavailable. The deadline ends what awaits (a long prompt on the predictor's threads); work that runs
    on the loop without awaiting, an Estimate or a short prompt's Predict, cannot be interrupted and ends first."""
    try:
        async with asyncio.timeout(timeout_s):
            return await call()
    except CallFailed as error:
        on_error(error.code)
        raise DependencyUnavailable(service, error.code.name, first_clause(error.message)) from None
    except TimeoutError:
        on_error(grpc.StatusCode.DEADLINE_EXCEEDED)
        raise DependencyUnavailable(service, "DEADLINE_EXCEEDED", f"no answer within {timeout_s * 1000:g} ms") from None
    except Exception as error:  # noqa: BLE001 - a bug there must not fail the Route call: the router degrades
        logger.exception("the in-process %s failed", service)
        on_error(grpc.StatusCode.INTERNAL)
        raise DependencyUnavailable(service, "INTERNAL", first_clause(f"{type(error).__name__}: {error}")) from None


@dataclass
class InProcess:
    """What the router runs in its own process: the adapters it calls, the feed to run, and how to close them all
    (`close`, also when the router's start fails after them)."""

    predictor: InProcessPredictor | None = None
    estimator: InProcessEstimator | None = None
    background: tuple[Callable[[], Awaitable[None]], ...] = ()
    unregister: Callable[[], None] = lambda: None

    async def close(self) -> None:
        self.unregister()
        for service in (self.estimator, self.predictor):
            if service is not None:
                try:
                    await service.close()
                except Exception:  # noqa: BLE001 - closing the other matters more
                    logger.exception("closing the in-process services")


# Settings of the in-process services that do not apply there (they serve no port of their own): not read, so that
# an environment shared with the standalone services starts the router whatever they say.
UNUSED = ("BEAR_ESTIMATOR_HOST", "BEAR_ESTIMATOR_GRPC_PORT", "BEAR_ESTIMATOR_METRICS_PORT", "BEAR_PREDICTOR_HOST",
          "BEAR_PREDICTOR_GRPC_PORT", "BEAR_PREDICTOR_METRICS_PORT")


async def start(config: RouterConfig, discovery: Discovery, environ: Mapping[str, str] = os.environ,
                registry: CollectorRegistry | None = None) -> InProcess:
    """Builds the services `config.in_process` names, with their settings from `environ` (Redis and discovery are the
    router's own: `discovery` is the router's, started). A setting or an artifact they cannot use is a ValueError
    naming it. Call on the router's loop."""
    environ = {name: value for name, value in environ.items() if name not in UNUSED}
    built = InProcess()
    try:
        if "predictor" in config.in_process:
            built.predictor = InProcessPredictor(_predictor_service(environ), config.predictor_timeout_s)
        if "estimator" in config.in_process:
            loaded = built.predictor.artifact if built.predictor is not None else None
            service = _estimator_service(config, environ, discovery, loaded)
            built.estimator = InProcessEstimator(service, config.estimator_timeout_s)
            built.background = (service.run_background,)
            if registry is None:  # the process's default registry, where the estimator's own metrics are
                from bear.estimator.metrics import FeedCollector, register_feed

                built.unregister = register_feed(FeedCollector(service.estimator, service.feed, service.remaining))
    except BaseException:
        await built.close()
        raise
    return built


def _predictor_service(environ: Mapping[str, str]) -> PredictorService:
    from bear.predictor.artifact import ArtifactError
    from bear.predictor.config import load
    from bear.predictor.main import PredictorService

    if not environ.get("BEAR_PREDICTOR_MODEL_DIR", "").strip():
        raise ValueError("BEAR_ROUTER_IN_PROCESS=predictor: BEAR_PREDICTOR_MODEL_DIR is required: the predictor "
                         "artifact to load (bear predictor train --out DIR)")
    try:
        return PredictorService(load({}, None, environ))
    except (ValueError, ArtifactError, OSError) as error:
        raise ValueError(f"BEAR_ROUTER_IN_PROCESS=predictor: {error}") from None


def _estimator_service(config: RouterConfig, environ: Mapping[str, str], discovery: Discovery,
                       loaded: PredictorArtifact | None) -> EstimatorService:
    """Residents' remaining lengths come from the estimator's own settings (BEAR_PREDICTOR_MODEL_DIR, then
    BEAR_PREDICTOR_ADDRESS) or, where they name neither, from the predictor the router calls. `loaded`: the
    in-process predictor's artifact, which BEAR_PREDICTOR_MODEL_DIR names for both (not loaded twice)."""
    from bear.estimator.config import load
    from bear.estimator.main import EstimatorService, remaining_description
    from bear.predictor.artifact import ArtifactError

    try:
        settings = dataclasses.replace(load({}, None, environ), redis=config.redis, discovery=config.discovery)
        if not (settings.predictor_model_dir or settings.predictor_address or "predictor" in config.in_process):
            settings = dataclasses.replace(settings, predictor_address=config.predictor_address)
        service = EstimatorService(settings, discovery=discovery, artifact=loaded)
    except (ValueError, ArtifactError, OSError) as error:
        raise ValueError(f"BEAR_ROUTER_IN_PROCESS=estimator: {error}") from None
    logger.info("in-process estimator: remaining lengths from %s, snapshots older than %.2f s fall back to LPS",
                remaining_description(settings), settings.max_snapshot_age_s)
    return service
