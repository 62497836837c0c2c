"""The router service over real gRPC (port 0) with a real redis-server and small fake Estimator / Predictor servers:
Route and ReportOutcome end to end, the dispatch records the estimator reads, the clients, bad input, health and
reflection, spans (in memory, with the context propagated to the neighbours) and metrics scraped over HTTP."""

from __future__ import annotations

import asyncio
import math
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from bear.common import redis_keys
from bear.router import wire
from bear.router.client import (
    AsyncRouterClient,
    DuplicateRequest,
    InvalidRequest,
    RouterClient,
    RouterError,
    RouterTimeout,
    RouterUnavailable,
)
from bear.router.server import SERVICE_NAME
from bear.v1 import router_pb2, router_pb2_grpc
from tests.router_fakes import THREE_INSTANCES, write_pools_file
from tests.router_stack import RouterStack, span_exporter


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[RouterStack]:
    span_exporter()  # before the router starts, so that its tracers export here
    stack = RouterStack(tmp_path)
    yield stack
    stack.close()


def test_route_answers_with_every_candidate_and_records_the_dispatch(stack: RouterStack) -> None:
    # The router's own time counts against the target: on a busy 2-core CI host this call once took over 50 ms, and
    # medium's 200 ms no longer fitted 250 ms. A first call also waits for the registrations' first read.
    stack.route(ttft_slo_ms=280.0, request_id="warm-up")
    decision = stack.route(ttft_slo_ms=280.0, request_id="q-1")
    # Fake estimates: small 100 ms, medium 200 ms, large 300 ms; medium has the best utility within 280 ms.
    assert (decision.request_id, decision.decision, decision.instance_id) == ("q-1", router_pb2.DECISION_ROUTE,
                                                                              "medium-0")
    assert (decision.endpoint, decision.model, decision.policy) == ("http://medium-0.test:8000", "Qwen3-8B", "bear")
    assert decision.reason and not decision.degraded and decision.decision_ms > 0
    assert 280.0 - decision.decision_ms <= decision.ttft_budget_ms < 280.0  # the target less the router's time
    by_id = {c.instance_id: c for c in decision.candidates}
    assert set(by_id) == {"small-0", "medium-0", "large-0"}
    large = by_id["large-0"]
    assert (large.predicted_ttft_ms, large.feasible, large.ttft_method, large.predicted_accuracy) == (
        300.0, False, "replay", 0.85)
    assert large.predicted_cost_micro_usd == pytest.approx(8 * 0.287 + 400 * 0.640)  # the registration's prices
    assert large.utility == pytest.approx(0.85 - 5e-4 * large.predicted_cost_micro_usd)

    stack.flush()  # records are written off the Route path
    record = wire.dispatch_from_bytes(stack.redis.get(redis_keys.dispatch_key("q-1")))
    assert (record.instance_id, record.model, record.prompt_tokens, record.predicted_output_tokens) == (
        "medium-0", "Qwen3-8B", 8, 350.0)  # the predictor's count: 8 words
    assert (record.predicted_ttft_ms, record.ttft_slo_ms) == (200.0, 280.0)
    assert abs(record.dispatched_at_s - time.time()) < 5
    assert stack.redis.zscore(redis_keys.dispatches_key("medium-0"), "q-1") == record.dispatched_at_s
    assert 0 < stack.redis.pttl(redis_keys.dispatch_key("q-1")) <= redis_keys.DISPATCH_TTL_S * 1000
    assert stack.redis.ttl(redis_keys.dispatches_key("medium-0")) > 0
    # The estimator was asked about every instance with the router's token count (pre-tokens: 9).
    asked = stack.estimator.requests[-1]
    assert (asked.query_id, asked.prompt_tokens, sorted(asked.instance_ids)) == (
        "q-1", 9, ["large-0", "medium-0", "small-0"])


def test_report_outcome_closes_the_loop(stack: RouterStack) -> None:
    decision = stack.route(ttft_slo_ms=250.0)
    ack = stack.client.report_outcome(decision.request_id, observed_ttft_ms=260.0, output_tokens=100,
                                      observed_e2e_ms=1250.0)
    assert ack.known and ack.predicted_ttft_ms == 200.0
    assert stack.metric("bear_router_ttft_abs_error_seconds_sum", instance="medium-0") == pytest.approx(0.06)
    assert not stack.client.report_outcome("never-routed", observed_ttft_ms=10.0).known
    with pytest.raises(InvalidRequest, match="observed_ttft_ms"):
        stack.client.report_outcome("x", observed_ttft_ms=math.nan)


def test_a_length_only_query_and_the_request_options(stack: RouterStack) -> None:
    decision = stack.client.route(prompt_tokens=900, ttft_slo_ms=1000.0, policy="latency-agnostic",
                                  allowed_models=["Qwen3-8B", "Qwen3-32B"], lambda_per_micro_usd=0.0)
    assert decision.policy == "latency-agnostic" and decision.instance_id == "large-0"
    assert {c.prompt_tokens for c in decision.candidates} == {900} and len(decision.candidates) == 2
    assert len(stack.predictor.requests) == 0  # no text, no prediction
    assert len(decision.request_id) == 32  # generated


def test_the_asyncio_client(stack: RouterStack) -> None:
    async def calls() -> tuple[router_pb2.RouteDecision, router_pb2.OutcomeAck]:
        async with AsyncRouterClient(stack.address) as client:
            decision = await client.route("Write a story about a lighthouse.", ttft_slo_ms=150.0)
            return decision, await client.report_outcome(decision.request_id, observed_ttft_ms=90.0)

    decision, ack = asyncio.run(calls())
    assert decision.instance_id == "small-0" and ack.known and ack.predicted_ttft_ms == 100.0


def test_the_asyncio_client_routes_over_a_stream_of_calls_and_its_errors_are_routes(stack: RouterStack) -> None:
    # RouteStream: each call a server span of its own (under the client's), answered as Route; errors as Route's.
    exporter = span_exporter()
    exporter.clear()

    async def calls() -> list[object]:
        async with AsyncRouterClient(stack.address) as client:
            outcomes: list[object] = [await client.route("Summarize.", ttft_slo_ms=250.0, request_id="s-1")]
            for arguments in ({"request_id": "s-1"}, {"ttft_slo_ms": math.nan}, {"policy": "fastest-please"},
                              {"allowed_models": ["gpt-9"]}):
                try:
                    await client.route("Summarize.", **{"ttft_slo_ms": 250.0, **arguments})  # type: ignore[arg-type]
                except Exception as error:  # noqa: BLE001 - what each raised
                    outcomes.append(error)
            outcomes.append(await client.route("Summarize again.", ttft_slo_ms=250.0, request_id="s-2"))
            return outcomes

    first, duplicate, nan_slo, policy, model, last = asyncio.run(calls())
    assert isinstance(first, router_pb2.RouteDecision) and first.request_id == "s-1"
    assert isinstance(last, router_pb2.RouteDecision) and last.request_id == "s-2"  # the stream goes on after errors
    assert isinstance(duplicate, DuplicateRequest) and duplicate.code is grpc.StatusCode.ALREADY_EXISTS
    for error, field in ((nan_slo, "ttft_slo_ms"), (policy, "policy"), (model, "allowed_models")):
        assert isinstance(error, InvalidRequest) and error.code is grpc.StatusCode.INVALID_ARGUMENT
        assert error.message.startswith(f"{field}: ")
    spans = exporter.get_finished_spans()
    route = next(s for s in spans if s.name == "bear.route" and s.attributes["bear.request_id"] == "s-2")
    in_trace = {(s.name, s.kind): s for s in spans if s.context.trace_id == route.context.trace_id}
    server = in_trace["/bear.v1.Router/RouteStream", SpanKind.SERVER]
    assert route.parent.span_id == server.context.span_id
    assert server.parent.span_id == in_trace["/bear.v1.Router/RouteStream", SpanKind.CLIENT].context.span_id
    assert not any(s.name == "/bear.v1.Router/Route" for s in spans)


def test_every_call_answered_with_an_error_is_counted_by_method_and_code(stack: RouterStack) -> None:
    """Route's refusals, unary or streamed, those of the stream itself (a bad deadline, a call id in flight) and
    ReportOutcome's: each one in bear_router_errors_total (the stream's own were in no metric before)."""
    def errors(method: str, code: str) -> float:
        return stack.metric("bear_router_errors_total", method=method, code=code)

    channel = grpc.insecure_channel(stack.address)
    stub = router_pb2_grpc.RouterStub(channel)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Route(router_pb2.RouteRequest(prompt="Summarize.", ttft_slo_ms=-1), timeout=10)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as refused:
        stub.ReportOutcome(router_pb2.OutcomeReport(request_id="r", observed_ttft_ms=-1), timeout=10)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    stream = channel.stream_stream(f"/{SERVICE_NAME}/RouteStream",
                                   request_serializer=router_pb2.RouteCall.SerializeToString,
                                   response_deserializer=router_pb2.RouteResult.FromString)
    good = router_pb2.RouteRequest(prompt="Summarize.", ttft_slo_ms=250, request_id="counted-1")
    calls = [router_pb2.RouteCall(call_id=1, request=good, timeout_ms=-1),  # the stream's refusal
             router_pb2.RouteCall(call_id=2, request=router_pb2.RouteRequest(prompt=""), timeout_ms=5000),
             router_pb2.RouteCall(call_id=3, request=good, timeout_ms=5000)]
    results = {r.call_id: r for r in stream(iter(calls), timeout=10)}
    channel.close()
    assert results[1].error.code == results[2].error.code == "INVALID_ARGUMENT"
    assert results[3].response.request_id == "counted-1"
    assert (errors("Route", "INVALID_ARGUMENT"), errors("ReportOutcome", "INVALID_ARGUMENT")) == (3, 1)
    assert stack.metric("bear_router_refusals_total", method="Route", code="INVALID_ARGUMENT") == 2  # the router's


def test_the_asyncio_client_sends_a_long_request_unary_and_refuses_calls_once_closed(stack: RouterStack) -> None:
    # A message over the router's size limit would end the stream it goes on, with every call on it.
    async def calls() -> list[object]:
        client = AsyncRouterClient(stack.address)
        outcomes = await asyncio.gather(
            *(client.route(f"Summarize {i}.", ttft_slo_ms=250.0) for i in range(5)),
            client.route("x" * 10_000_000, ttft_slo_ms=250.0), return_exceptions=True)  # over 8 MiB
        await client.close()
        for call in (client.route("Summarize.", ttft_slo_ms=250.0), client.report_outcome("r", observed_ttft_ms=1.0)):
            try:
                await call
            except RouterError as error:
                outcomes.append(error)
        return outcomes

    *good, big, closed_route, closed_report = asyncio.run(calls())
    assert all(isinstance(d, router_pb2.RouteDecision) for d in good)
    assert isinstance(big, InvalidRequest) and big.code is grpc.StatusCode.RESOURCE_EXHAUSTED  # gRPC's own limit
    for error in (closed_route, closed_report):
        assert isinstance(error, RouterError) and error.code is grpc.StatusCode.CANCELLED


@pytest.mark.parametrize("streamed", [False, True])
def test_closing_the_asyncio_client_fails_its_calls_in_flight_as_router_errors(stack: RouterStack,
                                                                               streamed: bool) -> None:
    """Unary calls of a closed channel end in CancelledError in tasks nobody cancelled: a gather or TaskGroup would
    take it for the caller's own cancellation. Streamed or not, a call cut short by close() says the client closed."""
    async def calls() -> list[object]:
        client = AsyncRouterClient(stack.address, streamed=streamed)
        await client.route("Warm up.", ttft_slo_ms=250.0)
        in_flight = [asyncio.ensure_future(client.route(f"Summarize {i}.", ttft_slo_ms=250.0)) for i in range(20)]
        in_flight.append(asyncio.ensure_future(client.report_outcome("r", observed_ttft_ms=1.0)))
        await asyncio.sleep(0)
        await client.close()
        return await asyncio.gather(*in_flight, return_exceptions=True)

    outcomes = asyncio.run(calls())
    assert not any(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    assert all(isinstance(o, (router_pb2.RouteDecision, router_pb2.OutcomeAck, RouterError)) for o in outcomes)
    errors = [o for o in outcomes if isinstance(o, RouterError)]
    assert all(type(e) is RouterError and e.code is grpc.StatusCode.CANCELLED and "closed" in e.message
               for e in errors), errors


def test_the_asyncio_client_can_make_unary_calls(stack: RouterStack) -> None:
    exporter = span_exporter()
    exporter.clear()

    async def call() -> None:
        async with AsyncRouterClient(stack.address, streamed=False) as client:
            await client.route("Summarize.", ttft_slo_ms=250.0, request_id="u-1")
            with pytest.raises(InvalidRequest, match="^INVALID_ARGUMENT: ttft_slo_ms: "):
                await client.route("Summarize.", ttft_slo_ms=-1.0)

    asyncio.run(call())
    names = {s.name for s in exporter.get_finished_spans()}
    assert "/bear.v1.Router/Route" in names and "/bear.v1.Router/RouteStream" not in names


@pytest.mark.parametrize(("fields", "field"), [
    ({"prompt": ""}, "prompt"),
    ({"prompt": "x" * 1_100_000}, "prompt"),  # over the 1 MB limit
    ({"prompt": "x" * 6_000_000}, "prompt"),  # over gRPC's default 4 MiB message limit too
    ({"prompt_tokens": 0}, "prompt_tokens"),
    ({"prompt_tokens": 10_000_000}, "prompt_tokens"),
    ({"ttft_slo_ms": -5.0}, "ttft_slo_ms"),
    ({"ttft_slo_ms": math.nan}, "ttft_slo_ms"),
    ({"ttft_slo_ms": math.inf}, "ttft_slo_ms"),
    ({"ttft_slo_ms": 1e15}, "ttft_slo_ms"),
    ({"policy": "fastest-please"}, "policy"),
    ({"allowed_models": ["gpt-9"]}, "allowed_models"),
    # the names go into the decision's span: one query must not make a span no exporter sends (a 4.8 MB one was seen)
    ({"allowed_models": [f"m{i}" for i in range(257)]}, "allowed_models"),
    ({"allowed_models": ["m" * 257]}, "allowed_models"),
    ({"lambda_per_micro_usd": -1.0}, "lambda_per_micro_usd"),
])
def test_bad_input_is_invalid_argument_naming_the_field(stack: RouterStack, fields: dict[str, object],
                                                        field: str) -> None:
    arguments: dict[str, object] = {"ttft_slo_ms": 500.0}
    if "prompt_tokens" not in fields:
        arguments["prompt"] = "Summarize."
    arguments.update(fields)
    with pytest.raises(InvalidRequest) as caught:
        stack.client.route(**arguments)  # type: ignore[arg-type]
    assert caught.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.message.startswith(f"{field}: ")


def test_a_request_without_prompt_is_invalid_argument(stack: RouterStack) -> None:
    with grpc.insecure_channel(stack.address) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            router_pb2_grpc.RouterStub(channel).Route(router_pb2.RouteRequest(ttft_slo_ms=100), timeout=5)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "prompt: required" in caught.value.details()


def test_max_tokens_zero_is_invalid_argument_and_a_cap_reaches_the_dispatch_record(stack: RouterStack) -> None:
    with grpc.insecure_channel(stack.address) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            router_pb2_grpc.RouterStub(channel).Route(router_pb2.RouteRequest(prompt="Hi.", ttft_slo_ms=500,
                                                                              max_tokens=0), timeout=5)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("max_tokens: must be at least 1")
    decision = stack.client.route("Summarize.", ttft_slo_ms=500.0, max_tokens=3, request_id="capped")
    assert all(c.predicted_output_tokens <= 3 for c in decision.candidates)
    stack.flush()  # records are written off the Route path
    record = wire.dispatch_from_bytes(stack.redis.get(redis_keys.dispatch_key("capped")))
    assert record.max_tokens == 3


def test_no_ready_instance_is_unavailable(tmp_path: Path) -> None:
    stack = RouterStack(tmp_path, register=False)
    try:
        with pytest.raises(RouterUnavailable, match="no ready instance"):
            stack.route()
    finally:
        stack.close()


def test_the_clients_deadline(stack: RouterStack) -> None:
    with RouterClient(stack.address, timeout_s=1e-4) as client, pytest.raises(RouterTimeout):
        client.route("Summarize.", ttft_slo_ms=100.0)


@pytest.mark.parametrize("streamed", [True, False])
def test_the_asyncio_clients_deadline(stack: RouterStack, streamed: bool) -> None:
    """A call the client gave up on is given up by the router too (over the stream as with unary calls): no dispatch
    is recorded for a query that was never sent, and its request id can be used again. Its spans say so."""
    exporter = span_exporter()
    stack.estimator.behaviour.delay_s = 0.3  # the decision takes longer than the caller waits

    async def call() -> None:
        async with AsyncRouterClient(stack.address, timeout_s=0.1, streamed=streamed) as client:
            with pytest.raises(RouterTimeout):
                await client.route("Summarize.", ttft_slo_ms=100.0, request_id=f"late-{streamed}")
            await asyncio.sleep(0.5)  # past the time the decision would have taken
            # the calls after it with time to spare (a loaded machine can take 0.1 s for a Route call)
            assert not (await client.report_outcome(f"late-{streamed}", observed_ttft_ms=1.0, timeout_s=10.0)).known
            [route] = [s for s in exporter.get_finished_spans()
                       if s.name == "bear.route" and s.attributes["bear.request_id"] == f"late-{streamed}"]
            assert route.attributes["bear.cancelled"] is True and "bear.decision" not in route.attributes
            # The call's server span (a unary call's ended as OK, a streamed one's with no status): a unary call
            # sees its deadline; over a stream, the client's cancel message at its deadline (CANCELLED) or the
            # server's own timer for the call (DEADLINE_EXCEEDED, an error), whichever comes first.
            server = next(s for s in exporter.get_finished_spans() if s.context.span_id == route.parent.span_id)
            code = server.attributes["rpc.grpc.status_code"]
            expired, cancelled = grpc.StatusCode.DEADLINE_EXCEEDED.value[0], grpc.StatusCode.CANCELLED.value[0]
            assert code in ({expired, cancelled} if streamed else {expired})
            assert (server.status.status_code is StatusCode.ERROR) == (code == expired)
            name = "DEADLINE_EXCEEDED" if code == expired else "CANCELLED"
            assert stack.metric("bear_router_errors_total", method="Route", code=name) == 1  # counted as it ended
            stack.estimator.behaviour.delay_s = 0.0
            decision = await client.route("Summarize.", ttft_slo_ms=100.0, request_id=f"late-{streamed}",
                                          timeout_s=10.0)
            assert decision.request_id == f"late-{streamed}"

    asyncio.run(call())


def test_health_and_reflection(stack: RouterStack) -> None:
    with grpc.insecure_channel(stack.address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME),
                                                           timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        # Watch, as gRPC's client-side health checking calls it (it failed UNKNOWN with tracing on: OpenTelemetry's
        # interceptor took its handler, which writes with context.write, for an async generator)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME),
                                                          timeout=5)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                  timeout=5)
        names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert SERVICE_NAME in names


def test_a_pools_file_names_the_instances(tmp_path: Path) -> None:
    from bear.discovery.config import DiscoveryConfig

    pools = write_pools_file(tmp_path / "pools.yaml", THREE_INSTANCES[:2],
                             prices={"small": (1.0, 2.0), "medium": (3.0, 4.0)})
    stack = RouterStack(tmp_path, register=False, discovery=DiscoveryConfig(pools_file=str(pools)))
    try:
        decision = stack.route(ttft_slo_ms=1000.0, policy="latency-agnostic", lambda_per_micro_usd=0.0)
        assert {c.instance_id for c in decision.candidates} == {"small-0", "medium-0"}
        small = next(c for c in decision.candidates if c.instance_id == "small-0")
        assert small.predicted_cost_micro_usd == pytest.approx(8 * 1.0 + 300 * 2.0)  # the pools file's prices
    finally:
        stack.close()


def test_each_decision_is_a_span_with_its_candidates_and_the_context_reaches_the_neighbours(
        stack: RouterStack) -> None:
    exporter = span_exporter()
    exporter.clear()
    models = ["Qwen3-8B", "Qwen3-0.6B", "Qwen3-32B"]
    decision = stack.route(ttft_slo_ms=250.0, request_id="traced-1", allowed_models=models * 2000)
    stack.flush()  # the record's span ends once the record is in Redis
    spans = exporter.get_finished_spans()
    route = next(s for s in spans if s.name == "bear.route" and s.attributes["bear.request_id"] == "traced-1")
    trace_id = route.context.trace_id
    assert route.attributes["bear.instance_id"] == decision.instance_id
    assert (route.attributes["bear.ttft_slo_ms"], route.attributes["bear.policy"]) == (250.0, "bear")
    assert route.attributes["bear.prompt_tokens"] == 9 and route.attributes["bear.degraded"] is False
    assert list(route.attributes["bear.allowed_models"]) == models  # each name once, as given first
    events = {e.attributes["bear.instance_id"]: e.attributes for e in route.events if e.name == "bear.candidate"}
    assert set(events) == {"small-0", "medium-0", "large-0"}
    assert events["large-0"]["bear.predicted_ttft_ms"] == 300.0 and events["large-0"]["bear.feasible"] is False
    assert events["medium-0"]["bear.chosen"] is True and events["medium-0"]["bear.predicted_accuracy"] == 0.75
    # The server's span is the parent; the stages are children; the outbound calls nest under their stage.
    in_trace = {s.name: s for s in spans if s.context.trace_id == trace_id}
    assert route.parent is not None and in_trace["/bear.v1.Router/Route"].context.span_id == route.parent.span_id
    for stage in ("bear.predict", "bear.estimate", "bear.choose", "bear.record"):
        assert in_trace[stage].parent.span_id == route.context.span_id
    # Each call over a stream of calls is a client span under its stage and a server span under the client's.
    by_kind = {(s.name, s.kind): s for s in spans if s.context.trace_id == trace_id}
    for stage, method in (("bear.predict", "/bear.v1.Predictor/PredictStream"),
                          ("bear.estimate", "/bear.v1.Estimator/EstimateStream")):
        client, server = by_kind[method, SpanKind.CLIENT], by_kind[method, SpanKind.SERVER]
        assert client.parent.span_id == in_trace[stage].context.span_id
        assert server.parent.span_id == client.context.span_id
    for seen in (stack.predictor.metadata[-1], stack.estimator.metadata[-1]):
        assert seen["traceparent"].split("-")[1] == format(trace_id, "032x")


def test_the_callers_trace_holds_the_decision_whichever_way_the_client_calls(stack: RouterStack) -> None:
    """Over the stream of calls, unary (`streamed=False`), unary for a prompt over the stream's limit, and from the
    blocking client: the decision's span is in the caller's trace. (QA: the unary calls started a trace of their own.)"""
    import asyncio

    from opentelemetry import trace

    from bear.router.client import STREAMED_REQUEST_BYTES, AsyncRouterClient, RouterClient

    exporter = span_exporter()
    exporter.clear()
    tracer = trace.get_tracer("application")
    long_prompt = "word " * (STREAMED_REQUEST_BYTES // 5 + 1000)

    async def calls() -> dict[str, int]:
        traces = {}
        for streamed in (True, False):
            async with AsyncRouterClient(stack.address, timeout_s=10.0, streamed=streamed) as client:
                for name, prompt in (("short", "Summarize the report."), ("long", long_prompt)):
                    with tracer.start_as_current_span(f"app-{streamed}-{name}") as span:
                        await client.route(prompt, ttft_slo_ms=5000.0, request_id=f"ctx-{streamed}-{name}")
                        traces[f"ctx-{streamed}-{name}"] = span.get_span_context().trace_id
        return traces

    traces = asyncio.run(calls())
    with RouterClient(stack.address, timeout_s=10.0) as blocking, tracer.start_as_current_span("app-blocking") as span:
        blocking.route("Summarize the report.", ttft_slo_ms=5000.0, request_id="ctx-blocking")
        traces["ctx-blocking"] = span.get_span_context().trace_id
    routes = {s.attributes["bear.request_id"]: s for s in exporter.get_finished_spans() if s.name == "bear.route"}
    for request_id, trace_id in traces.items():
        assert routes[request_id].context.trace_id == trace_id, request_id


def test_metrics_are_scraped_over_http(stack: RouterStack) -> None:
    server, thread = start_http_server(0, addr="127.0.0.1", registry=stack.registry)
    try:
        decision = stack.route(ttft_slo_ms=250.0)
        stack.client.report_outcome(decision.request_id, observed_ttft_ms=150.0)
        stack.estimator_server.kill()
        stack.route()  # degraded
        stack.flush()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    def value(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("bear_router_decision_seconds_count", policy="bear") == 1
    assert value("bear_router_decision_seconds_count", policy="round-robin") == 1
    for stage in ("predict", "estimate", "choose", "record", "snapshots"):
        assert value("bear_router_stage_seconds_count", stage=stage) >= 1
    assert value("bear_router_fallbacks_total", reason="estimator-unavailable", policy="round-robin") == 1
    assert value("bear_router_snapshot_age_seconds", instance="small-0") == pytest.approx(0.005)
    assert value("bear_router_ttft_error_seconds_count", instance="medium-0") == 1
    assert value("bear_router_routes_total", instance="medium-0", model="Qwen3-8B", policy="bear") == 1
    assert value("bear_router_dependency_errors_total", service="estimator", code="UNAVAILABLE") == 1
    assert value("bear_router_instances") == 3
