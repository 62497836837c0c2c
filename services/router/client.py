"""A typed Python client of the router (bear.v1.Router), blocking or asyncio.

    from bear.router.client import RouterClient

    with RouterClient("localhost:50051") as router:
        decision = router.route(prompt="Summarize the audit report in about 200 words.", ttft_slo_ms=500)
        print(decision.instance_id, decision.endpoint, decision.reason)
        ...  # send the query to decision.endpoint with X-Request-Id: decision.request_id, then:
        router.report_outcome(decision.request_id, observed_ttft_ms=312.0, output_tokens=180, observed_e2e_ms=2900)

`AsyncRouterClient` has the same methods as coroutines; it routes over one long-lived stream of Route calls
(`RouteStream`, opened on the first call: a call on it costs about half a unary call's time), or unary Route calls
with `streamed=False`, where the router has no stream twin, and for a request over STREAMED_REQUEST_BYTES (a message
over the router's size limit ends the stream it goes on, with every call on it: alone, only its own call fails).
Replies are the bear.v1 messages (`RouteDecision`, `OutcomeAck`). Every call has a deadline (`timeout_s`, per client
and per call, at most MAX_TIMEOUT_S). Arguments that cannot make a request (both or neither of prompt and
prompt_tokens, a count or a time that is no number, a string as allowed_models, a deadline <= 0) raise ValueError
before any call. The client's channel reconnects within about a second of a router coming back (gRPC's own back-off
grows to two minutes). The caller's OpenTelemetry context goes with every call, so that the router's decision span
is in the caller's trace: in the call's message over the stream, as gRPC metadata on a unary call over the client's
own channel (a channel given to the client carries what its interceptors add). Errors:

    InvalidRequest      the router refused the request (INVALID_ARGUMENT, or RESOURCE_EXHAUSTED: a request larger
                        than the router takes); the message names the field
    DuplicateRequest    an InvalidRequest: the request id was routed already (ALREADY_EXISTS)
    RouterUnavailable   the router is unreachable or shutting down (its calls cancelled), or no instance is ready
                        (UNAVAILABLE)
    RouterTimeout       the deadline passed (DEADLINE_EXCEEDED)
    RouterError         anything else (the base class of the three); CANCELLED: the client was closed, also under
                        the calls in flight when it was
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections.abc import Iterable, Sequence
from types import TracebackType

import grpc

from opentelemetry import propagate

from bear.common.call_streams import CallFailed, CallStream, StreamedMethod
from bear.common.channels import CLIENT_CHANNEL_OPTIONS
from bear.v1 import router_pb2, router_pb2_grpc

DEFAULT_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 1e6  # gRPC's deadline arithmetic overflows past ~1e9 s, and the call then fails at once
STREAMED_REQUEST_BYTES = 256 * 1024  # larger Route requests (long prompts) go unary
# The router may restart (a rollout): found again within about a second; router replicas behind one name (a headless
# Service) take the calls in turn (`bear.common.channels`).
CHANNEL_OPTIONS = CLIENT_CHANNEL_OPTIONS
ROUTE_STREAM = f"/{router_pb2.DESCRIPTOR.services_by_name['Router'].full_name}/RouteStream"


class RouterError(Exception):
    """A failed call; `code` is the gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code, self.message = code, message


class InvalidRequest(RouterError):
    pass


class DuplicateRequest(InvalidRequest):
    pass


class RouterUnavailable(RouterError):
    pass


class RouterTimeout(RouterError):
    pass


def route_request(*, prompt: str | None, prompt_tokens: int | None, ttft_slo_ms: float, policy: str,
                  allowed_models: Sequence[str], request_id: str, lambda_per_micro_usd: float | None,
                  delta_per_s: float | None, max_tokens: int | None = None) -> router_pb2.RouteRequest:
    """The RouteRequest of these arguments; exactly one of `prompt` and `prompt_tokens`."""
    if (prompt is None) == (prompt_tokens is None):
        given = "both" if prompt is not None else "neither"
        raise ValueError(f"give either prompt (the text) or prompt_tokens (a length-only query), not {given}")
    # what a uint32 holds; the router checks > 0
    if prompt_tokens is not None and (not _is_integer(prompt_tokens) or not 0 <= prompt_tokens < 1 << 32):
        raise ValueError(f"prompt_tokens must be a number of tokens, got {prompt_tokens!r}")
    if isinstance(allowed_models, str):
        raise ValueError(f"allowed_models is a sequence of model names, got the string {allowed_models!r}")
    models = list(allowed_models) if isinstance(allowed_models, Iterable) else None  # a generator is read once
    if models is None or not all(isinstance(m, str) for m in models):
        raise ValueError(f"allowed_models must be a sequence of model names, got {allowed_models!r}")
    for index, model in enumerate(models):
        _require_text(f"allowed_models[{index}]", model)
    _require_text("prompt", prompt)
    _require_text("policy", policy)
    _require_text("request_id", request_id)
    _require_number("ttft_slo_ms", ttft_slo_ms)
    for name, value in (("lambda_per_micro_usd", lambda_per_micro_usd), ("delta_per_s", delta_per_s)):
        if value is not None:
            _require_number(name, value)
    request = router_pb2.RouteRequest(request_id=request_id, ttft_slo_ms=ttft_slo_ms, policy=policy,
                                      allowed_models=models)
    if prompt is not None:
        request.prompt = prompt
    else:
        request.prompt_tokens = prompt_tokens  # type: ignore[assignment]
    if max_tokens is not None:
        if not _is_integer(max_tokens) or not 1 <= max_tokens < 1 << 32:
            raise ValueError(f"max_tokens must be a number of tokens >= 1, got {max_tokens!r}")
        request.max_tokens = max_tokens
    if lambda_per_micro_usd is not None:
        request.lambda_per_micro_usd = lambda_per_micro_usd
    if delta_per_s is not None:
        request.delta_per_s = delta_per_s
    return request


def outcome_report(request_id: str, observed_ttft_ms: float, output_tokens: int,
                   observed_e2e_ms: float) -> router_pb2.OutcomeReport:
    _require_text("request_id", request_id)
    if not _is_integer(output_tokens) or not 0 <= output_tokens < 1 << 32:
        raise ValueError(f"output_tokens must be a number of tokens >= 0, got {output_tokens!r}")
    _require_number("observed_ttft_ms", observed_ttft_ms)
    _require_number("observed_e2e_ms", observed_e2e_ms)
    return router_pb2.OutcomeReport(request_id=request_id, observed_ttft_ms=observed_ttft_ms,
                                    output_tokens=output_tokens, observed_e2e_ms=observed_e2e_ms)


def _is_integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _require_text(name: str, value: object) -> None:
    """A string field (protobuf would raise TypeError naming no field)."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {value!r}")
    if value is not None and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate: protobuf would raise naming no field
            raise ValueError(f"{name} is not valid Unicode text: {error.reason} at position {error.start}") from None


def _require_number(name: str, value: object) -> None:
    """A value the router reads as a number (protobuf would take None as 0, and raise TypeError on a string)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        float(value)
    except OverflowError:  # past a double's range (protobuf's double field would raise it, naming no field)
        size = f"an integer of {value.bit_length()} bits" if isinstance(value, int) else f"a {type(value).__name__}"
        raise ValueError(f"{name} must be a number a double can hold, got {size} past its range") from None


def deadline_s(timeout_s: float | None, default_s: float) -> float:
    """A call's deadline: `timeout_s`, or the client's `default_s` when None."""
    chosen = default_s if timeout_s is None else timeout_s
    # The range first: math.isfinite of an int past a double's range raises OverflowError.
    if (not isinstance(chosen, numbers.Real) or isinstance(chosen, bool) or not 0 < chosen <= MAX_TIMEOUT_S
            or not math.isfinite(chosen)):
        shown = (repr(chosen) if not isinstance(chosen, int) or chosen.bit_length() < 64
                 else f"an integer of {chosen.bit_length()} bits")
        raise ValueError(f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {shown}")
    return float(chosen)


def error_of(error: grpc.RpcError | CallFailed) -> RouterError:
    if isinstance(error, CallFailed):
        code, message = error.code, error.message
    else:
        code = error.code()  # type: ignore[attr-defined]
        message = error.details() or ""  # type: ignore[attr-defined]
    kind = {grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest, grpc.StatusCode.ALREADY_EXISTS: DuplicateRequest,
            grpc.StatusCode.RESOURCE_EXHAUSTED: InvalidRequest,  # a message over the router's size limit
            grpc.StatusCode.UNAVAILABLE: RouterUnavailable,
            grpc.StatusCode.CANCELLED: RouterUnavailable,  # by the router: it is shutting down (ours: closed())
            grpc.StatusCode.DEADLINE_EXCEEDED: RouterTimeout}.get(code, RouterError)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in message:  # gRPC's words name no field
        message = f"the request (prompt, request_id, allowed_models) is larger than the router takes: {message}"
    return kind(code, message)


def _closed() -> RouterError:
    return RouterError(grpc.StatusCode.CANCELLED, "the client is closed")


class RouterClient:
    """Blocking client. Give `address` (host:port; a plaintext channel is opened and closed by the client) or your
    own `channel` (TLS, interceptors; you close it)."""

    def __init__(self, address: str | None = None, *, channel: grpc.Channel | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if (address is None) == (channel is None):
            raise ValueError("give either address or channel")
        self._timeout_s = deadline_s(timeout_s, DEFAULT_TIMEOUT_S)  # before a channel is opened: none to leak
        self._own = channel is None
        self._channel = channel or grpc.insecure_channel(address, options=CHANNEL_OPTIONS)  # type: ignore[arg-type]
        self._stub = router_pb2_grpc.RouterStub(self._channel)
        self._closed = False

    def route(self, prompt: str | None = None, *, ttft_slo_ms: float, prompt_tokens: int | None = None,
              policy: str = "", allowed_models: Sequence[str] = (), request_id: str = "",
              lambda_per_micro_usd: float | None = None, delta_per_s: float | None = None,
              max_tokens: int | None = None, timeout_s: float | None = None) -> router_pb2.RouteDecision:
        request = route_request(prompt=prompt, prompt_tokens=prompt_tokens, ttft_slo_ms=ttft_slo_ms, policy=policy,
                                allowed_models=allowed_models, request_id=request_id,
                                lambda_per_micro_usd=lambda_per_micro_usd, delta_per_s=delta_per_s,
                                max_tokens=max_tokens)
        if self._closed:
            raise _closed()
        try:
            return self._stub.Route(request, timeout=deadline_s(timeout_s, self._timeout_s),
                                    metadata=self._trace_context())
        except grpc.RpcError as error:
            if self._closed:  # closed by another thread while the call was in flight
                raise _closed() from None
            raise error_of(error) from None
        except ValueError:  # "Cannot invoke RPC on closed channel!": closed by another thread meanwhile
            if self._closed:
                raise _closed() from None
            raise

    def report_outcome(self, request_id: str, *, observed_ttft_ms: float, output_tokens: int = 0,
                       observed_e2e_ms: float = 0.0, timeout_s: float | None = None) -> router_pb2.OutcomeAck:
        report = outcome_report(request_id, observed_ttft_ms, output_tokens, observed_e2e_ms)
        if self._closed:
            raise _closed()
        try:
            return self._stub.ReportOutcome(report, timeout=deadline_s(timeout_s, self._timeout_s),
                                            metadata=self._trace_context())
        except grpc.RpcError as error:
            if self._closed:
                raise _closed() from None
            raise error_of(error) from None
        except ValueError:  # as in route
            if self._closed:
                raise _closed() from None
            raise

    def close(self) -> None:
        self._closed = True
        if self._own:
            self._channel.close()

    def _trace_context(self) -> tuple[tuple[str, str], ...] | None:
        return _trace_context() if self._own else None

    def __enter__(self) -> RouterClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


class AsyncRouterClient:
    """asyncio client, created inside the event loop that uses it (its channel belongs to that loop: a RuntimeError
    says so otherwise). Route calls go over one stream of calls (`streamed`, the default) or are unary."""

    def __init__(self, address: str | None = None, *, channel: grpc.aio.Channel | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, streamed: bool = True) -> None:
        if (address is None) == (channel is None):
            raise ValueError("give either address or channel")
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("AsyncRouterClient must be created inside the event loop that uses it (in a "
                               "coroutine); RouterClient is the blocking client") from None
        self._timeout_s = deadline_s(timeout_s, DEFAULT_TIMEOUT_S)  # before a channel is opened: none to leak
        self._own = channel is None
        self._channel = channel or grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)  # type: ignore[arg-type]
        self._stub = router_pb2_grpc.RouterStub(self._channel)
        stream = CallStream(self._channel, ROUTE_STREAM, router_pb2.RouteCall, router_pb2.RouteResult) if streamed \
            else None
        self._route = StreamedMethod(self._stub.Route, stream)
        self._is_closed = False

    async def route(self, prompt: str | None = None, *, ttft_slo_ms: float, prompt_tokens: int | None = None,
                    policy: str = "", allowed_models: Sequence[str] = (), request_id: str = "",
                    lambda_per_micro_usd: float | None = None, delta_per_s: float | None = None,
                    max_tokens: int | None = None, timeout_s: float | None = None) -> router_pb2.RouteDecision:
        request = route_request(prompt=prompt, prompt_tokens=prompt_tokens, ttft_slo_ms=ttft_slo_ms, policy=policy,
                                allowed_models=allowed_models, request_id=request_id,
                                lambda_per_micro_usd=lambda_per_micro_usd, delta_per_s=delta_per_s,
                                max_tokens=max_tokens)
        deadline = deadline_s(timeout_s, self._timeout_s)
        self._check_usable()
        try:
            metadata = _trace_context() if self._own else None
            if request.ByteSize() > STREAMED_REQUEST_BYTES:
                return await self._stub.Route(request, timeout=deadline, metadata=metadata)
            return await self._route(request, deadline, metadata)
        except (CallFailed, grpc.RpcError) as error:
            if self._is_closed:  # the stream of calls, or the channel, ended by close()
                raise _closed() from None
            raise error_of(error) from None
        except grpc.aio.UsageError:  # the channel is closed
            raise _closed() from None
        except asyncio.CancelledError:
            raise self._cancelled() from None

    async def report_outcome(self, request_id: str, *, observed_ttft_ms: float, output_tokens: int = 0,
                             observed_e2e_ms: float = 0.0, timeout_s: float | None = None) -> router_pb2.OutcomeAck:
        report = outcome_report(request_id, observed_ttft_ms, output_tokens, observed_e2e_ms)
        deadline = deadline_s(timeout_s, self._timeout_s)
        self._check_usable()
        try:
            return await self._stub.ReportOutcome(report, timeout=deadline,
                                                  metadata=_trace_context() if self._own else None)
        except grpc.RpcError as error:
            if self._is_closed:
                raise _closed() from None
            raise error_of(error) from None
        except grpc.aio.UsageError:  # the channel is closed
            raise _closed() from None
        except asyncio.CancelledError:
            raise self._cancelled() from None

    async def close(self) -> None:
        if asyncio.get_running_loop() is not self._loop:  # its calls and channel are that loop's: nothing changes
            raise RuntimeError("this AsyncRouterClient belongs to another event loop: close it in that loop")
        self._is_closed = True
        await self._route.close()
        if self._own:
            await self._channel.close()

    def _check_usable(self) -> None:
        if self._is_closed:
            raise _closed()
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("this AsyncRouterClient belongs to another event loop: create one in each loop")

    def _cancelled(self) -> BaseException:
        """A call of a closed channel ends in CancelledError, in a task nobody cancelled: that is the client's
        close, said as such; a cancellation of the caller's own task stays one."""
        task = asyncio.current_task()
        if task is not None and task.cancelling() == 0:
            return _closed()
        return asyncio.CancelledError()

    async def __aenter__(self) -> AsyncRouterClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()


def _trace_context() -> tuple[tuple[str, str], ...] | None:
    """The caller's trace context (W3C `traceparent` by default) as a unary call's metadata, so that the decision's
    span is a child of the caller's, as over the stream of calls (QA: a prompt sent unary, over 256 KiB or with
    `streamed=False`, started a trace of its own). Only on the client's own channel: a channel given to the client
    carries what its own interceptors add."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items()) or None
