"""The client's request building and error mapping (calls against a real router are in tests/integration)."""

from __future__ import annotations

import grpc
import pytest

from bear.router.client import (
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
    with pytest.raises(ValueError, match="either prompt"):
        request()
    with pytest.raises(ValueError, match="either prompt"):
        request(prompt="a", prompt_tokens=3)


@pytest.mark.parametrize(("fields", "named"), [({"prompt_tokens": -1}, "prompt_tokens"),
                                               ({"prompt_tokens": 1 << 40}, "prompt_tokens"),
                                               ({"prompt": "hi", "allowed_models": "Qwen3-8B"}, "allowed_models")])
def test_arguments_that_cannot_make_a_request_are_refused_naming_them(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        request(**fields)


def test_deadlines_are_positive_and_none_means_the_clients() -> None:
    assert deadline_s(None, 1.5) == 1.5 and deadline_s(0.2, 1.5) == 0.2
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout_s"):
            deadline_s(bad, 1.5)
    with pytest.raises(ValueError, match="timeout_s"):
        RouterClient("localhost:1", timeout_s=0)
    with pytest.raises(ValueError, match="output_tokens"):
        outcome_report("r", 10.0, -1, 0.0)


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
                                            (grpc.StatusCode.DEADLINE_EXCEEDED, RouterTimeout),
                                            (grpc.StatusCode.INTERNAL, RouterError)])
def test_status_codes_become_exceptions(code: grpc.StatusCode, kind: type) -> None:
    error = error_of(_Error(code))
    assert type(error) is kind and error.code is code and error.message == "ttft_slo_ms: must be positive"
    assert str(error) == f"{code.name}: ttft_slo_ms: must be positive"
