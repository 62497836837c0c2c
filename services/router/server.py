"""The gRPC face of the router (bear.v1.Router): messages in and out through `wire`, domain errors to status codes.

    InvalidQuery      → INVALID_ARGUMENT, the message names the field
    DuplicateRequest  → ALREADY_EXISTS (a request id this router has routed already)
    NoInstances       → UNAVAILABLE (no ready instance serves the query's models)
"""

from __future__ import annotations

import grpc

from bear.router import wire
from bear.router.query import DuplicateRequest, InvalidQuery
from bear.router.router import NoInstances, Router
from bear.v1 import router_pb2, router_pb2_grpc

SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, router: Router) -> None:
        self._router = router

    async def Route(self, request: router_pb2.RouteRequest,  # noqa: N802 - the proto's name
                    context: grpc.aio.ServicerContext) -> router_pb2.RouteDecision:
        try:
            result = await self._router.route(wire.query_from_proto(request))
        except DuplicateRequest as error:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(error))
        except InvalidQuery as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except NoInstances as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        return wire.decision_to_proto(result)

    async def ReportOutcome(self, request: router_pb2.OutcomeReport,  # noqa: N802 - the proto's name
                            context: grpc.aio.ServicerContext) -> router_pb2.OutcomeAck:
        try:
            known, predicted_ttft_ms = await self._router.report_outcome(wire.outcome_from_proto(request))
        except InvalidQuery as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        return wire.ack_to_proto(known, predicted_ttft_ms)


def register(server: grpc.aio.Server, router: Router) -> list[str]:
    router_pb2_grpc.add_RouterServicer_to_server(RouterServicer(router), server)
    return [SERVICE_NAME]
