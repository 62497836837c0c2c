"""The gRPC face of the estimator (bear.v1.Estimator): thin, over `estimation.Estimator`.

`Estimate` and its stream twin `EstimateStream` (many calls over one stream: how the router calls it, see
`bear.common.call_streams`) answer alike. Estimate reads only the estimator's memory, which the snapshot feed keeps
current on the same event loop: it never waits on Redis or the predictor. The dispatches a router sends along
(`recent_dispatches`) are recorded first, through the feed, as if read from Redis. Bad input is INVALID_ARGUMENT with
a message naming the field; an instance id the estimator does not know is answered, like one without a snapshot, with
method NONE and the reason.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable

import grpc
import prometheus_client

from bear.common.call_streams import CallFailed, CallStreamServer, answer_unary
from bear.estimator import metrics
from bear.estimator.estimation import Estimator, Method
from bear.estimator.wire import InstanceFacts, InvalidRequest, estimate_call, instance_estimate
from bear.v1 import estimator_pb2, estimator_pb2_grpc, router_pb2

RecordDispatch = Callable[[router_pb2.DispatchRecord], bool]  # SnapshotFeed.record_dispatch

SERVICE_NAME = estimator_pb2.DESCRIPTOR.services_by_name["Estimator"].full_name


class EstimatorServicer(estimator_pb2_grpc.EstimatorServicer):
    def __init__(self, estimator: Estimator, clock: Callable[[], float] = time.time,
                 record_dispatch: RecordDispatch | None = None) -> None:
        self._estimator = estimator
        self._clock = clock
        self._record_dispatch = record_dispatch
        self._query_numbers = itertools.count()
        self._by_method: dict[Method, prometheus_client.Counter] = {}
        self.streams = CallStreamServer(self.answer, estimator_pb2.EstimateResult,  # .close() at shutdown
                                        f"/{SERVICE_NAME}/EstimateStream", on_error=count_error)

    async def Estimate(self, request: estimator_pb2.EstimateRequest,  # noqa: N802 - the proto's name
                       context: grpc.aio.ServicerContext) -> estimator_pb2.EstimateResponse:
        return await answer_unary(self.answer(request), context, on_error=count_error)

    async def EstimateStream(self, calls: AsyncIterator[estimator_pb2.EstimateCall],  # noqa: N802
                             context: grpc.aio.ServicerContext) -> None:
        await self.streams.serve(calls, context)

    async def answer(self, request: estimator_pb2.EstimateRequest) -> estimator_pb2.EstimateResponse:
        started = time.perf_counter()
        try:
            return self._estimate(request)
        finally:  # every call the service answered, refused ones too
            metrics.ESTIMATE_SECONDS.observe(time.perf_counter() - started)

    def _estimate(self, request: estimator_pb2.EstimateRequest) -> estimator_pb2.EstimateResponse:
        try:
            call = estimate_call(request, default_query_id=f"bear-estimate-{next(self._query_numbers)}")
        except InvalidRequest as error:
            raise CallFailed(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from None
        if request.recent_dispatches and self._record_dispatch is not None:
            self._record_all(request.recent_dispatches)
        estimator = self._estimator
        ids = call.instance_ids or tuple(estimator.instance_ids())
        estimates = estimator.estimate(call.query, ids, self._clock(), call.horizon_s, call.prefix_hashes)
        reply = estimator_pb2.EstimateResponse(
            estimates=[instance_estimate(estimate, self._facts(estimate.instance_id)) for estimate in estimates])
        for method, count in Counter(estimate.method for estimate in estimates).items():
            self._counted(method).inc(count)
        return reply

    def _counted(self, method: Method) -> prometheus_client.Counter:
        """The estimates counter of `method` (its labelled child looked up once, not once per instance and call)."""
        counter = self._by_method.get(method)
        if counter is None:
            counter = self._by_method[method] = metrics.ESTIMATES.labels(method=str(method))
        return counter

    def _record_all(self, records: Iterable[router_pb2.DispatchRecord]) -> None:
        assert self._record_dispatch is not None
        recorded = sum(self._record_dispatch(record) for record in records)
        if recorded:
            metrics.DISPATCHES_FROM_CALLERS.inc(recorded)

    def _facts(self, instance_id: str) -> InstanceFacts:
        if not self._estimator.knows(instance_id):
            return InstanceFacts()
        snapshot = self._estimator.snapshot(instance_id)
        if snapshot is None:
            return InstanceFacts()
        return InstanceFacts(len(snapshot.running), len(snapshot.waiting) + snapshot.num_omitted_waiting,
                             self._estimator.pending_decode_tokens(instance_id) or 0.0)


def count_error(code: grpc.StatusCode) -> None:
    metrics.ERRORS.labels(code=code.name).inc()


def count_malformed(method: str) -> None:
    """A request that did not decode (answered INVALID_ARGUMENT by bear.common.service), counted as Estimate's own
    refusals are; health's and reflection's are not the estimator's calls."""
    if method.startswith(f"/{SERVICE_NAME}/"):
        count_error(grpc.StatusCode.INVALID_ARGUMENT)


def register(servicer: EstimatorServicer) -> Callable[[grpc.aio.Server], list[str]]:
    """What `bear.common.service.start_server` calls to add the service."""

    def add(server: grpc.aio.Server) -> list[str]:
        estimator_pb2_grpc.add_EstimatorServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return add
