"""The client's request building and error mapping (calls against a real router are in tests/integration)."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import grpc
import pytest

from bear.common.call_streams import CallFailed
from bear.router.client import (
    CHANNEL_OPTIONS,
    AsyncRouterClient,
    DuplicateRequest,
    InvalidRequest,
    RouterClient,
    RouterError,
    RouterTimeout,
    RouterUnavailable,
    deadline_s,
    error_of,
    outcome_report,
    route_request,
)


def request(**fields: object):  # noqa: ANN201 - RouteRequest
    arguments = {"prompt": None, "prompt_tokens": None, "ttft_slo_ms": 500.0, "policy": "", "allowed_models": (),
                 "request_id": "", "lambda_per_micro_usd": None, "delta_per_s": None, **fields}
    return route_request(**arguments)  # type: ignore[arg-type]


def test_a_request_carries_the_text_or_the_length_and_only_the_optionals_given() -> None:
    text = request(prompt="hi", policy="bear", allowed_models=["m"], request_id="r")
    assert text.WhichOneof("query") == "prompt" and not text.HasField("lambda_per_micro_usd")
    length = request(prompt_tokens=80, lambda_per_micro_usd=0.0, delta_per_s=2.0)
    assert length.WhichOneof("query") == "prompt_tokens" and length.prompt_tokens == 80
    assert length.HasField("lambda_per_micro_usd") and length.delta_per_s == 2.0
    with pytest.raises(ValueError, match="either prompt.*not neither"):
        request()
    with pytest.raises(ValueError, match="either prompt.*not both"):
        request(prompt="a", prompt_tokens=3)


@pytest.mark.parametrize(("fields", "named"), [({"prompt_tokens": -1}, "prompt_tokens"),
                                               ({"prompt_tokens": 1 << 40}, "prompt_tokens"),
                                               ({"prompt_tokens": 3.5}, "prompt_tokens"),
                                               ({"prompt": "hi", "allowed_models": "Qwen3-8B"}, "allowed_models"),
                                               ({"prompt": "hi", "ttft_slo_ms": None}, "ttft_slo_ms"),
                                               ({"prompt": "hi", "ttft_slo_ms": "500"}, "ttft_slo_ms"),
                                               ({"prompt": "hi", "delta_per_s": "2"}, "delta_per_s"),
                                               ({"prompt": "hi", "ttft_slo_ms": 10**400}, "ttft_slo_ms"),
                                               ({"prompt": "hi", "lambda_per_micro_usd": -10**400},
                                                "lambda_per_micro_usd"),
                                               # an AttributeError before (a Fraction has no bit_length)
                                               ({"prompt": "hi", "ttft_slo_ms": Fraction(10**400)}, "ttft_slo_ms"),
                                               ({"prompt": "hi", "allowed_models": None}, "allowed_models"),
                                               ({"prompt": "hi", "allowed_models": [None]}, "allowed_models"),
                                               ({"prompt": b"hi"}, "prompt"),
                                               ({"prompt": "hi", "request_id": 5}, "request_id"),
                                               ({"prompt": "hi", "policy": 1}, "policy"),
                                               ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
                                               ({"prompt": "hi", "max_tokens": 2.5}, "max_tokens"),
                                               # a lone surrogate: protobuf's error named no field
                                               ({"prompt": "a\ud800"}, "prompt is not valid Unicode"),
                                               ({"prompt": "hi", "request_id": "r\udcff"}, "request_id"),
                                               ({"prompt": "hi", "policy": "\ud800"}, "policy"),
                                               ({"prompt": "hi", "allowed_models": ["Qwen3-8B", "x\ud800"]},
                                                r"allowed_models\[1\] is not valid Unicode")])
def test_arguments_that_cannot_make_a_request_are_refused_naming_them(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        request(**fields)


def test_max_tokens_goes_along_when_given() -> None:
    assert request(prompt="hi", max_tokens=64).max_tokens == 64
    assert not request(prompt="hi").HasField("max_tokens")


def test_allowed_models_may_be_any_iterable_of_names() -> None:
    assert list(request(prompt="hi", allowed_models=(m for m in ["a", "b"])).allowed_models) == ["a", "b"]


def test_deadlines_are_positive_and_none_means_the_clients() -> None:
    assert deadline_s(None, 1.5) == 1.5 and deadline_s(0.2, 1.5) == 0.2
    # 1e10 s: gRPC's deadline overflows and fails the call at once; 10**400: math.isfinite raised OverflowError; True
    # was a deadline of a second, where every other number refuses a bool.
    for bad in (0.0, -1.0, float("nan"), 1e10, "1", 10**400, True, Fraction(10**400)):
        with pytest.raises(ValueError, match="timeout_s"):
            deadline_s(bad, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        RouterClient("localhost:1", timeout_s=0)
    for ttft, tokens, named in ((10.0, -1, "output_tokens"), (10.0, 3.5, "output_tokens"),
                                (10.0, None, "output_tokens"), (None, 3, "observed_ttft_ms"),
                                (10**400, 3, "observed_ttft_ms")):
        with pytest.raises(ValueError, match=named):
            outcome_report("r", ttft, tokens, 0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="request_id"):
        outcome_report(5, 10.0, 3, 0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="request_id is not valid Unicode"):
        outcome_report("r\ud800", 10.0, 3, 0.0)


class _Error(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "ttft_slo_ms: must be positive"


@pytest.mark.parametrize(("code", "kind"), [(grpc.StatusCode.INVALID_ARGUMENT, InvalidRequest),
                                            (grpc.StatusCode.ALREADY_EXISTS, DuplicateRequest),
                                            (grpc.StatusCode.UNAVAILABLE, RouterUnavailable),
                                            (grpc.StatusCode.CANCELLED, RouterUnavailable),  # router shutting down
                                            (grpc.StatusCode.RESOURCE_EXHAUSTED, InvalidRequest),  # too large
                                            (grpc.StatusCode.DEADLINE_EXCEEDED, RouterTimeout),
                                            (grpc.StatusCode.INTERNAL, RouterError)])
def test_status_codes_become_exceptions(code: grpc.StatusCode, kind: type) -> None:
    error = error_of(_Error(code))
    assert type(error) is kind and error.code is code and error.message == "ttft_slo_ms: must be positive"
    assert str(error) == f"{code.name}: ttft_slo_ms: must be positive"


def test_a_request_over_the_routers_size_limit_says_what_is_too_large() -> None:
    error = error_of(CallFailed(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (9 vs. 8)"))
    assert type(error) is InvalidRequest and error.message.startswith("the request (prompt, request_id")


def test_the_blocking_client_once_closed_says_so() -> None:
    client = RouterClient("localhost:1")
    client.close()
    for call in (lambda: client.route("hi", ttft_slo_ms=500.0), lambda: client.report_outcome("r", observed_ttft_ms=1)):
        with pytest.raises(RouterError) as raised:
            call()
        assert raised.value.code is grpc.StatusCode.CANCELLED and "closed" in raised.value.message


def test_the_asyncio_client_belongs_to_the_loop_it_was_made_in() -> None:
    with pytest.raises(RuntimeError, match="inside the event loop"):
        AsyncRouterClient("localhost:1")

    async def make() -> AsyncRouterClient:
        return AsyncRouterClient("localhost:1")

    client = asyncio.run(make())
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(client.route("hi", ttft_slo_ms=500.0))


def test_closing_the_asyncio_client_from_another_loop_is_refused_and_changes_nothing() -> None:
    async def owner() -> None:
        client = AsyncRouterClient("localhost:1")
        with pytest.raises(RuntimeError, match="another event loop"):  # a Future of another loop before, half-closed
            await asyncio.to_thread(asyncio.run, client.close())
        assert not client._is_closed  # noqa: SLF001
        await client.close()

    asyncio.run(owner())


def test_the_clients_channel_finds_a_restarted_router_within_a_second() -> None:
    assert dict(CHANNEL_OPTIONS)["grpc.max_reconnect_backoff_ms"] <= 1000
