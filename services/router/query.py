"""A query as the router receives it, and the checks it must pass before anything is called.

Each failed check raises `InvalidQuery` naming the field (the server answers INVALID_ARGUMENT with its message).
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass, replace

from bear.common.messages import shown
from bear.routing.contract import MAX_WEIGHT

MAX_REQUEST_ID_BYTES = 128  # the snapshot region keeps vLLM's ids of these whole (BEAR_SNAPSHOT_MAX_ID_BYTES)
# A request id travels to vLLM as the X-Request-Id header and comes back in its snapshots: visible ASCII only (no
# spaces or control characters, which HTTP would refuse or alter, and the estimator would then not recognise).
_REQUEST_ID = re.compile(r"[!-~]+")
# allowed_models goes into the decision's span: bounded, so that one query cannot make a span no exporter sends
MAX_ALLOWED_MODELS = 256
MAX_MODEL_NAME_BYTES = 256


class InvalidQuery(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class DuplicateRequest(InvalidQuery):
    """A request id this router has already routed (ALREADY_EXISTS)."""


@dataclass(frozen=True, slots=True)
class RouteQuery:
    request_id: str  # empty: the router generates one
    prompt: str | None  # the text, or None for a length-only query
    prompt_tokens: int | None  # a length-only query's prompt length (None when the text is given)
    ttft_slo_ms: float
    lambda_per_micro_usd: float | None = None  # None: the configured λ
    delta_per_s: float | None = None  # None: the policy's default δ
    policy: str = ""  # empty: the configured default
    allowed_models: tuple[str, ...] = ()  # empty: every model
    max_tokens: int | None = None  # the request's max_tokens for vLLM: caps predicted output lengths


@dataclass(frozen=True, slots=True)
class Limits:
    max_ttft_slo_ms: float
    max_prompt_bytes: int
    max_prompt_tokens: int


def validate(query: RouteQuery, limits: Limits, policies: frozenset[str]) -> RouteQuery:
    """The query, checked, with a request id (generated when empty) and its policy named."""
    request_id = query.request_id or uuid.uuid4().hex
    check_request_id(request_id)
    _check_prompt(query, limits)
    slo = query.ttft_slo_ms
    if not math.isfinite(slo) or slo <= 0:
        raise InvalidQuery("ttft_slo_ms", f"must be a positive number of milliseconds, got {slo!r}")
    if slo > limits.max_ttft_slo_ms:
        raise InvalidQuery("ttft_slo_ms", f"{slo!r} ms exceeds the limit of {limits.max_ttft_slo_ms:g} ms")
    for name in ("lambda_per_micro_usd", "delta_per_s"):
        value = getattr(query, name)
        if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_WEIGHT):
            raise InvalidQuery(name, f"must be a number in [0, {MAX_WEIGHT:g}], got {value!r}")
    if query.policy and query.policy not in policies:
        raise InvalidQuery("policy", f"unknown policy {shown(query.policy)}; choose one of: "
                                     f"{', '.join(sorted(policies))}")
    if query.max_tokens is not None and query.max_tokens < 1:
        raise InvalidQuery("max_tokens", f"must be at least 1 when given, got {query.max_tokens}")
    allowed_models = tuple(dict.fromkeys(query.allowed_models))  # a name given twice counts once
    if len(allowed_models) > MAX_ALLOWED_MODELS:
        raise InvalidQuery("allowed_models", f"{len(allowed_models)} distinct names exceed the limit of "
                                             f"{MAX_ALLOWED_MODELS}")
    for model in allowed_models:
        if not model:
            raise InvalidQuery("allowed_models", "model names must not be empty")
        if len(model.encode("utf-8", errors="surrogatepass")) > MAX_MODEL_NAME_BYTES:
            raise InvalidQuery("allowed_models", f"{shown(model)} is longer than {MAX_MODEL_NAME_BYTES} bytes")
    return replace(query, request_id=request_id, allowed_models=allowed_models)


def check_request_id(request_id: str) -> None:
    if len(request_id.encode("utf-8", errors="surrogatepass")) > MAX_REQUEST_ID_BYTES:
        raise InvalidQuery("request_id", f"longer than {MAX_REQUEST_ID_BYTES} bytes")
    if not _REQUEST_ID.fullmatch(request_id):
        raise InvalidQuery("request_id", f"{shown(request_id)} has characters other than visible ASCII (it is sent "
                                         "to the engine as an HTTP header)")


def check_prompt_tokens(num_tokens: int, limits: Limits, field: str = "prompt") -> None:
    """A prompt's token count (for a text, known only once counted) against the limit."""
    if num_tokens > limits.max_prompt_tokens:
        raise InvalidQuery(field, f"{num_tokens} tokens exceeds the limit of {limits.max_prompt_tokens}")


def _check_prompt(query: RouteQuery, limits: Limits) -> None:
    if query.prompt is None and query.prompt_tokens is None:
        raise InvalidQuery("prompt", "required: the prompt text, or prompt_tokens for a length-only query")
    if query.prompt is not None:
        if not query.prompt.strip():
            raise InvalidQuery("prompt", "must not be empty")
        size = len(query.prompt.encode("utf-8", errors="surrogatepass"))
        if size > limits.max_prompt_bytes:
            raise InvalidQuery("prompt", f"{size} bytes exceeds the limit of {limits.max_prompt_bytes}")
    elif query.prompt_tokens is not None:
        if query.prompt_tokens <= 0:
            raise InvalidQuery("prompt_tokens", "must be > 0")
        check_prompt_tokens(query.prompt_tokens, limits, "prompt_tokens")
