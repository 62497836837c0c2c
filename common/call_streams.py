"""Many unary calls over one long-lived gRPC stream: how the router reaches the estimator and the predictor.

A unary call costs gRPC Python a call object, metadata, a status and a deadline timer at both ends; a message on a
stream that is already open costs about half of that (loopback here, paced at 200 calls/s: 0.25 vs 0.49 ms p50 per
round trip, 0.10 vs 0.23 ms of server CPU per call). So a service offers a hot method twice: the unary one
(`Estimate`) and its twin `EstimateStream`, a stream of the same calls. A call message (`EstimateCall`) wraps the
unary request with a call id, the W3C trace context of the caller's span and the caller's deadline (`timeout_ms`, as
gRPC's grpc-timeout: the server gives the call up once it passes, as gRPC gives up a unary handler); a caller that
stops waiting for a call before its answer (its deadline, its cancellation) says so with a cancel message of the
call's id, and the server cancels the answer where it is; a result
(`EstimateResult`) carries the id and either the response or the error (`CallError`) the unary method would have
failed with. Results may come back out of order: a slow call does not hold up the others.

- Server: `CallStreamServer(answer, result_type, span_name).serve(calls, context)` is the twin's handler; `answer` is
  the unary method's logic (raising `CallFailed` for an error status), which `answer_unary` serves as the unary
  method. `close()` ends every stream once its calls in flight are answered (at shutdown: the callers open a new
  stream, to another replica).
- Client: `CallStream(channel, method, call_type, result_type, width=N)` keeps up to N streams open, opened as calls
  need them and again after one ended, and sends each call on the next in turn; `call(request, timeout_s)` raises
  `CallFailed` with the status of the call or of the stream. A deadline that passes while the loop is busy still takes
  an answer already read (`_expire`). A stream is retired after `max_age_s` (give or take a fifth, so that clients do
  not retire theirs together; a client's first streams sooner, `FIRST_STREAM_AGE_S`): later calls go on a new one,
  and once the old one's calls are answered or given up (their cancel messages sent), the client stops writing and
  the server, having answered every call it read, ends it with OK: no call fails for it. With the channel's
  round_robin policy (`bear.common.channels`) and a name that resolves to several replicas (a headless Service), each
  new stream goes to the replica gRPC's picker takes next (from a random start each time a replica connects or goes):
  several streams per replica spread a client's calls over them about evenly, and retiring streams brings replicas
  added later (found again as servers recycle connections) their share.
  `StreamedMethod` uses the twin and falls back to the unary method where a server has no twin (an older version),
  trying the twin again a minute later.

A stream of calls is one RPC for gRPC's OpenTelemetry interceptors, which would make it one span as long as the
stream: `not_a_call_stream` keeps them off it (every twin's name ends in "Stream"), and each call is a span of its own
here instead, named after the twin (`/bear.v1.Estimator/EstimateStream`), client side and server side, with the
context carried in the call message.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Generic, Protocol, TypeVar

import grpc
from opentelemetry import propagate, trace

logger = logging.getLogger("bear.call_streams")

CALL_STREAM_SUFFIX = "Stream"  # how a stream of calls is named: the unary method's name + "Stream"
MAX_CALLS_IN_FLIGHT = 512  # per stream: beyond this many unanswered calls the server stops reading the stream
UNARY_RETRY_S = 60.0  # a server without the twin is asked again after this long (it may have been upgraded)
LATE_TURNS = 4  # loop passes an expired call still waits: its answer may be read, passed on and taken meanwhile
# A client's stream is retired after this long (× 0.8–1.0): well within a server's connection-age grace
# (`bear.common.channels.MAX_CONNECTION_AGE_GRACE_MS`), after which a connection's streams are cut.
STREAM_MAX_AGE_S = 30.0
# The first stream of each of a client's places lives this long, the next twice as long, and so on up to the most: a
# channel just opened may have one replica connected of several, and its streams, all on that one, would keep to it.
FIRST_STREAM_AGE_S = 1.0
# A server span is an error only for these codes (OpenTelemetry's gRPC conventions, as its instrumentation does for
# unary calls): INVALID_ARGUMENT or ALREADY_EXISTS is the caller's mistake, not the server's.
_SERVER_ERROR_CODES = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED,
                                 grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL,
                                 grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS})


def _rpc_attributes(method: str) -> dict[str, str]:
    """The span attributes OpenTelemetry's gRPC instrumentation gives a unary call, for a call on a stream of
    `method` (/package.Service/Method)."""
    service, _, name = method.strip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


def _end_status(span: trace.Span, code: grpc.StatusCode, message: str, server: bool) -> None:
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code is not grpc.StatusCode.OK and (not server or code in _SERVER_ERROR_CODES):
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{code.name}: {message}"))

Request = TypeVar("Request")
Response = TypeVar("Response")


class CallFailed(Exception):
    """A call's error status: the server's (as the unary method would have answered), or the stream's."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class _CallMessage(Protocol):
    call_id: int
    request: Any
    trace_context: Any  # a protobuf map<string, string>
    timeout_ms: float  # the caller's deadline from when it sent the call; 0: none
    cancel: bool  # the caller stopped waiting for call_id

    def SerializeToString(self) -> bytes: ...  # noqa: N802, D102 - protobuf's names


class _ResultMessage(Protocol):
    call_id: int
    response: Any
    error: Any  # bear.v1.CallError

    def HasField(self, name: str) -> bool: ...  # noqa: N802, D102


def not_a_call_stream(details: Any) -> bool:
    """For the OpenTelemetry gRPC interceptors' `filter_`: false for a stream of calls (spanned call by call here)."""
    method = details.method
    if isinstance(method, bytes):  # grpc.aio's client call details carry bytes (grpc/grpc#31092)
        method = method.decode()
    return not method.endswith(CALL_STREAM_SUFFIX)


def _traced() -> bool:
    return not isinstance(trace.get_tracer(__name__), trace.NoOpTracer)


def _status(name: str) -> grpc.StatusCode:
    return grpc.StatusCode.__members__.get(name, grpc.StatusCode.UNKNOWN)


# Server --------------------------------------------------------------------------------------------------------------

OnError = Callable[[grpc.StatusCode], None]  # told the status of each call answered with an error (metrics)


def _no_count(code: grpc.StatusCode) -> None:
    pass


async def answer_unary(answer: Awaitable[Response], context: grpc.aio.ServicerContext,
                       on_error: OnError = _no_count) -> Response:
    """The unary method's body over the answer its stream twin uses: `CallFailed` becomes the call's status."""
    try:
        response = await answer
    except CallFailed as error:
        on_error(error.code)
        await context.abort(error.code, error.message)
        raise  # abort() raises: not reached
    except asyncio.CancelledError:
        # The caller's deadline passed or it cancelled, and gRPC cancelled this handler. OpenTelemetry's interceptor
        # catches Exception only: without this, the call's server span would end as OK.
        code = grpc.StatusCode.DEADLINE_EXCEEDED if _past_deadline(context) else grpc.StatusCode.CANCELLED
        on_error(code)
        _end_status(trace.get_current_span(), code, "the caller gave up before the answer", server=True)
        raise
    if _past_deadline(context):  # answered without yielding (gRPC could not cancel it), but too late
        on_error(grpc.StatusCode.DEADLINE_EXCEEDED)
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    return response


def _past_deadline(context: grpc.aio.ServicerContext) -> bool:
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0


class CallStreamServer(Generic[Request, Response]):
    """The handler of a stream of calls: each call answered by `answer` (the unary method's logic) in a task of its
    own, its result written as soon as it is ready. At most `max_in_flight` calls of a stream are answered at once:
    past that the stream is not read until one is done (gRPC's flow control then holds the caller's writes back), as
    a connection's limit of concurrent streams bounds unary calls; a caller that floods a stream, or reads no results,
    cannot pile up work without end."""

    def __init__(self, answer: Callable[[Request], Awaitable[Response]], result_type: Callable[..., Any],
                 span_name: str, max_in_flight: int = MAX_CALLS_IN_FLIGHT, on_error: OnError = _no_count) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._answer, self._result_type, self._span_name = answer, result_type, span_name
        self._on_error = on_error  # every call answered with an error: the service's, the stream's (a duplicate id,
        # a bad deadline), a deadline met, a cancel message
        self._max_in_flight = max_in_flight
        self._tracer = trace.get_tracer(__name__)
        self._streams: dict[asyncio.Task[Any], set[asyncio.Task[None]]] = {}  # handler task → its calls in flight
        self._closing: set[asyncio.Task[Any]] = set()

    async def serve(self, calls: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        in_flight: set[asyncio.Task[None]] = set()
        self._streams[handler] = in_flight
        write_lock = asyncio.Lock()  # gRPC takes one write at a time
        slots = asyncio.Semaphore(self._max_in_flight - 1)  # a call is read, then a slot taken for the next one
        call_ids: set[int] = set()  # of the calls in flight: a result must name one call only
        answering: dict[int, asyncio.Task[None]] = {}  # the calls being answered (not yet writing their result)
        traced = _traced()

        def done(call_id: int | None, task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            call_ids.discard(call_id)  # type: ignore[arg-type]
            slots.release()

        try:
            async for call in calls:
                if call.cancel:  # its caller gave up (a deadline met while this server was held up, a cancellation)
                    abandoned = answering.get(call.call_id)
                    if abandoned is not None:  # suspended in its answer: cancelled there, never half-way a write
                        abandoned.cancel()
                    continue
                duplicate = call.call_id in call_ids
                call_ids.add(call.call_id)
                task = asyncio.ensure_future(self._one(call, context, write_lock, traced, duplicate,
                                                       None if duplicate else answering))
                in_flight.add(task)
                task.add_done_callback(functools.partial(done, None if duplicate else call.call_id))
                await slots.acquire()  # free unless max_in_flight calls are unanswered
        except asyncio.CancelledError:
            if handler not in self._closing:  # the caller is gone (its stream cancelled, its process dead): its calls
                for task in list(in_flight):  # are given up, as gRPC cancels a unary handler (QA: a Route call went on
                    task.cancel()  # to be decided and recorded for a client that was gone)
                raise
        finally:
            del self._streams[handler]
            self._closing.discard(handler)
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)

    async def close(self) -> None:
        """Ends every stream (status OK) once its calls in flight are answered; new streams are still served."""
        for handler, in_flight in list(self._streams.items()):
            if in_flight:
                await asyncio.gather(*list(in_flight), return_exceptions=True)
            self._closing.add(handler)
            handler.cancel()

    async def _one(self, call: _CallMessage, context: grpc.aio.ServicerContext, write_lock: asyncio.Lock,
                   traced: bool, duplicate: bool, answering: dict[int, asyncio.Task[None]] | None) -> None:
        """Answers one call and writes its result; `answering` holds it while it is being answered, for a cancel
        message to end it there (a CancelledError out of here: nothing is written, nobody waits)."""
        result = self._result_type(call_id=call.call_id)
        with self._span(call, traced) as span:
            try:
                if duplicate or answering is None:
                    raise CallFailed(grpc.StatusCode.INVALID_ARGUMENT, f"call_id {call.call_id} is already in flight "
                                                                       "on this stream: each call needs its own")
                task = asyncio.current_task()
                assert task is not None
                answering[call.call_id] = task
                try:
                    response = await self._answer_in_time(call)
                finally:
                    answering.pop(call.call_id, None)
                result.response.CopyFrom(response)
            except CallFailed as error:
                result.error.code, result.error.message = error.code.name, error.message
            except asyncio.CancelledError:  # a cancel message (nothing is written) or the stream's end
                self._on_error(grpc.StatusCode.CANCELLED)
                if span is not None:
                    _end_status(span, grpc.StatusCode.CANCELLED, "the caller stopped waiting", server=True)
                raise
            except Exception as error:  # noqa: BLE001 - as gRPC answers a unary handler's unexpected exception
                logger.exception("%s: unexpected error", self._span_name)
                result.error.code, result.error.message = "UNKNOWN", f"Unexpected {type(error).__name__}: {error}"
            code = grpc.StatusCode[result.error.code] if result.HasField("error") else grpc.StatusCode.OK
            if code is not grpc.StatusCode.OK:
                self._on_error(code)
            if span is not None:
                _end_status(span, code, result.error.message, server=True)
        try:
            async with write_lock:
                await context.write(result)
        except Exception:  # noqa: BLE001 - AioRpcError, UsageError, cygrpc's ExecuteBatchError: the stream is gone
            logger.debug("%s: the result of call %d had no stream to go to", self._span_name, call.call_id)

    async def _answer_in_time(self, call: _CallMessage) -> Any:
        """The answer, given up at the caller's deadline as gRPC gives up a unary handler (the caller has stopped
        waiting: a Route decided after that would record a dispatch for a query never sent, and claim its id)."""
        timeout_ms = call.timeout_ms
        if timeout_ms == 0:  # none
            return await self._answer(call.request)
        if not (math.isfinite(timeout_ms) and timeout_ms > 0):
            raise CallFailed(grpc.StatusCode.INVALID_ARGUMENT,
                             f"timeout_ms must be a number of milliseconds > 0 (0: no deadline), got {timeout_ms!r}")
        try:
            async with asyncio.timeout(timeout_ms / 1000) as deadline:
                response = await self._answer(call.request)
        except TimeoutError:
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        when = deadline.when()
        if when is not None and asyncio.get_running_loop().time() > when:  # answered without yielding, too late
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        return response

    def _span(self, call: _CallMessage, traced: bool) -> AbstractContextManager[trace.Span | None]:
        if not traced:
            return nullcontext()
        parent = propagate.extract(dict(call.trace_context)) if call.trace_context else None
        return self._tracer.start_as_current_span(self._span_name, context=parent, kind=trace.SpanKind.SERVER,
                                                  attributes=_rpc_attributes(self._span_name))


# Client --------------------------------------------------------------------------------------------------------------

class _OpenStream:
    def __init__(self, call: grpc.aio.StreamStreamCall, slot: int, retire_at: float) -> None:
        self.call = call
        self.slot = slot  # its place among the client's streams
        self.retire_at = retire_at  # loop time after which new calls go on a new stream
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.write_lock = asyncio.Lock()
        self.reader: asyncio.Task[None] | None = None
        self.ended: CallFailed | None = None
        self.retired = False  # no new calls; once those it carries are answered (or given up), it is written to the end
        self.finishing = False  # its end is written (done_writing) once the writes queued before are done
        self.half_closed = False  # its end is written: nothing more can be (a cancel message, say)


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A write's failure is its call's (raised there when the call still waits): retrieved here for when it does not."""
    if not task.cancelled():
        task.exception()


def _expire(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], turns: int) -> None:
    """A call's deadline: after `turns` more passes of the loop, so that an answer that reached the socket before the
    deadline, while the loop was busy, is taken (as gRPC's own deadline would: it is the transport's clock)."""
    if future.done():
        return
    if turns > 0:
        loop.call_soon(_expire, loop, future, turns - 1)
    else:
        future.set_exception(CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))


class CallStream(Generic[Request, Response]):
    """Calls over up to `width` streams of `method`, each call on the next stream in turn; a stream is opened when a
    call needs it, again after it ended (the server restarted, the connection broke, the server closed it at
    shutdown) and after `max_age_s` (the old one retired: it ends once its calls are answered). A stream that ends
    fails its calls in flight with its status; later calls open a new one."""

    def __init__(self, channel: grpc.aio.Channel, method: str, call_type: Callable[..., Any], result_type: Any,
                 traced: bool = True, width: int = 1, max_age_s: float = STREAM_MAX_AGE_S) -> None:
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        if not (max_age_s > 0):
            raise ValueError(f"max_age_s must be > 0, got {max_age_s}")
        self._open = channel.stream_stream(method, request_serializer=call_type.SerializeToString,
                                           response_deserializer=result_type.FromString)
        self._call_type, self._span_name, self._traced = call_type, method, traced
        self._ids = itertools.count(1)
        self._streams: list[_OpenStream | None] = [None] * width
        self._opened = [0] * width  # streams opened in each place so far
        self._turns = itertools.cycle(range(width))
        self._max_age_s = max_age_s
        self._tracer = trace.get_tracer(__name__)
        self._live: set[_OpenStream] = set()  # every stream not yet ended, retired ones too
        self._retiring: set[asyncio.Task[None]] = set()

    async def call(self, request: Request, timeout_s: float) -> Response:
        message = self._call_type(call_id=next(self._ids), timeout_ms=timeout_s * 1000)
        message.request.CopyFrom(request)
        if not self._traced:
            return await self._exchange(message, timeout_s)
        with self._tracer.start_as_current_span(self._span_name, kind=trace.SpanKind.CLIENT,
                                                attributes=_rpc_attributes(self._span_name)) as span:
            propagate.inject(message.trace_context)
            try:
                response = await self._exchange(message, timeout_s)
            except CallFailed as error:
                _end_status(span, error.code, error.message, server=False)
                raise
            span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.OK.value[0])
            return response

    async def close(self) -> None:
        self._streams = [None] * len(self._streams)
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        for stream in list(self._live):
            stream.call.cancel()
            if stream.reader is not None:
                # Its read may wait on gRPC for good when the loop was interrupted half-way through a callback (a
                # signal raised there): cancelled, it ends now, whatever gRPC does.
                stream.reader.cancel()
                await asyncio.gather(stream.reader, return_exceptions=True)

    def _stream(self) -> _OpenStream:
        """The stream for the next call: the next in turn, opened anew when it ended or is due to retire."""
        slot = next(self._turns)
        stream = self._streams[slot]
        if stream is not None and stream.ended is None:
            if asyncio.get_running_loop().time() < stream.retire_at:
                return stream
            self._retire(stream)
        return self._start(slot)

    async def _exchange(self, message: _CallMessage, timeout_s: float) -> Response:
        stream = self._stream()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        future: asyncio.Future[Response] = loop.create_future()
        stream.pending[message.call_id] = future
        expiry = loop.call_at(deadline, _expire, loop, future, LATE_TURNS)
        # The write is a task of its own: a deadline or a cancellation of this call must not interrupt it half-way,
        # which would make grpc.aio cancel the stream, and with it every other call on it.
        writing = asyncio.ensure_future(self._write(stream, message, future))
        writing.add_done_callback(_retrieved)
        try:
            async with asyncio.timeout_at(deadline):  # a stream still connecting, a write held up
                # The call may end before its write does: the stream closed or ended while the write waits on a peer
                # that reads nothing (a write is not woken by that).
                await asyncio.wait((writing, future), return_when=asyncio.FIRST_COMPLETED)
                if not future.done():
                    writing.result()  # written, or the stream's end that stopped the write
                return await future
        except TimeoutError:
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        finally:
            expiry.cancel()
            if stream.pending.pop(message.call_id, None) is not None and stream.ended is None:
                # Not answered: the server may not even have read the call yet (it was held up). Tell it, so that it
                # does not answer (route, record) a call nobody waits for, as gRPC cancels a unary call.
                self._cancel(stream, message.call_id)
            if stream.retired and not stream.pending:
                self._finish(stream)  # after the cancel message, if any (the write lock is first come, first served)
            if not future.done():
                future.cancel()  # nobody waits for it any more: a late answer or expiry leaves it alone
            elif not future.cancelled():
                future.exception()  # retrieved: the stream's end may have failed it after the error raised here

    def _retire(self, stream: _OpenStream) -> None:
        """No new calls on `stream`; once those it carries are answered or given up (their cancel messages sent), the
        client says it has finished writing, and the server, having answered every call it read, ends the stream
        with OK (its reader then ends)."""
        stream.retired = True
        if not stream.pending:
            self._finish(stream)

    def _finish(self, stream: _OpenStream) -> None:
        if stream.finishing:
            return
        stream.finishing = True

        async def finish() -> None:
            try:
                async with stream.write_lock:  # after the writes queued before (the lock is first come, first served)
                    if stream.ended is None:
                        stream.half_closed = True
                        await stream.call.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                pass  # the stream ended meanwhile: its reader has the status

        task = asyncio.ensure_future(finish())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _cancel(self, stream: _OpenStream, call_id: int) -> None:
        async def write() -> None:
            async with stream.write_lock:
                if stream.ended is None and not stream.half_closed:
                    await stream.call.write(self._call_type(call_id=call_id, cancel=True))

        asyncio.ensure_future(write()).add_done_callback(_retrieved)

    @staticmethod
    async def _write(stream: _OpenStream, message: _CallMessage, future: asyncio.Future[Any]) -> None:
        try:
            async with stream.write_lock:
                if stream.ended is not None:
                    raise stream.ended
                if future.done():
                    return  # the call ended (its deadline, its caller) while waiting for its turn: not sent
                await stream.call.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            # The stream ended while writing: its status, once the reader has it.
            await asyncio.gather(stream.reader, return_exceptions=True)  # type: ignore[arg-type]
            raise stream.ended or CallFailed(grpc.StatusCode.UNAVAILABLE, "the stream of calls ended") from None

    def _start(self, slot: int) -> _OpenStream:
        age_s = min(self._max_age_s, FIRST_STREAM_AGE_S * 2.0 ** min(self._opened[slot], 64))
        self._opened[slot] += 1
        retire_at = asyncio.get_running_loop().time() + age_s * random.uniform(0.8, 1.0)
        stream = self._streams[slot] = _OpenStream(self._open(), slot, retire_at)
        self._live.add(stream)
        stream.reader = asyncio.ensure_future(self._read(stream))
        return stream

    async def _read(self, stream: _OpenStream) -> None:
        ended = CallFailed(grpc.StatusCode.UNAVAILABLE, "the stream of calls ended")
        try:
            while True:
                result: _ResultMessage = await stream.call.read()
                if result is grpc.aio.EOF:
                    break
                future = stream.pending.pop(result.call_id, None)
                if future is None or future.done():
                    continue  # a call that timed out
                if result.HasField("error"):
                    future.set_exception(CallFailed(_status(result.error.code), result.error.message))
                else:
                    future.set_result(result.response)
        except grpc.aio.AioRpcError as error:
            ended = CallFailed(error.code(), error.details() or error.code().name)
        except asyncio.CancelledError:
            ended = CallFailed(grpc.StatusCode.CANCELLED, "the stream of calls was closed")
        finally:
            stream.ended = ended
            self._live.discard(stream)
            if self._streams[stream.slot] is stream:
                self._streams[stream.slot] = None
            for future in stream.pending.values():
                if not future.done():
                    future.set_exception(ended)
            stream.pending.clear()


class StreamedMethod(Generic[Request, Response]):
    """A unary method called over its stream twin; over the unary method itself where the server has no twin
    (UNIMPLEMENTED: an older server), and the twin tried again `UNARY_RETRY_S` later. Every failure is `CallFailed`."""

    def __init__(self, unary: grpc.aio.UnaryUnaryMultiCallable, stream: CallStream[Request, Response] | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._unary, self._stream, self._clock = unary, stream, clock
        self._unary_until = float("-inf")  # the server had no twin: unary calls until then

    @property
    def streamed(self) -> bool:
        return self._stream is not None and self._clock() >= self._unary_until

    async def __call__(self, request: Request, timeout_s: float,
                       metadata: Sequence[tuple[str, str]] | None = None) -> Response:
        """`metadata` goes with a unary call only (a stream's call carries its trace context in its message)."""
        if self.streamed:
            assert self._stream is not None
            try:
                return await self._stream.call(request, timeout_s)
            except CallFailed as error:
                if error.code is not grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self._unary_until = self._clock() + UNARY_RETRY_S
        try:
            return await self._unary(request, timeout=timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError as error:
            raise CallFailed(error.code(), error.details() or error.code().name) from None

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.close()
