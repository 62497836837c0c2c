"""Streams of calls (`bear.common.call_streams`) between a real grpc.aio server and client on loopback: results out
of order, errors per call, deadlines, a server that dies or restarts, one without the stream twin (unary fallback),
a shutdown that ends open streams without waiting for the grace period, streams retired by age without a call lost
(a server's connections recycled too), and several streams spread over two replicas behind one name.

The test service is the estimator's wire (EstimateCall / EstimateResult) with an answer steered by the query id:
"sleep:S" answers after S seconds, "fail:CODE" fails with that status, "boom" raises; the answer names the query id.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from opentelemetry import trace

from bear.common.call_streams import (
    CallFailed,
    CallStream,
    CallStreamServer,
    StreamedMethod,
    answer_unary,
    not_a_call_stream,
)
from bear.common import service
from bear.common.channels import CLIENT_CHANNEL_OPTIONS
from bear.common.service import ServerSettings, start_server
from bear.v1 import estimator_pb2, estimator_pb2_grpc
from tests.service_loop import LoopThread

METHOD = "/bear.v1.Estimator/EstimateStream"
ANSWERED: list[str] = []  # query ids whose answer the server finished


async def _answer(request: estimator_pb2.EstimateRequest) -> estimator_pb2.EstimateResponse:
    kind, _, argument = request.query_id.partition(":")
    if kind == "sleep":
        await asyncio.sleep(float(argument.split("#")[0]))  # "sleep:S#tag": tagged, to tell calls apart
    elif kind == "fail":
        raise CallFailed(grpc.StatusCode[argument], f"failed as told ({argument})")
    elif kind == "boom":
        raise RuntimeError("boom")
    elif kind == "block":
        time.sleep(float(argument))  # an answer that never yields (the estimator's replay): nothing can cancel it
    ANSWERED.append(request.query_id)
    return estimator_pb2.EstimateResponse(estimates=[estimator_pb2.InstanceEstimate(instance_id=request.query_id)])


class Servicer(estimator_pb2_grpc.EstimatorServicer):
    def __init__(self, streamed: bool = True) -> None:
        self.streams = CallStreamServer(self._counted, estimator_pb2.EstimateResult, METHOD)
        self.streamed = streamed
        self.opened = 0  # streams of calls served
        self.unary_calls = 0
        self.stream_calls = 0  # calls answered on its streams

    async def _counted(self, request: estimator_pb2.EstimateRequest) -> estimator_pb2.EstimateResponse:
        self.stream_calls += 1
        return await _answer(request)

    async def Estimate(self, request: estimator_pb2.EstimateRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> estimator_pb2.EstimateResponse:
        self.unary_calls += 1
        return await answer_unary(_answer(request), context)

    async def EstimateStream(self, calls: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        if not self.streamed:  # as a server of an older version, without the twin
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        self.opened += 1
        await self.streams.serve(calls, context)


class Server:
    def __init__(self, servicer: Servicer, port: int = 0, grace_s: float = 5.0) -> None:
        self.servicer, self.port, self.grace_s = servicer, port, grace_s
        self.running: Any = None

    async def start(self) -> Server:
        def register(server: grpc.aio.Server) -> list[str]:
            estimator_pb2_grpc.add_EstimatorServicer_to_server(self.servicer, server)
            return ["bear.v1.Estimator"]

        self.running = await start_server(ServerSettings("test", "127.0.0.1", self.port, None, self.grace_s), register,
                                          [self.servicer.streams.close])
        self.port = self.running.port
        return self

    async def kill(self) -> None:
        await self.running.server.stop(None)


def _request(query_id: str) -> estimator_pb2.EstimateRequest:
    return estimator_pb2.EstimateRequest(query_id=query_id)


def _stream(channel: grpc.aio.Channel, traced: bool = False, **options: Any) -> CallStream[Any, Any]:
    return CallStream(channel, METHOD, estimator_pb2.EstimateCall, estimator_pb2.EstimateResult, traced=traced,
                      **options)


def _raw_stream(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
    """The stream method called directly, its messages written and read by the test."""
    return channel.stream_stream(METHOD, request_serializer=estimator_pb2.EstimateCall.SerializeToString,
                                 response_deserializer=estimator_pb2.EstimateResult.FromString)()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


@asynccontextmanager
async def connected(grace_s: float = 5.0, traced: bool = False) -> AsyncIterator[tuple[Server, CallStream[Any, Any]]]:
    """A server and a stream of calls to it (closed, and the server stopped, at the end)."""
    server = await Server(Servicer(), grace_s=grace_s).start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stream = _stream(channel, traced)
        try:
            yield server, stream
        finally:
            await stream.close()
    await server.kill()


def test_calls_share_one_stream_and_a_slow_one_does_not_hold_up_the_others() -> None:
    async def scenario() -> None:
        async with connected() as (server, stream):
            finished: list[str] = []

            async def call(query_id: str) -> None:
                reply = await stream.call(_request(query_id), timeout_s=5)
                assert reply.estimates[0].instance_id == query_id
                finished.append(query_id)

            await asyncio.gather(call("sleep:0.3"), call("sleep:0.05"), *(call(f"quick-{i}") for i in range(20)))
            assert finished[-1] == "sleep:0.3" and len(finished) == 22
            assert server.servicer.opened == 1 and server.servicer.unary_calls == 0

    run(scenario)


def test_an_error_fails_its_call_only() -> None:
    async def scenario() -> None:
        async with connected() as (server, stream):
            with pytest.raises(CallFailed) as failed:
                await stream.call(_request("fail:INVALID_ARGUMENT"), timeout_s=5)
            assert failed.value.code is grpc.StatusCode.INVALID_ARGUMENT
            assert failed.value.message == "failed as told (INVALID_ARGUMENT)"
            with pytest.raises(CallFailed) as failed:
                await stream.call(_request("boom"), timeout_s=5)
            assert failed.value.code is grpc.StatusCode.UNKNOWN and "RuntimeError: boom" in failed.value.message
            assert (await stream.call(_request("fine"), timeout_s=5)).estimates[0].instance_id == "fine"
            assert server.servicer.opened == 1

    run(scenario)


def test_each_call_has_the_spans_and_rpc_attributes_a_unary_call_has() -> None:
    """Server spans are errors only for the server's failures (OpenTelemetry's gRPC conventions), client spans for
    any; both carry rpc.* attributes and the status code, as the gRPC instrumentation gives unary calls."""
    from tests.router_stack import span_exporter

    exporter = span_exporter()
    exporter.clear()  # the process's exporter: spans of the tests before this one are not this test's

    async def scenario() -> None:
        async with connected(traced=True) as (_, stream):
            await stream.call(_request("fine"), timeout_s=5)
            for code in ("INVALID_ARGUMENT", "UNAVAILABLE"):
                with pytest.raises(CallFailed):
                    await stream.call(_request(f"fail:{code}"), timeout_s=5)

    run(scenario)
    spans = [s for s in exporter.get_finished_spans() if s.name == METHOD]
    assert len(spans) == 6
    by_kind: dict[str, list[Any]] = {"server": [], "client": []}
    for span in sorted(spans, key=lambda s: s.start_time):
        by_kind["server" if span.kind is trace.SpanKind.SERVER else "client"].append(span)
    for kind, (fine, invalid, unavailable) in by_kind.items():
        for span in (fine, invalid, unavailable):
            assert {k: span.attributes[k] for k in ("rpc.system", "rpc.service", "rpc.method")} == {
                "rpc.system": "grpc", "rpc.service": "bear.v1.Estimator", "rpc.method": "EstimateStream"}, kind
        assert [s.attributes["rpc.grpc.status_code"] for s in (fine, invalid, unavailable)] == [0, 3, 14], kind
        assert fine.status.status_code is trace.StatusCode.UNSET, kind
        assert unavailable.status.status_code is trace.StatusCode.ERROR, kind
    assert by_kind["server"][1].status.status_code is trace.StatusCode.UNSET  # the caller's mistake
    assert by_kind["client"][1].status.status_code is trace.StatusCode.ERROR  # a failed call, for the caller


def test_the_server_gives_a_call_up_at_its_callers_deadline() -> None:
    """As gRPC cancels a unary handler: a Route decided after its caller stopped waiting would record a dispatch
    for a query never sent, and claim its request id."""
    async def scenario() -> None:
        async with connected() as (_, stream):
            with pytest.raises(CallFailed) as failed:
                await stream.call(_request("sleep:0.6#abandoned"), timeout_s=0.1)
            assert failed.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
            assert (await stream.call(_request("sleep:0.8#patient"), timeout_s=5)).estimates
            assert "sleep:0.6#abandoned" not in ANSWERED and "sleep:0.8#patient" in ANSWERED

    run(scenario)


def test_a_call_its_caller_gave_up_is_given_up_by_the_server_too() -> None:
    """The caller tells the server on the stream (a deadline it met first, a cancellation): the answer is cancelled
    where it is, as gRPC cancels a unary handler, and the stream goes on."""
    async def scenario() -> None:
        async with connected() as (_, stream):
            victim = asyncio.ensure_future(stream.call(_request("sleep:0.5#given-up"), timeout_s=5))
            await asyncio.sleep(0.1)  # the server is answering it
            victim.cancel()
            with pytest.raises(CallFailed):
                await stream.call(_request("sleep:0.5#timed-out"), timeout_s=0.1)
            assert (await stream.call(_request("sleep:0.7#after"), timeout_s=5)).estimates
            assert "sleep:0.5#given-up" not in ANSWERED and "sleep:0.5#timed-out" not in ANSWERED
            assert "sleep:0.7#after" in ANSWERED

    run(scenario)


def test_the_calls_of_a_stream_its_caller_cancelled_are_given_up() -> None:
    """The caller's stream itself ends abruptly (cancelled, or its process gone) while the server waits for a call to
    end (at its limit of calls in flight): the calls being answered are given up too, as for a unary call, rather
    than answered for nobody (QA: Route calls were decided and recorded for a client that had died)."""
    async def scenario() -> None:
        servicer = Servicer()
        servicer.streams = CallStreamServer(_answer, estimator_pb2.EstimateResult, METHOD, max_in_flight=2)
        server = await Server(servicer).start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                call = _raw_stream(channel)
                for n in range(2):
                    await call.write(estimator_pb2.EstimateCall(call_id=n, request=_request(f"sleep:0.4#orphan{n}")))
                await asyncio.sleep(0.1)  # the server is answering them, and reads no more until one ends
                call.cancel()
                await asyncio.sleep(0.6)  # past the answers' time
            assert not [q for q in ANSWERED if "#orphan" in q]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:  # the server goes on
                assert (await _stream(channel).call(_request("sleep:0#after-orphans"), timeout_s=5)).estimates
        finally:
            await server.kill()

    run(scenario)


def test_a_call_past_its_deadline_fails_and_its_late_answer_is_dropped() -> None:
    async def scenario() -> None:
        async with connected() as (server, stream):
            started = time.perf_counter()
            with pytest.raises(CallFailed) as failed:
                await stream.call(_request("sleep:0.5"), timeout_s=0.1)
            assert failed.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.perf_counter() - started < 0.4
            await asyncio.sleep(0.6)  # the late answer arrives meanwhile: nobody waits for it
            assert (await stream.call(_request("next"), timeout_s=5)).estimates[0].instance_id == "next"
            assert server.servicer.opened == 1

    run(scenario)


def test_an_answer_that_came_while_the_loop_was_busy_past_the_deadline_is_taken() -> None:
    # As with gRPC's own deadlines (the transport's clock): a stalled caller does not throw away an answer it has.
    service_loop = LoopThread()  # the server answers from another thread while the caller's loop is stuck
    try:
        server = service_loop.run(Server(Servicer()).start())

        async def scenario() -> None:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stream = _stream(channel)
                assert (await stream.call(_request("open"), timeout_s=5)).estimates[0].instance_id == "open"
                call = asyncio.ensure_future(stream.call(_request("answered"), timeout_s=0.1))
                await asyncio.sleep(0.02)  # written
                time.sleep(0.3)  # the loop is busy past the deadline; the answer arrives meanwhile
                assert (await call).estimates[0].instance_id == "answered"
                with pytest.raises(CallFailed) as failed:  # one that has no answer by then still expires
                    await stream.call(_request("sleep:1"), timeout_s=0.1)
                assert failed.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
                await stream.close()

        run(scenario)
        service_loop.run(server.kill())
    finally:
        service_loop.close()


def test_a_server_that_dies_fails_the_calls_in_flight_at_once_and_a_new_stream_follows_its_restart() -> None:
    async def scenario() -> None:
        server = await Server(Servicer()).start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stream = _stream(channel)
            assert (await stream.call(_request("before"), timeout_s=5)).estimates[0].instance_id == "before"
            in_flight = asyncio.ensure_future(stream.call(_request("sleep:2"), timeout_s=10))
            await asyncio.sleep(0.1)
            started = time.perf_counter()
            await server.kill()
            with pytest.raises(CallFailed) as failed:
                await in_flight
            assert time.perf_counter() - started < 1.5  # the stream's end, not the call's deadline
            assert failed.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
            with pytest.raises(CallFailed):  # nobody listens: fails within its deadline
                await stream.call(_request("while-down"), timeout_s=0.5)
            revived = await Server(Servicer(), port=server.port).start()
            deadline = time.monotonic() + 10
            while True:  # the channel reconnects within its back-off
                try:
                    reply = await stream.call(_request("after"), timeout_s=1)
                    break
                except CallFailed:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.1)
            assert reply.estimates[0].instance_id == "after" and revived.servicer.opened == 1
            await stream.close()
        await revived.kill()

    run(scenario)


def test_closing_fails_at_once_the_calls_whose_writes_a_peer_reading_nothing_holds_up() -> None:
    """A peer that reads nothing (a paused process, a partition) holds writes up once the window is full; closing
    the stream fails every call in flight, written or not (QA: those still writing waited for their deadlines)."""
    async def scenario() -> None:
        hold = asyncio.Event()

        async def never_reads(calls: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
            await hold.wait()

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bear.v1.Estimator", {
            "EstimateStream": grpc.stream_stream_rpc_method_handler(
                never_reads, request_deserializer=estimator_pb2.EstimateCall.FromString,
                response_serializer=estimator_pb2.EstimateResult.SerializeToString)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = _stream(channel)
            calls = [asyncio.ensure_future(stream.call(_request(f"{i}:" + "x" * 200_000), timeout_s=30))
                     for i in range(50)]  # 10 MB: more than the windows take
            await asyncio.sleep(1.0)
            started = time.perf_counter()
            await stream.close()
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert time.perf_counter() - started < 5
            assert [type(r) for r in results] == [CallFailed] * 50
            assert {r.code for r in results} == {grpc.StatusCode.CANCELLED}  # type: ignore[union-attr]
        hold.set()
        await server.stop(None)

    run(scenario)


def test_a_server_without_the_stream_twin_is_called_unary_and_asked_again_later() -> None:
    async def scenario() -> None:
        servicer = Servicer(streamed=False)
        server = await Server(servicer).start()
        now = [100.0]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            method = StreamedMethod(estimator_pb2_grpc.EstimatorStub(channel).Estimate, _stream(channel),
                                    clock=lambda: now[0])
            assert (await method(_request("first"), 5)).estimates[0].instance_id == "first"
            assert not method.streamed and servicer.unary_calls == 1
            assert (await method(_request("second"), 5)).estimates[0].instance_id == "second"
            assert servicer.unary_calls == 2
            with pytest.raises(CallFailed) as failed:  # unary errors are CallFailed too
                await method(_request("fail:NOT_FOUND"), 5)
            assert failed.value.code is grpc.StatusCode.NOT_FOUND
            servicer.streamed = True  # "upgraded"
            now[0] += 61
            assert method.streamed
            assert (await method(_request("third"), 5)).estimates[0].instance_id == "third"
            assert servicer.opened == 1 and servicer.unary_calls == 3
            await method.close()
        await server.kill()

    run(scenario)


def test_a_stream_has_at_most_max_in_flight_calls_answered_at_once_and_the_rest_wait() -> None:
    # A caller that floods a stream cannot pile up work: past the limit the stream is not read until a call is done.
    async def scenario() -> None:
        busy, most = [0], [0]

        async def answer(request: estimator_pb2.EstimateRequest) -> estimator_pb2.EstimateResponse:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
            await asyncio.sleep(0.05)
            busy[0] -= 1
            return await _answer(request)

        servicer = Servicer()
        servicer.streams = CallStreamServer(answer, estimator_pb2.EstimateResult, METHOD, max_in_flight=3)
        server = await Server(servicer).start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stream = _stream(channel)
            started = time.perf_counter()
            replies = await asyncio.gather(*(stream.call(_request(f"q{i}"), timeout_s=10) for i in range(12)))
            elapsed = time.perf_counter() - started
            assert [r.estimates[0].instance_id for r in replies] == [f"q{i}" for i in range(12)]
            assert most[0] == 3 and elapsed >= 4 * 0.05 * 0.9  # four rounds of three
            await stream.close()
        await server.kill()
        with pytest.raises(ValueError, match="max_in_flight must be >= 1"):
            CallStreamServer(answer, estimator_pb2.EstimateResult, METHOD, max_in_flight=0)

    run(scenario)


def test_a_call_ended_by_its_deadline_or_its_caller_leaves_the_others_on_the_stream_alone() -> None:
    # Cancelling a write half-way would make grpc.aio cancel the stream, failing every call on it.
    async def scenario() -> None:
        async with connected() as (server, stream):
            others = [asyncio.ensure_future(stream.call(_request(f"sleep:0.2#{i}"), timeout_s=5)) for i in range(10)]
            await asyncio.sleep(0.05)
            with pytest.raises(CallFailed) as failed:
                await stream.call(_request("rushed"), timeout_s=1e-6)
            assert failed.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
            victim = asyncio.ensure_future(stream.call(_request("sleep:0.1"), timeout_s=5))
            await asyncio.sleep(0)
            victim.cancel()
            replies = await asyncio.gather(*others)
            assert [r.estimates[0].instance_id for r in replies] == [f"sleep:0.2#{i}" for i in range(10)]
            assert (await stream.call(_request("after"), timeout_s=5)).estimates[0].instance_id == "after"
            assert server.servicer.opened == 1

    run(scenario)


def test_a_call_id_already_in_flight_on_the_stream_is_refused_and_free_again_once_answered() -> None:
    async def scenario() -> None:
        server = await Server(Servicer()).start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = _raw_stream(channel)
            for query_id in ("sleep:0.2", "again"):
                await call.write(estimator_pb2.EstimateCall(call_id=7, request=_request(query_id)))
            refused, answered = await call.read(), await call.read()
            assert refused.call_id == 7 and refused.error.code == "INVALID_ARGUMENT"
            assert "call_id 7 is already in flight" in refused.error.message
            assert answered.call_id == 7 and answered.response.estimates[0].instance_id == "sleep:0.2"
            await call.write(estimator_pb2.EstimateCall(call_id=7, request=_request("later")))
            assert (await call.read()).response.estimates[0].instance_id == "later"
            await call.done_writing()
        await server.kill()

    run(scenario)


def test_a_deadline_no_time_can_be_made_of_is_refused_and_the_stream_goes_on() -> None:
    async def scenario() -> None:
        server = await Server(Servicer()).start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = _raw_stream(channel)
            for call_id, timeout_ms in enumerate((-1.0, float("nan"), float("inf"), 0.0, 5000.0)):
                await call.write(estimator_pb2.EstimateCall(
                    call_id=call_id, request=_request(f"deadline-{call_id}"), timeout_ms=timeout_ms))
                result = await call.read()
                if call_id < 3:
                    assert result.error.code == "INVALID_ARGUMENT" and "timeout_ms must be" in result.error.message
                    assert f"deadline-{call_id}" not in ANSWERED
                else:  # 0: no deadline
                    assert result.response.estimates[0].instance_id == f"deadline-{call_id}"
            await call.done_writing()
        await server.kill()

    run(scenario)


def test_an_answer_that_never_yields_and_ends_past_the_deadline_is_deadline_exceeded() -> None:
    """The proto's promise (the call is given up once its deadline passes) for an answer nothing could cancel: over a
    stream it was written as a success, and a unary call's server span said OK while the caller got
    DEADLINE_EXCEEDED."""
    from tests.router_stack import span_exporter

    exporter = span_exporter()
    exporter.clear()  # the spans of the tests before

    async def scenario() -> None:
        server = await Server(Servicer()).start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = _raw_stream(channel)
            await call.write(estimator_pb2.EstimateCall(call_id=1, request=_request("block:0.3"), timeout_ms=100))
            result = await call.read()
            assert (result.error.code, result.error.message) == ("DEADLINE_EXCEEDED", "Deadline Exceeded")
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await estimator_pb2_grpc.EstimatorStub(channel).Estimate(_request("block:0.3"), timeout=0.1)
            assert failed.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.sleep(0.3)  # the server's span of the unary call ends
        await server.kill()

    run(scenario)
    [unary] = [s for s in exporter.get_finished_spans()
               if s.name == "/bear.v1.Estimator/Estimate" and s.kind is trace.SpanKind.SERVER]
    assert unary.attributes["rpc.grpc.status_code"] == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert unary.status.status_code is trace.StatusCode.ERROR


def test_shutdown_answers_the_calls_in_flight_and_ends_the_streams_without_waiting_for_the_grace() -> None:
    async def scenario() -> None:
        async with connected(grace_s=5.0) as (server, stream):
            assert (await stream.call(_request("open"), timeout_s=5)).estimates[0].instance_id == "open"
            in_flight = asyncio.ensure_future(stream.call(_request("sleep:0.3"), timeout_s=5))
            await asyncio.sleep(0.05)
            started = time.perf_counter()
            await server.running.stop()
            stopped_s = time.perf_counter() - started
            assert (await in_flight).estimates[0].instance_id == "sleep:0.3"  # answered before the stream ended
            assert stopped_s < 2.0  # not the 5 s grace: the open stream was ended once its call was answered
            with pytest.raises(CallFailed):  # the server is gone: a new stream fails, within the deadline
                await stream.call(_request("after"), timeout_s=1)

    run(scenario)


def test_the_interceptor_filter_leaves_streams_of_calls_alone() -> None:
    class Details:
        def __init__(self, method: str | bytes) -> None:
            self.method = method

    assert not not_a_call_stream(Details("/bear.v1.Estimator/EstimateStream"))
    assert not not_a_call_stream(Details(b"/bear.v1.Predictor/PredictStream"))
    assert not_a_call_stream(Details("/bear.v1.Estimator/Estimate"))
    assert not_a_call_stream(Details(b"/bear.v1.Router/Route"))


async def _keep_calling(stream: CallStream[Any, Any], seconds: float, concurrency: int = 4) -> tuple[int, list[str]]:
    """Calls of 20 ms each, `concurrency` at a time, for `seconds`: (calls answered, the failures)."""
    answered, failures = 0, []
    end = time.monotonic() + seconds

    async def caller(n: int) -> None:
        nonlocal answered
        i = 0
        while time.monotonic() < end:
            i += 1
            try:
                await stream.call(_request(f"sleep:0.02#{n}-{i}"), timeout_s=2)
                answered += 1
            except CallFailed as error:
                failures.append(f"{error.code.name}: {error.message}")

    await asyncio.gather(*(caller(n) for n in range(concurrency)))
    return answered, failures


def test_a_stream_is_retired_by_age_and_no_call_fails_even_as_the_server_recycles_connections(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Connections recycled every 0.4 s with 1.5 s of grace (production: 120 s and 120 s): a stream that outlived the
    # grace would be cut with its calls; retired after 0.3–0.4 s, each ends on its own once its calls are answered.
    monkeypatch.setattr(service, "SERVER_OPTIONS", (("grpc.so_reuseport", 0), ("grpc.max_connection_age_ms", 400),
                                                    ("grpc.max_connection_age_grace_ms", 1500)))

    async def scenario() -> None:
        server = await Server(Servicer()).start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=CLIENT_CHANNEL_OPTIONS) as channel:
            stream = _stream(channel, max_age_s=0.4)
            try:
                answered, failures = await _keep_calling(stream, 3.0)
            finally:
                await stream.close()
        await server.kill()
        assert failures == [] and answered > 100
        assert server.servicer.opened >= 6  # a new stream every 0.3–0.4 s
        assert server.servicer.stream_calls == answered and server.servicer.unary_calls == 0

    run(scenario)


def test_a_call_given_up_on_a_retired_stream_is_given_up_by_the_server_and_the_stream_ends_after() -> None:
    """A stream retired while a call is in flight stays open for writing until that call is answered or given up: a
    caller that stops waiting still tells the server (which would otherwise answer, and a router record, the call for
    nobody), and the stream ends with OK only then."""
    async def scenario() -> None:
        server = await Server(Servicer()).start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stream = _stream(channel, max_age_s=0.2)
                try:
                    slow = asyncio.ensure_future(stream.call(_request("sleep:0.8#given-up-on-retired"), timeout_s=5))
                    await asyncio.sleep(0.3)  # past the stream's age: the next call retires it
                    assert (await stream.call(_request("sleep:0#on-the-next"), timeout_s=5)).estimates
                    assert server.servicer.opened == 2
                    slow.cancel()
                    await asyncio.gather(slow, return_exceptions=True)
                    await asyncio.sleep(0.8)  # past the slow call's answer
                    assert "sleep:0.8#given-up-on-retired" not in ANSWERED
                    # The retired stream has ended (its reader too): only the new one is left
                    assert [s.retired for s in stream._live] == [False]  # noqa: SLF001 - the client's bookkeeping
                finally:
                    await stream.close()
        finally:
            await server.kill()

    run(scenario)


def test_several_streams_spread_the_calls_over_the_replicas_behind_one_name() -> None:
    async def scenario() -> None:
        servers = [await Server(Servicer()).start() for _ in range(2)]
        target = "ipv4:" + ",".join(f"127.0.0.1:{server.port}" for server in servers)  # a name with two addresses
        try:
            async with grpc.aio.insecure_channel(target, options=CLIENT_CHANNEL_OPTIONS) as channel:
                await spread_over(servers, channel)
        finally:
            for server in servers:
                await server.kill()

    async def spread_over(servers: list[Server], channel: grpc.aio.Channel) -> None:
        stub = estimator_pb2_grpc.EstimatorStub(channel)
        for _ in range(100):  # until both replicas are connected: unary calls go to each in turn
            await stub.Estimate(_request("warm-up"), timeout=5)
            if all(server.servicer.unary_calls for server in servers):
                break
        assert all(server.servicer.unary_calls for server in servers)
        wide = _stream(channel, width=2)
        narrow = _stream(channel, max_age_s=0.2)  # one stream at a time, to one replica and then the other
        try:
            # Within the first streams' age (0.8-1 s: FIRST_STREAM_AGE_S)
            answered, failures = await _keep_calling(wide, 0.5)
            calls = [server.servicer.stream_calls for server in servers]
            assert failures == [] and [server.servicer.opened for server in servers] == [1, 1]
            assert min(calls) >= 0.4 * answered  # taken in turn: half each
            answered, failures = await _keep_calling(narrow, 1.5, concurrency=2)
            assert failures == []
            assert all(server.servicer.opened >= 3 for server in servers)
        finally:
            await wide.close()
            await narrow.close()

    run(scenario)


def test_a_stream_client_refuses_a_width_or_an_age_it_cannot_use() -> None:
    async def scenario() -> None:
        async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:
            with pytest.raises(ValueError, match="width must be >= 1"):
                _stream(channel, width=0)
            with pytest.raises(ValueError, match="max_age_s must be > 0"):
                _stream(channel, max_age_s=float("nan"))

    run(scenario)
