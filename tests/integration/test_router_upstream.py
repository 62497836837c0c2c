"""The router's neighbours over gRPC (`bear.router.upstream`): a neighbour that has answered UNAVAILABLE for
`REBUILD_AFTER_S` gets new channels (gRPC's DNS resolver would retry a name that resolved to nothing only after its own
back-off, up to 2 minutes), and a call on them reaches the server that has come up meanwhile; a run of failures
shorter than that, or broken by an answer, keeps the channels."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import pytest

from bear.common.call_streams import CallFailed
from bear.router import upstream
from bear.v1 import estimator_pb2, estimator_pb2_grpc
from tests.integration.test_call_streams import Server, Servicer, _request, run


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _neighbour(port: int, clock: Clock, streamed: bool) -> upstream._Neighbour[Any, Any]:  # noqa: SLF001
    return upstream._Neighbour(  # noqa: SLF001 - the rebuilding is what is tested
        f"127.0.0.1:{port}", False, streamed, 2, f"/{upstream.ESTIMATOR}/EstimateStream", estimator_pb2.EstimateCall,
        estimator_pb2.EstimateResult, lambda channel: estimator_pb2_grpc.EstimatorStub(channel).Estimate, clock)


async def _answered(neighbour: upstream._Neighbour[Any, Any]) -> Any:  # noqa: SLF001
    for _ in range(30):
        try:
            return await neighbour(_request("up"), timeout_s=5)
        except CallFailed as error:
            assert error.code is grpc.StatusCode.UNAVAILABLE
            await asyncio.sleep(0.1)
    raise AssertionError("no answer within 3 s of the server's start")


@pytest.mark.parametrize("streamed", [True, False])
def test_a_neighbour_unavailable_for_a_while_gets_new_channels_that_reach_it_once_it_is_up(streamed: bool) -> None:
    async def scenario() -> None:
        port, clock = _free_port(), Clock()
        neighbour = _neighbour(port, clock, streamed)
        try:
            for advance in (0.0, 1.0, 0.9):  # 1.9 s of failures: the channels stay
                clock.now += advance
                with pytest.raises(CallFailed) as failed:
                    await neighbour(_request("down"), timeout_s=2)
                assert failed.value.code is grpc.StatusCode.UNAVAILABLE
            assert neighbour.rebuilt == 0
            clock.now += 0.2  # 2.1 s
            with pytest.raises(CallFailed):
                await neighbour(_request("down"), timeout_s=2)
            assert neighbour.rebuilt == 1

            server = await Server(Servicer(), port=port).start()
            try:
                reply = await _answered(neighbour)  # within the channels' reconnect back-off (at most 1 s)
                assert reply.estimates[0].instance_id == "up" and neighbour.rebuilt == 1
                clock.now += 10.0  # an answer ends the run of failures: one more does not rebuild at once
                await server.kill()
                await asyncio.sleep(0.2)
                with pytest.raises(CallFailed):
                    await neighbour(_request("down again"), timeout_s=2)
                assert neighbour.rebuilt == 1
            finally:
                await server.kill()
        finally:
            await neighbour.close()

    run(scenario)
