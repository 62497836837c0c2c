"""The replay case format (docs/replay-case.md): one instance's state, a query and eq. 12 coefficients, as JSON.

A case counts a request's computed tokens as *prompt* tokens computed (equal to the prompt length once it decodes);
vLLM's own num_computed_tokens follows from it here, in one place. Every field is checked: a CaseError names the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bear.core.batch_time import BatchTimeCoefficients
from bear.core.result import ReplayResult, ReplayStatus
from bear.core.state import EngineConfig, InstanceState, Query, ResidentRequest


class CaseError(ValueError):
    """A case that cannot be read; the message starts with the offending field's path."""


@dataclass(frozen=True, slots=True)
class Case:
    state: InstanceState
    query: Query
    coefficients: BatchTimeCoefficients
    horizon_s: float = math.inf
    query_cached_tokens: int = 0  # the query's prompt tokens the instance's prefix cache holds (replay's keyword)


_ENGINE_INTS = {  # name: minimum
    "max_num_batched_tokens": 1,
    "max_num_seqs": 1,
    "block_size": 1,
    "num_gpu_blocks": 1,
    "long_prefill_token_threshold": 0,
    "max_model_len": 2,
}
_ENGINE_BOOLS = ("enable_chunked_prefill", "scheduler_reserve_full_isl", "async_scheduling")
_ENGINE_OPTIONAL_BOOLS = ("enable_prefix_caching",)  # false when absent
_REQUEST_REQUIRED = ("id", "num_prompt_tokens", "num_computed_tokens", "num_output_tokens", "remaining_output_tokens")
_EVICTABLE = ("num_evictable_blocks", "num_free_blocks_ahead")  # a waiting request's own blocks still cached
_REQUEST_OPTIONAL = ("num_allocated_blocks", "max_tokens", "num_output_placeholders", "cached_tokens", *_EVICTABLE)
_TOP_LEVEL = ("engine", "free_blocks", "running", "waiting", "query", "batch_time")


def parse_case(document: Any) -> Case:
    """Reads a decoded JSON case; raises CaseError naming the field on any problem."""
    obj = _object(document, "case")
    _keys(obj, "case", required=_TOP_LEVEL, optional=("horizon_s", "shared_blocks"))
    engine = _engine(_object(obj["engine"], "engine"))
    running = tuple(_request(item, f"running[{i}]", engine, waiting=False) for i, item in enumerate(_list(obj, "running")))
    waiting = tuple(_request(item, f"waiting[{i}]", engine, waiting=True) for i, item in enumerate(_list(obj, "waiting")))
    shared = _int(obj, "shared_blocks", "shared_blocks", 0) if "shared_blocks" in obj else 0
    state = InstanceState(engine, _int(obj, "free_blocks", "free_blocks", 0), running, waiting, shared)
    query_obj = _object(obj["query"], "query")
    _keys(query_obj, "query", required=("id", "num_prompt_tokens", "output_tokens"), optional=("cached_tokens",))
    query = Query(
        _string(query_obj, "id", "query.id"),
        _int(query_obj, "num_prompt_tokens", "query.num_prompt_tokens", 1),
        _int(query_obj, "output_tokens", "query.output_tokens", 1),
    )
    query_cached = _cached_tokens(query_obj, "query", query.num_prompt_tokens)
    horizon_s = _number(obj, "horizon_s", "horizon_s", positive=True) if "horizon_s" in obj else math.inf
    return Case(state, query, _coefficients(_object(obj["batch_time"], "batch_time")), horizon_s, query_cached)


def case_to_json(case: Case) -> dict[str, Any]:
    """The case format of a state, query and coefficients (parse_case's inverse, up to equivalent states)."""
    engine = case.state.engine
    document: dict[str, Any] = {
        "engine": {name: getattr(engine, name) for name in (*_ENGINE_INTS, *_ENGINE_BOOLS, "watermark")},
        "free_blocks": case.state.free_blocks,
        "running": [_request_to_json(r, waiting=False) for r in case.state.running],
        "waiting": [_request_to_json(r, waiting=True) for r in case.state.waiting],
        "query": {"id": case.query.id, "num_prompt_tokens": case.query.num_prompt_tokens,
                  "output_tokens": case.query.output_tokens},
        "batch_time": {name: getattr(case.coefficients, name) for name in ("b0", "b1", "b2", "b3")},
    }
    if engine.enable_prefix_caching:
        document["engine"]["enable_prefix_caching"] = True
    if case.query_cached_tokens:
        document["query"]["cached_tokens"] = case.query_cached_tokens
    if case.state.shared_blocks:
        document["shared_blocks"] = case.state.shared_blocks
    if math.isfinite(case.horizon_s):
        document["horizon_s"] = case.horizon_s
    return document


def _request_to_json(r: ResidentRequest, *, waiting: bool) -> dict[str, Any]:
    prompt, computed, output, max_tokens = r.num_prompt_tokens, r.num_computed_tokens, r.num_output_tokens, r.max_tokens
    decoding = not waiting and computed == prompt + output + r.num_output_placeholders - 1
    if computed >= prompt and not decoding:  # recomputing past its prompt: fold its outputs into the prompt
        prompt, output = prompt + output, 0
        max_tokens = None if max_tokens is None else max_tokens - r.num_output_tokens
    item: dict[str, Any] = {
        "id": r.id,
        "num_prompt_tokens": prompt,
        "num_computed_tokens": prompt if decoding else computed,
        "num_output_tokens": output,
        "remaining_output_tokens": r.remaining_output_tokens,
    }
    if not waiting:
        item["num_allocated_blocks"] = r.num_allocated_blocks
    if max_tokens is not None:
        item["max_tokens"] = max_tokens
    if r.num_output_placeholders:
        item["num_output_placeholders"] = r.num_output_placeholders
    if r.cached_tokens:
        item["cached_tokens"] = r.cached_tokens
    if r.num_evictable_blocks or r.num_free_blocks_ahead:
        item["num_evictable_blocks"] = r.num_evictable_blocks
        item["num_free_blocks_ahead"] = r.num_free_blocks_ahead
    return item


def result_to_json(result: ReplayResult) -> dict[str, Any]:
    """The printed form of a replay result (docs/replay-case.md, Output). Raises CaseError when the coefficients are
    so large that a batch's time overflows (JSON has no infinity)."""
    times = [result.elapsed_s, *(b.time_s for b in result.batches)]
    if result.ttft_s is not None:
        times.append(result.ttft_s)
    if not all(math.isfinite(t) for t in times):
        raise CaseError("batch_time: the coefficients are too large: a batch's time overflows a double")
    out: dict[str, Any] = {
        "status": str(result.status),
        "feasible": result.feasible,
        "first_token_batch": result.first_token_batch,
        "ttft_s": result.ttft_s,
        "batches": [{"scheduled": dict(b.scheduled), "time_s": b.time_s} for b in result.batches],
    }
    if result.status is not ReplayStatus.FIRST_TOKEN:
        out["reason"] = result.reason
        out["elapsed_s"] = result.elapsed_s
    return out


def _engine(obj: dict[str, Any]) -> EngineConfig:
    _keys(obj, "engine", required=(*_ENGINE_INTS, *_ENGINE_BOOLS, "watermark"), optional=_ENGINE_OPTIONAL_BOOLS)
    ints = {name: _int(obj, name, f"engine.{name}", minimum) for name, minimum in _ENGINE_INTS.items()}
    bools = {name: _bool(obj, name, f"engine.{name}") for name in (*_ENGINE_BOOLS, *_ENGINE_OPTIONAL_BOOLS)
             if name in obj}
    watermark = _number(obj, "watermark", "engine.watermark")
    if not watermark < 1.0:
        raise CaseError(f"engine.watermark: must be in [0, 1), got {watermark}")
    return EngineConfig(**ints, **bools, watermark=watermark)


def _request(item: Any, path: str, engine: EngineConfig, *, waiting: bool) -> ResidentRequest:
    obj = _object(item, path)
    _keys(obj, path, required=_REQUEST_REQUIRED + (() if waiting else ("num_allocated_blocks",)), optional=_REQUEST_OPTIONAL)
    prompt = _int(obj, "num_prompt_tokens", f"{path}.num_prompt_tokens", 1)
    computed = _int(obj, "num_computed_tokens", f"{path}.num_computed_tokens", 0)
    output = _int(obj, "num_output_tokens", f"{path}.num_output_tokens", 0)
    if computed > prompt:
        raise CaseError(f"{path}.num_computed_tokens: {computed} exceeds num_prompt_tokens ({prompt})")
    if waiting and computed:
        raise CaseError(f"{path}.num_computed_tokens: must be 0 for a waiting request (a preempted one recomputes)")
    placeholders = _int(obj, "num_output_placeholders", f"{path}.num_output_placeholders", 0) if "num_output_placeholders" in obj else 0
    if placeholders > 1 or (placeholders and (waiting or not engine.async_scheduling)):
        raise CaseError(f"{path}.num_output_placeholders: must be 0 or 1, and 1 only for a running request under async scheduling")
    blocks = _int(obj, "num_allocated_blocks", f"{path}.num_allocated_blocks", 0) if "num_allocated_blocks" in obj else 0
    if waiting and blocks:
        raise CaseError(f"{path}.num_allocated_blocks: must be 0 for a waiting request")
    max_tokens = _int(obj, "max_tokens", f"{path}.max_tokens", 1) if "max_tokens" in obj else None
    # Prompt complete: the request decodes, its next token to compute being its last one (vLLM's view).
    vllm_computed = prompt + output + placeholders - 1 if computed == prompt else computed
    return ResidentRequest(
        id=_string(obj, "id", f"{path}.id"),
        num_prompt_tokens=prompt,
        num_computed_tokens=vllm_computed,
        num_output_tokens=output,
        remaining_output_tokens=_int(obj, "remaining_output_tokens", f"{path}.remaining_output_tokens", 1),
        num_allocated_blocks=blocks,
        max_tokens=max_tokens,
        num_output_placeholders=placeholders,
        cached_tokens=_cached_tokens(obj, path, prompt + output),
        **_evictable(obj, path, engine, waiting=waiting),
    )


def _evictable(obj: dict[str, Any], path: str, engine: EngineConfig, *, waiting: bool) -> dict[str, int]:
    """Optional `num_evictable_blocks` and `num_free_blocks_ahead` of a waiting request (prefix caching on)."""
    given = {name: _int(obj, name, f"{path}.{name}", 0) for name in _EVICTABLE if name in obj}
    for name, value in given.items():
        if value and not (waiting and engine.enable_prefix_caching):
            raise CaseError(f"{path}.{name}: only a waiting request's, with engine.enable_prefix_caching")
    return given


def _cached_tokens(obj: dict[str, Any], path: str, limit: int) -> int:
    """Optional `cached_tokens` of a request or the query: 0 … its tokens, a request's outputs included (default 0)."""
    if "cached_tokens" not in obj:
        return 0
    cached = _int(obj, "cached_tokens", f"{path}.cached_tokens", 0)
    if cached > limit:
        what = "num_prompt_tokens" if path == "query" else "num_prompt_tokens + num_output_tokens"
        raise CaseError(f"{path}.cached_tokens: {cached} exceeds {what} ({limit})")
    return cached


def _coefficients(obj: dict[str, Any]) -> BatchTimeCoefficients:
    _keys(obj, "batch_time", required=("b0", "b1", "b2", "b3"))
    return BatchTimeCoefficients(*(_number(obj, name, f"batch_time.{name}") for name in ("b0", "b1", "b2", "b3")))


def _keys(obj: dict[str, Any], path: str, *, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    for key in required:
        if key not in obj:
            raise CaseError(f"{path}.{key}: missing")
    for key in obj:
        if key not in required and key not in optional:
            raise CaseError(f"{path}.{key}: unknown key")


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CaseError(f"{path}: must be a JSON object")
    return value


def _list(obj: dict[str, Any], key: str) -> list[Any]:
    if not isinstance(obj[key], list):
        raise CaseError(f"{key}: must be a JSON array")
    return obj[key]


def _int(obj: dict[str, Any], key: str, path: str, minimum: int) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise CaseError(f"{path}: must be an integer, got {_shown(value)}")
    if value < minimum:
        raise CaseError(f"{path}: must be >= {minimum}, got {_shown(value)}")
    if value >= 2**31:
        raise CaseError(f"{path}: must be below 2**31, got {_shown(value)}")
    return value


def _bool(obj: dict[str, Any], key: str, path: str) -> bool:
    value = obj[key]
    if not isinstance(value, bool):
        raise CaseError(f"{path}: must be true or false, got {_shown(value)}")
    return value


def _number(obj: dict[str, Any], key: str, path: str, *, positive: bool = False) -> float:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CaseError(f"{path}: must be a finite number, got {_shown(value)}")
    try:
        number = float(value)  # an integer literal beyond a double's range overflows here
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise CaseError(f"{path}: must be a finite number, got {_shown(value)}")
    if number < 0 or (positive and number == 0):
        raise CaseError(f"{path}: must be {'> 0' if positive else '>= 0'}, got {_shown(value)}")
    return number


def _string(obj: dict[str, Any], key: str, path: str) -> str:
    value = obj[key]
    if not isinstance(value, str) or not value:
        raise CaseError(f"{path}: must be a non-empty string, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """A bad value as an error message shows it: short, whatever its size (a 400-digit integer, a nested array)."""
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        try:
            return f"an integer of {len(str(abs(value)))} digits"
        except ValueError:  # more digits than Python converts to text
            return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
