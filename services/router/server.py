"""The gRPC face of the router (bear.v1.Router): messages in and out through `wire`, domain errors to status codes.

    InvalidQuery         → INVALID_ARGUMENT, the message names the field
    DuplicateRequest     → ALREADY_EXISTS (a request id this router has routed already)
    NoInstances          → UNAVAILABLE (no ready instance serves the query's models)
    DecisionUnreachable  → UNAVAILABLE (ReportOutcome: a decision not in memory, and Redis failing)

`RouteStream` is Route's stream twin (many Route calls over one stream, `bear.common.call_streams`): each call is
answered alike, its error as the status Route would have failed with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from bear.common.call_streams import CallFailed, CallStreamServer, answer_unary
from bear.router import wire
from bear.router.query import DuplicateRequest, InvalidQuery
from bear.router.router import DecisionUnreachable, NoInstances, Router
from bear.v1 import router_pb2, router_pb2_grpc

SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, router: Router) -> None:
        self._router = router
        self.streams = CallStreamServer(self._route, router_pb2.RouteResult,  # .close() at shutdown
                                        f"/{SERVICE_NAME}/RouteStream", on_error=self._route_failed)

    async def Route(self, request: router_pb2.RouteRequest,  # noqa: N802 - the proto's name
                    context: grpc.aio.ServicerContext) -> router_pb2.RouteDecision:
        return await answer_unary(self._route(request), context, on_error=self._route_failed)

    async def RouteStream(self, calls: AsyncIterator[router_pb2.RouteCall],  # noqa: N802 - the proto's name
                          context: grpc.aio.ServicerContext) -> None:
        await self.streams.serve(calls, context)

    async def ReportOutcome(self, request: router_pb2.OutcomeReport,  # noqa: N802 - the proto's name
                            context: grpc.aio.ServicerContext) -> router_pb2.OutcomeAck:
        return await answer_unary(self._report_outcome(request), context, on_error=self._report_failed)

    async def _report_outcome(self, request: router_pb2.OutcomeReport) -> router_pb2.OutcomeAck:
        try:
            known, predicted_ttft_ms = await self._router.report_outcome(wire.outcome_from_proto(request))
        except InvalidQuery as error:
            raise CallFailed(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from None
        except DecisionUnreachable as error:
            raise CallFailed(grpc.StatusCode.UNAVAILABLE, str(error)) from None
        return wire.ack_to_proto(known, predicted_ttft_ms)

    def malformed(self, method: str) -> None:
        """A request that did not decode (answered INVALID_ARGUMENT by bear.common.service): counted as a refusal of
        its method, as Route's and ReportOutcome's own are (RouteStream's as Route's)."""
        service, _, name = method.rpartition("/")
        if service != f"/{SERVICE_NAME}":  # health, reflection: not the router's calls
            return
        name = "Route" if name == "RouteStream" else name
        self._router.count_refusal(name, grpc.StatusCode.INVALID_ARGUMENT.name)
        self._router.count_error(name, grpc.StatusCode.INVALID_ARGUMENT.name)

    def _route_failed(self, code: grpc.StatusCode) -> None:
        self._router.count_error("Route", code.name)

    def _report_failed(self, code: grpc.StatusCode) -> None:
        self._router.count_error("ReportOutcome", code.name)

    async def _route(self, request: router_pb2.RouteRequest) -> router_pb2.RouteDecision:
        try:
            result = await self._router.route(wire.query_from_proto(request))
        except DuplicateRequest as error:
            raise CallFailed(grpc.StatusCode.ALREADY_EXISTS, str(error)) from None
        except InvalidQuery as error:
            raise CallFailed(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from None
        except NoInstances as error:
            raise CallFailed(grpc.StatusCode.UNAVAILABLE, str(error)) from None
        return wire.decision_to_proto(result)


def register(server: grpc.aio.Server, servicer: RouterServicer) -> list[str]:
    router_pb2_grpc.add_RouterServicer_to_server(servicer, server)
    return [SERVICE_NAME]
