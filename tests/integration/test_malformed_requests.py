"""Request bytes that are no message of the method (truncated, a wrong tag, a string that is not UTF-8), sent over a
raw channel to the router's, the predictor's and the estimator's servicers on a real server on a loopback port
(`bear.common.service.start_server`): INVALID_ARGUMENT "malformed request: ..." before any servicer runs, for unary
methods and streams of calls alike, and no error logged for them; the service told of each (its error counts)."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bear.common.service import RunningServer, ServerSettings, start_server
from bear.estimator.server import EstimatorServicer
from bear.estimator.server import register as register_estimator
from bear.predictor.server import PredictorServicer
from bear.predictor.server import register as register_predictor
from bear.router.server import RouterServicer
from bear.router.server import register as register_router
from tests.service_loop import LoopThread

NOT_UTF8 = b"a\xffb"
GARBAGE = b"\xff\xff\xff\xff"  # field 0 does not exist: no message starts so
TOLD: list[str] = []  # the methods start_server's on_malformed was told of


class _Unreachable:
    """A domain object (router, predictor, estimator) that a malformed request must never reach."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a malformed request reached the servicer ({name})")


@pytest.fixture(scope="module")
def channel() -> Iterator[grpc.Channel]:
    loop = LoopThread()
    executor = ThreadPoolExecutor(1)
    predictor = PredictorServicer(_Unreachable(), executor, max_prompt_chars=1000,  # type: ignore[arg-type]
                                  max_remaining_queries=10)
    estimator = EstimatorServicer(_Unreachable())  # type: ignore[arg-type]

    def register(server: grpc.aio.Server) -> list[str]:
        return [*register_router(server, RouterServicer(_Unreachable())),  # type: ignore[arg-type]
                *register_predictor(predictor)(server), *register_estimator(estimator)(server)]

    running: RunningServer = loop.run(start_server(ServerSettings("bear-test", "127.0.0.1", 0, None, 1.0), register,
                                                   on_malformed=TOLD.append))
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    yield channel
    channel.close()
    loop.run(running.stop())
    executor.shutdown()
    loop.close()


@pytest.mark.parametrize(("method", "payload"), [
    ("/bear.v1.Router/Route", b"\x12\x03" + NOT_UTF8 + b"!" + struct.pack("<d", 500)),
    ("/bear.v1.Router/Route", GARBAGE),
    ("/bear.v1.Router/ReportOutcome", b"\x0a\x03" + NOT_UTF8),
    ("/bear.v1.Predictor/Predict", b"\x0a\x03" + NOT_UTF8),
    ("/bear.v1.Predictor/Predict", GARBAGE),
    ("/bear.v1.Estimator/Estimate", b"\x0a\x03" + NOT_UTF8),
    ("/bear.v1.Estimator/Estimate", b"\x0a\x10" + NOT_UTF8),  # a string longer than the bytes left
    ("/grpc.health.v1.Health/Check", GARBAGE),
])
def test_a_unary_call_with_malformed_bytes_is_invalid_argument(channel: grpc.Channel, method: str, payload: bytes,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    TOLD.clear()
    with caplog.at_level(logging.WARNING), pytest.raises(grpc.RpcError) as raised:
        call(payload, timeout=10)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert raised.value.details().startswith("malformed request: ")
    assert TOLD == [method]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


@pytest.mark.parametrize("method", ["/bear.v1.Predictor/PredictStream", "/bear.v1.Estimator/EstimateStream",
                                    "/bear.v1.Router/RouteStream"])
@pytest.mark.parametrize("payload", [b"\x12\x05\x0a\x03" + NOT_UTF8, GARBAGE], ids=["not-utf8", "garbage"])
def test_a_stream_of_calls_with_a_malformed_message_ends_invalid_argument(channel: grpc.Channel, method: str,
                                                                          payload: bytes,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    call = channel.stream_stream(method, request_serializer=None, response_deserializer=None)
    TOLD.clear()
    with caplog.at_level(logging.WARNING), pytest.raises(grpc.RpcError) as raised:
        list(call(iter([payload]), timeout=10))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert raised.value.details().startswith("malformed request: ")
    assert TOLD == [method]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_well_formed_request_still_reaches_its_servicer(channel: grpc.Channel) -> None:
    answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="bear.v1.Router"),
                                                       timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
