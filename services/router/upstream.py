"""The predictor and the estimator as the router calls them: over `streams` long-lived streams of calls each, taken
in turn (`bear.common.call_streams`: spread round-robin over the replicas behind one name; unary calls where
configured off, or where a server has no stream twin), carrying the trace context, a deadline on every call, and
every failure turned into `DependencyUnavailable` (the router then degrades); their channels built again after 2 s
of UNAVAILABLE (`REBUILD_AFTER_S`)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import grpc

from bear.common.call_streams import CallFailed, CallStream, StreamedMethod
from bear.common.channels import CLIENT_CHANNEL_OPTIONS
from bear.common.service import client_interceptors
from bear.router import wire
from bear.router.decision import DispatchRecord
from bear.router.signals import DependencyUnavailable, InstanceEstimate, ModelPrediction
from bear.v1 import estimator_pb2, estimator_pb2_grpc, predictor_pb2, predictor_pb2_grpc, router_pb2

PREDICTOR = predictor_pb2.DESCRIPTOR.services_by_name["Predictor"].full_name
ESTIMATOR = estimator_pb2.DESCRIPTOR.services_by_name["Estimator"].full_name
Request = TypeVar("Request")
Response = TypeVar("Response")
RECENT_PROTOS = 256  # dispatches kept converted for the next Estimate calls (more than a call sends)

CHANNEL_OPTIONS = (*CLIENT_CHANNEL_OPTIONS, ("grpc.enable_retries", 0))


# gRPC's DNS resolver retries a name that resolved to nothing (a headless Service without a ready pod) after a back-off
# that grows to 2 minutes, and takes no channel option to shorten it: a neighbour failing UNAVAILABLE this long gets
# new channels, which resolve its name at once, at most this often.
REBUILD_AFTER_S = 2.0


class _Channels:
    """A neighbour's channels: unary calls' carries the OpenTelemetry interceptors when tracing is on (each call a
    child span with the trace context; with the SDK disabled there is no context to carry, and the interceptors would
    only cost time); the streams of calls get a plain one, as they trace each call themselves. On a channel with
    interceptors gRPC passes every write of a stream through a queue and a task of its own, and leaves that task
    pending for good when the stream ends abruptly (its neighbour died): destroyed later with errors in the log."""

    def __init__(self, address: str, traced: bool) -> None:
        self.streams = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.unary = (grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=client_interceptors())
                      if traced else self.streams)

    async def close(self) -> None:
        for channel in {id(c): c for c in (self.unary, self.streams)}.values():
            await channel.close()


class _Neighbour(Generic[Request, Response]):
    """One method of a neighbour, called over `streams` streams of calls (or unary), every failure `CallFailed`; its
    channels built again once it has failed UNAVAILABLE for `REBUILD_AFTER_S` (see there)."""

    def __init__(self, address: str, traced: bool, streamed: bool, streams: int, stream_method: str,
                 call_type: Any, result_type: Any, unary: Callable[[grpc.aio.Channel], Any],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._build = functools.partial(self._connect, address, traced, streamed, streams, stream_method, call_type,
                                        result_type, unary)
        self._channels, self._method = self._build()
        self._clock = clock
        self._failing_since: float | None = None  # of the current run of UNAVAILABLE answers
        self._closing: set[asyncio.Task[None]] = set()
        self.rebuilt = 0

    @staticmethod
    def _connect(address: str, traced: bool, streamed: bool, streams: int, stream_method: str, call_type: Any,
                 result_type: Any, unary: Callable[[grpc.aio.Channel], Any]
                 ) -> tuple[_Channels, StreamedMethod[Any, Any]]:
        channels = _Channels(address, traced)
        stream = CallStream(channels.streams, stream_method, call_type, result_type, traced,
                            width=streams) if streamed else None
        return channels, StreamedMethod(unary(channels.unary), stream)

    async def __call__(self, request: Request, timeout_s: float) -> Response:
        try:
            response: Response = await self._method(request, timeout_s)
        except CallFailed as error:
            if error.code is grpc.StatusCode.UNAVAILABLE:
                self._unavailable()
            raise
        self._failing_since = None
        return response

    def _unavailable(self) -> None:
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since >= REBUILD_AFTER_S:
            old = (self._channels, self._method)
            self._channels, self._method = self._build()
            self._failing_since, self.rebuilt = now, self.rebuilt + 1
            task = asyncio.ensure_future(self._close(*old))  # calls still on them end with them
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(channels: _Channels, method: StreamedMethod[Any, Any]) -> None:
        await method.close()
        await channels.close()

    async def close(self) -> None:
        await asyncio.gather(*self._closing, return_exceptions=True)
        await self._close(self._channels, self._method)


class GrpcPredictor:
    def __init__(self, address: str, timeout_s: float, streamed: bool = True, traced: bool = True,
                 streams: int = 1) -> None:
        self._predict: _Neighbour[predictor_pb2.PredictRequest, predictor_pb2.PredictResponse] = _Neighbour(
            address, traced, streamed, streams, f"/{PREDICTOR}/PredictStream", predictor_pb2.PredictCall,
            predictor_pb2.PredictResult, lambda channel: predictor_pb2_grpc.PredictorStub(channel).Predict)
        self._timeout_s = timeout_s

    async def predict(self, prompt: str) -> dict[str, ModelPrediction]:
        try:
            reply = await self._predict(wire.predict_request(prompt), self._timeout_s)
        except CallFailed as error:
            raise DependencyUnavailable("predictor", error.code.name, first_clause(error.message)) from None
        return wire.predictions_from_proto(reply)

    async def close(self) -> None:
        await self._predict.close()


class GrpcEstimator:
    def __init__(self, address: str, timeout_s: float, streamed: bool = True, traced: bool = True,
                 streams: int = 1) -> None:
        self._estimate: _Neighbour[estimator_pb2.EstimateRequest, estimator_pb2.EstimateResponse] = _Neighbour(
            address, traced, streamed, streams, f"/{ESTIMATOR}/EstimateStream", estimator_pb2.EstimateCall,
            estimator_pb2.EstimateResult, lambda channel: estimator_pb2_grpc.EstimatorStub(channel).Estimate)
        self._timeout_s = timeout_s
        self._recent = DispatchProtos()

    async def estimate(self, query_id: str, prompt_tokens: int, output_tokens: float, instance_ids: Sequence[str],
                       horizon_ms: float, recent: Sequence[DispatchRecord] = (),
                       prefix_hashes: bytes = b"") -> dict[str, InstanceEstimate]:
        request = self._recent.estimate_request(query_id, prompt_tokens, output_tokens, instance_ids, horizon_ms,
                                                recent, prefix_hashes)
        try:
            reply = await self._estimate(request, self._timeout_s)
        except CallFailed as error:
            raise DependencyUnavailable("estimator", error.code.name, first_clause(error.message)) from None
        return wire.estimates_from_proto(reply)

    async def close(self) -> None:
        await self._estimate.close()


class DispatchProtos:
    """Estimate requests with the router's latest dispatches along: the same dispatches go along with many calls in
    a row, so each is converted once."""

    def __init__(self) -> None:
        self._protos: OrderedDict[str, router_pb2.DispatchRecord] = OrderedDict()

    def estimate_request(self, query_id: str, prompt_tokens: int, output_tokens: float, instance_ids: Sequence[str],
                         horizon_ms: float, recent: Sequence[DispatchRecord],
                         prefix_hashes: bytes) -> estimator_pb2.EstimateRequest:
        request = wire.estimate_request(query_id, prompt_tokens, output_tokens, list(instance_ids), horizon_ms,
                                        prefix_hashes)
        if recent:
            request.recent_dispatches.extend(self._converted(record) for record in recent)
        return request

    def _converted(self, record: DispatchRecord) -> router_pb2.DispatchRecord:
        message = self._protos.get(record.request_id)
        if message is None:
            message = self._protos[record.request_id] = wire.dispatch_to_proto(record)
            while len(self._protos) > RECENT_PROTOS:
                self._protos.popitem(last=False)
        return message


def first_clause(details: str | None) -> str:
    """gRPC's details without the transport's trail ("failed to connect to all addresses; last error: ...")."""
    return (details or "").split(";", 1)[0][:200]
