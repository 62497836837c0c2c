"""How every BEAR gRPC service runs (router, estimator, predictor): one grpc.aio server with the service's servicers,
`grpc.health.v1`, server reflection, OpenTelemetry spans for every call (configured by the standard OTEL_*
variables), Prometheus metrics over HTTP, and a graceful shutdown on SIGTERM/SIGINT (health turns NOT_SERVING, calls
in flight finish within the grace period).

A server that cannot start (its address is not local, its port is taken — a second server is never let share it —, or
the /metrics port is taken) raises ServiceStartError naming the flag and the address; `run_event_loop` prints it and
exits with status 2. A request whose bytes do not decode as the method's message is answered INVALID_ARGUMENT
("malformed request: ...") before any servicer sees it (`_GuardedRegistration`; `guarded` for the snapshotter's
blocking server), for every service alike.

Tracing: `OTEL_TRACES_EXPORTER` lists the exporters (`otlp`, `console`, `none`); unset, spans go to an OTLP collector
when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` names one, over gRPC (or
`OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL=http/protobuf`), and otherwise are created (so that context propagates between
services) but not exported. `OTEL_SERVICE_NAME` or `service.name` in `OTEL_RESOURCE_ATTRIBUTES` names the service
(default: the service's own name). A setting that the exporters refuse (a malformed endpoint, timeout or compression)
is logged with the variables involved and the service runs without that exporter: tracing never keeps a service from
serving (the values the SDK itself would fail on, span limits and propagators, are left out before it is imported:
bear.common.otel_settings, from `bear`'s entry point). At shutdown the spans still queued get at most TRACING_FLUSH_S to reach the collector.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import inspect
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from bear.common.channels import CONNECTION_AGE_OPTIONS

logger = logging.getLogger("bear.service")

EXIT_BAD_INPUT = 2
# gRPC sets SO_REUSEPORT on Linux by default: a second server on a port in use would start and share its calls.
NO_REUSEPORT = (("grpc.so_reuseport", 0),)
# The router's, the estimator's and the predictor's: their connections recycled (`bear.common.channels`), so that the
# replicas behind one name share the calls. (Not the snapshotter sidecar's, one per engine: its WatchSnapshots streams
# may last for good.)
SERVER_OPTIONS = (*NO_REUSEPORT, *CONNECTION_AGE_OPTIONS)
GRPC_DEFAULT_MAX_RECEIVE_BYTES = 4 * 1024 * 1024
BACKGROUND_STOP_S = 2.0  # at shutdown, for the background tasks to unwind once cancelled
TRACING_FLUSH_S = 2.0  # at shutdown, for the queued spans (an unreachable collector must not hold the exit)
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
TRACES_EXPORTERS = ("otlp", "console", "none")


def receive_limit(max_field_bytes: int) -> int:
    """A server's message limit for requests holding one field of up to `max_field_bytes` (a prompt): room for it
    several times over, so that a field somewhat over its limit still reaches the handler and is refused with the
    field's name; never below gRPC's default."""
    return min(2**31 - 1, max(2 * GRPC_DEFAULT_MAX_RECEIVE_BYTES, 2 * max_field_bytes + 1024 * 1024))


HEALTH_WATCH = "/grpc.health.v1.Health/Watch"


class ServiceStartError(Exception):
    """The server could not start; the message names the command, the flag and the address."""


@dataclass(frozen=True, slots=True)
class ServerSettings:
    service_name: str  # e.g. "bear-router": OTel service name unless OTEL_SERVICE_NAME says otherwise
    host: str = "[::]"
    grpc_port: int = 0  # 0: any free port
    metrics_port: int | None = 9464  # Prometheus /metrics; None: not served
    shutdown_grace_s: float = 5.0
    # gRPC refuses a larger request itself (RESOURCE_EXHAUSTED, before any handler): a service whose own limit on a
    # field is larger sets this above it, so that the field's limit answers (INVALID_ARGUMENT naming the field).
    max_receive_message_bytes: int = GRPC_DEFAULT_MAX_RECEIVE_BYTES


def configure_tracing(service_name: str, environ: Mapping[str, str] = os.environ,
                      extra_processors: Iterable[SpanProcessor] = ()) -> TracerProvider:
    """Installs the process's tracer provider from the OTEL_* variables (once; later calls return it)."""
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        for processor in extra_processors:
            current.add_span_processor(processor)
        return current
    provider = TracerProvider(resource=_resource(service_name, environ))
    for name in _exporter_names(environ):
        processor = _processor(name, environ)
        if processor is not None:
            provider.add_span_processor(processor)
    for processor in extra_processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    return provider


def shutdown_tracing(flush_s: float = TRACING_FLUSH_S) -> None:
    """Sends the queued spans (for at most `flush_s`: a collector that does not answer gets no more), then shuts the
    exporters down (the SDK's own exit hook would wait for every export's deadline and retries, ~10 s each)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        return
    flush = threading.Thread(target=provider.force_flush, name="bear-tracing-flush", daemon=True)
    flush.start()
    flush.join(flush_s)
    if flush.is_alive():
        logger.warning("tracing: the spans still queued did not reach the collector within %g s: dropped", flush_s)
        for exporter in _EXPORTERS:  # ends the export in progress and its retries
            exporter.shutdown()
    _EXPORTERS.clear()
    provider.shutdown()


_EXPORTERS: list[Any] = []  # this process's span exporters, for shutdown_tracing


def _resource(service_name: str, environ: Mapping[str, str]) -> Resource:
    """OTEL_RESOURCE_ATTRIBUTES, and the service's name: OTEL_SERVICE_NAME, else theirs, else `service_name`."""
    detected = Resource.create({})  # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME of the process
    named = str(detected.attributes.get("service.name", ""))
    name = environ.get("OTEL_SERVICE_NAME") or (named if named and not named.startswith("unknown_service")
                                                 else service_name)
    return detected.merge(Resource({"service.name": name}))


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    """OTEL_TRACES_EXPORTER's names (unknown ones logged and left out); unset: otlp where an endpoint is set."""
    listed = [e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
    if not listed:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    unknown = [e for e in listed if e not in TRACES_EXPORTERS]
    if unknown:
        logger.warning("tracing: OTEL_TRACES_EXPORTER names %s, not one of %s: ignored", ", ".join(unknown),
                       ", ".join(TRACES_EXPORTERS))
    return [] if "none" in listed else [e for e in dict.fromkeys(listed) if e in TRACES_EXPORTERS]


def _processor(name: str, environ: Mapping[str, str]) -> SpanProcessor | None:
    """A batch processor for the exporter `name`, or None (logged) where the OTEL_* settings make one impossible."""
    try:
        exporter = ConsoleSpanExporter() if name == "console" else _otlp_exporter(environ)
        processor = BatchSpanProcessor(exporter)
    except Exception as error:  # noqa: BLE001 - ValueError, the exporters' own: a bad setting must not stop serving
        involved = sorted(k for k in environ if k.startswith(("OTEL_EXPORTER_OTLP", "OTEL_BSP_")))
        logger.error("tracing: the %s exporter cannot be configured from %s (%s: %s): spans are not exported there",
                     name, ", ".join(involved) or "the OTEL_* variables", type(error).__name__, error)
        return None
    _EXPORTERS.append(exporter)
    return processor


def _otlp_exporter(environ: Mapping[str, str]):  # noqa: ANN202 - an OTLP span exporter
    variable = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" if environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                else "OTEL_EXPORTER_OTLP_PROTOCOL")
    protocol = environ.get(variable) or "grpc"
    if protocol not in OTLP_PROTOCOLS:
        logger.warning("tracing: %s=%s is not one of %s: using grpc", variable, protocol, ", ".join(OTLP_PROTOCOLS))
        protocol = "grpc"
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[no-redef]
    return OTLPSpanExporter()


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """Interceptors for outbound channels: spans and trace-context propagation."""
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    from bear.common.call_streams import not_a_call_stream

    return list(aio_client_interceptors(filter_=not_a_call_stream))  # a stream of calls spans each call itself


Register = Callable[[grpc.aio.Server], Iterable[str]]  # adds servicers, returns their full service names


OnStop = Callable[[], Awaitable[None]]  # e.g. ending the streams of calls that callers keep open
OnMalformed = Callable[[str], None]  # told the full method name ("/bear.v1.Router/Route") of a request that did not
# decode (answered INVALID_ARGUMENT before any servicer sees it): for the service's own error counts


class RunningServer:
    """A started server: its port, health, and how to stop it."""

    def __init__(self, server: grpc.aio.Server, port: int, health_servicer: health.aio.HealthServicer,
                 names: list[str], grace_s: float, on_stop: Iterable[OnStop] = ()) -> None:
        self.server, self.port, self.health, self.names, self.grace_s = server, port, health_servicer, names, grace_s
        self.on_stop = list(on_stop)

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.names]:
            await self.health.set(name, status)

    async def stop(self) -> None:
        """Health NOT_SERVING, no new calls; calls in flight finish within the grace period. Streams that callers
        keep open (streams of calls) end as soon as their calls in flight are answered, not at the grace's end."""
        await self.set_serving(False)
        stopped = asyncio.ensure_future(self.server.stop(self.grace_s))
        await asyncio.sleep(0)  # the server refuses new calls from here on
        for hook in self.on_stop:
            await hook()
        await stopped


def _spanned(details: grpc.HandlerCallDetails) -> bool:
    """Which calls OpenTelemetry's server interceptor spans: not a stream of calls (spanned call by call), nor health
    Watch, whose handler writes with context.write where the interceptor takes a server stream's handler for an async
    generator (the call failed UNKNOWN with a TypeError)."""
    from bear.common.call_streams import not_a_call_stream

    return not_a_call_stream(details) and details.method != HEALTH_WATCH


async def start_server(settings: ServerSettings, register: Register, on_stop: Iterable[OnStop] = (),
                       on_malformed: OnMalformed | None = None) -> RunningServer:
    """Builds and starts the server (call from the event loop that will run it); `on_stop` runs when it stops."""
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    # With OTEL_SDK_DISABLED the tracer is a no-op: the interceptor would cost each call time for nothing.
    traced = not isinstance(trace.get_tracer(__name__), trace.NoOpTracer)
    server = grpc.aio.server(interceptors=[aio_server_interceptor(filter_=_spanned)] if traced else [],
                             options=[*SERVER_OPTIONS,
                                      ("grpc.max_receive_message_length", settings.max_receive_message_bytes)])
    guarded = _GuardedRegistration(server, on_malformed)
    names = list(register(guarded))  # type: ignore[arg-type] - what register() uses of a server, guarded
    health_servicer = health.aio.HealthServicer()  # an asyncio servicer: a blocking one fails under grpc.aio
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, guarded)
    reflection.enable_server_reflection(  # the server itself: reflection picks its asyncio servicer by its type
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server)
    address = f"{settings.host}:{settings.grpc_port}"
    try:
        port = server.add_insecure_port(address)
    except UnicodeEncodeError:  # an undecodable byte from the command line or the environment
        raise ServiceStartError(f"{_command(settings)}: --host {settings.host!r} is not UTF-8 text") from None
    except RuntimeError:  # "Failed to bind to address ..."
        port = 0
    if port == 0:
        problem = bind_problem(settings.host, settings.grpc_port, *_setting_names(settings, "HOST", "GRPC_PORT"))
        raise ServiceStartError(f"{_command(settings)}: {problem}")
    try:
        await server.start()
        running = RunningServer(server, port, health_servicer, names, settings.shutdown_grace_s, on_stop)
        await running.set_serving(True)
    except BaseException:  # cancelled by a signal at start-up (run_event_loop): stopped while its loop still runs
        await server.stop(None)
        raise
    return running


def start_metrics(port: int | None, host: str = "[::]") -> int | None:
    """Serves Prometheus /metrics (the default registry) on `host`:`port` (the gRPC server's host; 0: any port);
    returns the port. Raises OSError when the port is taken."""
    return None if port is None else metrics_http_server(port, host).server_port


def metrics_http_server(port: int, host: str, registry: Any = None) -> Any:
    """prometheus_client's /metrics server for `registry` (None: the default) on `host` as gRPC writes it ("[::]",
    "127.0.0.1"); every address ("[::]") falls back to every IPv4 address where IPv6 is off. Raises OSError."""
    from prometheus_client import REGISTRY, start_http_server

    address = host.strip("[]") or "::"
    registry = REGISTRY if registry is None else registry
    try:
        server, _ = start_http_server(port, addr=address, registry=registry)
    except OSError:
        if address != "::":
            raise
        server, _ = start_http_server(port, addr="0.0.0.0", registry=registry)
    return server


def _command(settings: ServerSettings) -> str:
    """How error messages name the service: `bear serve router` for bear-router."""
    name = settings.service_name
    return f"bear serve {name.removeprefix('bear-')}" if name.startswith("bear-") else name


_NAMED_SETTINGS = ("bear-router", "bear-estimator", "bear-predictor")  # BEAR_<SERVICE>_HOST and so on


def _setting_names(settings: ServerSettings, *settings_named: str) -> tuple[str, ...]:
    """How messages name a service's settings: `--host (BEAR_ROUTER_HOST)` for bear-router's HOST: the value may have
    come from the flag, the variable or the config file's key (QA: a bad BEAR_ROUTER_HOST was called `--host`)."""
    name = settings.service_name
    prefix = f"BEAR_{name.removeprefix('bear-').upper()}_" if name in _NAMED_SETTINGS else None
    return tuple(f"--{setting.lower().replace('_', '-')}" + (f" ({prefix}{setting})" if prefix else "")
                 for setting in settings_named)


def bind_problem(host: str, port: int, host_flag: str = "--host", port_flag: str = "--grpc-port") -> str:
    """Why gRPC could not listen on host:port, as far as a plain socket can tell, naming the flag (or variable) at
    fault."""
    address = f"{host}:{port}"
    try:
        candidates = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                        flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as error:
        return f"{host_flag} {host}: cannot listen on {address}: not a known host ({error})"
    for family, kind, protocol, _, socket_address in candidates:
        try:
            with socket.socket(family, kind, protocol) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(socket_address)
        except OSError as error:
            flag = f"{port_flag} {port}" if error.errno == errno.EADDRINUSE else f"{host_flag} {host}"
            return f"{flag}: cannot listen on {address}: {error.strerror or error}"
    if ":" in host and not host.startswith("["):  # gRPC reads "::1:50051" as a host and port it cannot split
        return f"{host_flag} {host}: cannot listen on {address}: write an IPv6 address in brackets, e.g. [{host}]"
    return f"{host_flag} {host} / {port_flag} {port}: cannot listen on {address}"


def configure_logging() -> None:
    """`bear serve <service>`'s log format, on stderr."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def announce(grpc_port: int, metrics_port: int | None) -> None:
    """The first line a service prints on stdout once it listens (`bear demo`, the tests and scripts read it):
    `grpc_port=N metrics_port=M`, M empty when metrics are off."""
    print(f"grpc_port={grpc_port} metrics_port={'' if metrics_port is None else metrics_port}", flush=True)


def set_on_signals(event: threading.Event, signums: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """Sets `event` when one of `signums` arrives (call from the main thread, for a blocking main loop). Not from the
    handler itself: a handler runs in the main thread between two bytecodes, and if that thread is then inside the
    locked part of `event.wait()`, `event.set()` waits for a lock its own thread holds, for good (a sidecar polling its
    region with `wait` ignored SIGTERM until killed). A thread of its own sets it once the main thread lets go."""
    def handler(signum: int, frame: object) -> None:
        threading.Thread(target=event.set, name="bear-signal", daemon=True).start()

    for signum in signums:
        signal.signal(signum, handler)


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Runs a service's main coroutine on uvloop where it is installed (about 30% less time per call here), else on
    asyncio's default loop, then shuts tracing down (shutdown_tracing). A server that cannot start ends the process:
    its message on stderr, exit status 2. SIGTERM or SIGINT before the service serves (serve_until_stopped takes them
    over) cancels `main` where it is, so that what start-up built so far (an embedded Redis, a discovery watch) is
    closed by its clean-up rather than left running by the signal's default action; the process then exits 0."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not available on every platform
        run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    else:
        run = uvloop.run
    stopped: list[int] = []  # the signal that cut start-up short, if one did
    try:
        run(_cancelled_on_signals(main, stopped))
    except ServiceStartError as error:
        print(error, file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    except asyncio.CancelledError:
        if not stopped:
            raise
        logger.info("stopped by %s while starting", signal.Signals(stopped[0]).name)
    finally:
        shutdown_tracing()


async def _cancelled_on_signals(main: Coroutine[Any, Any, None], stopped: list[int]) -> None:
    """`main`, cancelled by SIGTERM or SIGINT (their number appended to `stopped`) until a handler of its own
    replaces this one."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def cancel(signum: int) -> None:
        if not stopped:  # once: a second signal does not cut the clean-up short
            task.cancel()
        stopped.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, cancel, signum)
    await main


async def serve_until_stopped(settings: ServerSettings, register: Register,
                              on_ready: Callable[[int, int | None], None] = lambda port, metrics: None,
                              background: Iterable[Callable[[], Awaitable[None]]] = (),
                              on_stop: Iterable[OnStop] = (), on_malformed: OnMalformed | None = None) -> None:
    """Runs the service until SIGTERM/SIGINT; `background` tasks run alongside and are cancelled at shutdown."""
    configure_tracing(settings.service_name)
    running = await start_server(settings, register, on_stop, on_malformed)
    try:
        metrics_port = start_metrics(settings.metrics_port, settings.host)
    except OSError as error:  # the gRPC server stops before the loop closes (its callbacks need the loop)
        await running.server.stop(None)
        (metrics_flag,) = _setting_names(settings, "METRICS_PORT")
        raise ServiceStartError(f"{_command(settings)}: {metrics_flag} {settings.metrics_port}: cannot serve /metrics "
                                f"on port {settings.metrics_port}: {error.strerror or error}") from None
    # What start-up built (modules, models, caches) lives as long as the process: out of the collector's passes, so
    # that a full collection does not stall calls for tens of milliseconds.
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(task()) for task in background]
    for task in tasks:
        task.add_done_callback(_report_early_end(stop))
    logger.info("%s listening on port %d (metrics: %s)", settings.service_name, running.port,
                "off" if metrics_port is None else metrics_port)
    on_ready(running.port, metrics_port)
    try:
        await stop.wait()
    finally:  # also when a start-up signal's cancellation (run_event_loop) lands here, as the server has just started
        logger.info("%s shutting down", settings.service_name)
        for task in tasks:
            task.cancel()
        if tasks:  # unwound before what they use (Redis clients, channels) is closed after this returns
            await asyncio.wait(tasks, timeout=BACKGROUND_STOP_S)
        await running.stop()


def _report_early_end(stop: asyncio.Event) -> Callable[[asyncio.Task[None]], None]:
    """A done-callback for a background task: one that ends before shutdown, with an error or not, is logged (its
    work, such as a snapshot feed, has stopped); at shutdown, what a task raised while unwinding is dropped."""
    def report(task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()  # retrieved either way
        if stop.is_set():
            return
        if error is not None:
            logger.error("background task %s ended with an error; its work has stopped", task.get_name(),
                         exc_info=error)
        else:
            logger.error("background task %s ended; its work has stopped", task.get_name())
    return report


# Requests that do not decode -------------------------------------------------------------------------------------

class _Malformed:
    """What the guarded deserializer hands on for bytes that are not the method's message."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _malformed_details(request: _Malformed) -> str:
    return f"malformed request: {request.reason}"


class _GuardedRegistration:
    """The server as `register` sees it: every method handler added through it decodes requests without raising, and
    answers bytes that are no message INVALID_ARGUMENT (gRPC's own answer would be UNKNOWN, with a traceback in the
    log for each call). Everything else is the server's."""

    def __init__(self, server: grpc.aio.Server | grpc.Server, on_malformed: OnMalformed | None = None) -> None:
        self._server = server
        self._on_malformed = on_malformed

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_GuardedGenericHandler(h, self._on_malformed) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_registered_method_handlers(service, {
            name: _guarded(h, f"/{service}/{name}", self._on_malformed) for name, h in handlers.items()})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


def guarded(server: grpc.Server) -> grpc.Server:
    """A blocking server as servicers are added to it, each method answering undecodable bytes INVALID_ARGUMENT."""
    return _GuardedRegistration(server)  # type: ignore[arg-type, return-value] - the same duck for both kinds


class _GuardedGenericHandler(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler, on_malformed: OnMalformed | None) -> None:
        self._inner = inner
        self._on_malformed = on_malformed
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}  # method → (its, ours)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        known = self._guarded.get(method)
        if known is None or known[0] is not handler:
            known = self._guarded[method] = (handler, _guarded(handler, method, self._on_malformed))
        return known[1]


def _guarded(handler: grpc.RpcMethodHandler, method: str, on_malformed: OnMalformed | None) -> grpc.RpcMethodHandler:
    """`handler` with a deserializer that hands undecodable bytes on as _Malformed (and tells `on_malformed`) and a
    behaviour that answers them INVALID_ARGUMENT, for an asyncio server's behaviours and a blocking server's (the
    snapshotter's) alike."""
    deserialize = handler.request_deserializer
    behaviour = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    if deserialize is None:
        return handler
    asynchronous = inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)
    one, many = (_checked_request, _checked_requests) if asynchronous else (_checked_blocking_request,
                                                                             _checked_blocking_requests)

    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as error:  # noqa: BLE001 - any failure to decode is the caller's malformed request
            if on_malformed is not None:
                try:
                    on_malformed(method)
                except Exception:  # noqa: BLE001 - a count that failed must not change the answer
                    logger.exception("counting a malformed request to %s", method)
            return _Malformed(str(error) or type(error).__name__)

    serialize = handler.response_serializer
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(one(behaviour), decode, serialize)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(one(behaviour), decode, serialize)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(many(behaviour), decode, serialize)
    return grpc.stream_stream_rpc_method_handler(many(behaviour), decode, serialize)


def _checked_blocking_request(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    """As `_checked_request`, for a blocking server's behaviour (a function or a generator)."""
    if inspect.isgeneratorfunction(behaviour):
        def stream_answers(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, _Malformed):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, _malformed_details(request))
            yield from behaviour(request, context)
        return stream_answers

    def answer(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, _Malformed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _malformed_details(request))
        return behaviour(request, context)
    return answer


def _checked_blocking_requests(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    """As `_checked_requests`, for a blocking server's behaviour."""
    def checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        for request in requests:
            if isinstance(request, _Malformed):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, _malformed_details(request))
            yield request

    if inspect.isgeneratorfunction(behaviour):
        def stream_answers(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            yield from behaviour(checked(requests, context), context)
        return stream_answers

    def answer(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        return behaviour(checked(requests, context), context)
    return answer


def _checked_request(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    """A unary-request behaviour of the same kind (coroutine or async generator) that refuses a _Malformed request."""
    if inspect.isasyncgenfunction(behaviour):
        async def stream_answers(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _malformed_details(request))
            async for response in behaviour(request, context):
                yield response
        return stream_answers

    async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _malformed_details(request))
        return await behaviour(request, context)
    return answer


def _checked_requests(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    """A streamed-request behaviour of the same kind that ends the call INVALID_ARGUMENT at a _Malformed request."""
    async def checked(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async for request in requests:
            if isinstance(request, _Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _malformed_details(request))
            yield request

    if inspect.isasyncgenfunction(behaviour):
        async def stream_answers(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async for response in behaviour(checked(requests, context), context):
                yield response
        return stream_answers

    async def answer(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behaviour(checked(requests, context), context)
    return answer
