"""bear.v1 messages ⇄ the estimator's domain: Estimate requests and replies, dispatch records, calibrations."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bear.common.prefix_blocks import check_hashes
from bear.core.batch_time import BatchTimeCoefficients
from bear.core.state import Query
from bear.core.wire import coefficients_from_proto
from bear.estimator.estimation import Dispatch, Method, TtftEstimate
from bear.v1 import calibration_pb2, estimator_pb2, router_pb2

MAX_OUTPUT_TOKENS = 1 << 24  # a predicted length beyond this is an error, not a prediction
# One call may not hold the event loop (every Estimate and the snapshot feed share it) for long: 100,000 ids took
# ~0.6 s to answer, and the router's calls behind it timed out.
MAX_INSTANCE_IDS = 4096
MAX_RECENT_DISPATCHES = 1024  # a router sends its last 32 (bear.router.router)

_METHODS = {
    Method.REPLAY: estimator_pb2.ESTIMATE_METHOD_REPLAY,
    Method.LPS: estimator_pb2.ESTIMATE_METHOD_LPS,
    Method.NONE: estimator_pb2.ESTIMATE_METHOD_NONE,
}


class InvalidRequest(ValueError):
    """A request the estimator cannot answer; the message names the field (INVALID_ARGUMENT)."""


@dataclass(frozen=True, slots=True)
class EstimateCall:
    query: Query
    instance_ids: tuple[str, ...]  # empty: every known instance
    horizon_s: float  # math.inf: no limit
    prefix_hashes: bytes = b""  # the prompt's prefix blocks (bear.common.prefix_blocks)


@dataclass(frozen=True, slots=True)
class InstanceFacts:
    """What the snapshot says besides the estimate (the reply's num_running, num_waiting, pending_decode_tokens)."""

    num_running: int = 0
    num_waiting: int = 0
    pending_decode_tokens: float = 0.0


def estimate_call(request: estimator_pb2.EstimateRequest, default_query_id: str) -> EstimateCall:
    if request.prompt_tokens < 1:
        raise InvalidRequest("prompt_tokens must be >= 1")
    output = request.predicted_output_tokens
    if not (math.isfinite(output) and 0 <= output <= MAX_OUTPUT_TOKENS):
        raise InvalidRequest(f"predicted_output_tokens must be a number in [0, {MAX_OUTPUT_TOKENS}], got {output!r}")
    if not (math.isfinite(request.horizon_ms) and request.horizon_ms >= 0):
        raise InvalidRequest(f"horizon_ms must be a finite number >= 0, got {request.horizon_ms!r}")
    if len(request.instance_ids) > MAX_INSTANCE_IDS:
        raise InvalidRequest(f"instance_ids: {len(request.instance_ids)} ids, more than the limit of {MAX_INSTANCE_IDS}")
    if len(request.recent_dispatches) > MAX_RECENT_DISPATCHES:
        raise InvalidRequest(f"recent_dispatches: {len(request.recent_dispatches)} records, more than the limit of "
                             f"{MAX_RECENT_DISPATCHES}")
    if any(not instance_id for instance_id in request.instance_ids):
        raise InvalidRequest("instance_ids must not contain an empty id")
    problem = check_hashes(request.prompt_prefix_hashes, "prompt_prefix_hashes")
    if problem is not None:
        raise InvalidRequest(problem)
    query = Query(request.query_id or default_query_id, request.prompt_tokens, max(1, round(output)))
    horizon_s = request.horizon_ms / 1000 if request.horizon_ms > 0 else math.inf
    return EstimateCall(query, tuple(dict.fromkeys(request.instance_ids)), horizon_s, request.prompt_prefix_hashes)


def instance_estimate(estimate: TtftEstimate, facts: InstanceFacts) -> estimator_pb2.InstanceEstimate:
    """known: a TTFT was estimated; feasible: false only when the query can never be served there (ttft_ms is then
    +inf: the replay found so, or the engine's settings refuse its prompt); an LPS estimate of an overloaded instance
    is known, feasible and +inf."""
    ttft_s = estimate.ttft_s
    infeasible = estimate.method is not Method.LPS and ttft_s is not None and math.isinf(ttft_s)
    reason = estimate.reason
    if estimate.method is Method.LPS and ttft_s is not None and math.isinf(ttft_s):
        reason = f"{reason} (arrival rate at or above the service rate: the wait is unbounded)"
    return estimator_pb2.InstanceEstimate(
        instance_id=estimate.instance_id,
        method=_METHODS[estimate.method],
        known=ttft_s is not None,
        feasible=not infeasible,
        ttft_ms=0.0 if ttft_s is None else ttft_s * 1000,
        lower_bound=estimate.lower_bound,
        snapshot_age_ms=0.0 if estimate.snapshot_age_s is None else max(0.0, estimate.snapshot_age_s) * 1000,
        num_batches=estimate.num_batches,
        reason=reason,
        prefill_tps_ttft_ms=0.0 if estimate.prefill_tps_ttft_s is None else estimate.prefill_tps_ttft_s * 1000,
        num_running=facts.num_running,
        num_waiting=min(facts.num_waiting, 2**32 - 1),  # written rows + those left out (a uint32 each)
        pending_decode_tokens=facts.pending_decode_tokens,
        cached_prompt_tokens=estimate.cached_tokens,
        idle_ms=None if estimate.idle_s is None else estimate.idle_s * 1000,
    )


def dispatch_from_record(record: router_pb2.DispatchRecord, instance_id: str, model: str) -> Dispatch | None:
    """The dispatch a router recorded, as the estimator uses it (`instance_id` and `model` where the record names
    none); None for a record that cannot be one (no id, a prompt of no tokens, a length that is not a number). Prefix
    blocks that cannot be (bear.common.prefix_blocks.check_hashes) are left out: the rest of the record stands."""
    output = record.predicted_output_tokens
    if (not record.request_id or record.prompt_tokens < 1 or not math.isfinite(record.dispatched_at_s)
            or not (math.isfinite(output) and 0 <= output <= MAX_OUTPUT_TOKENS)):
        return None
    hashes = record.prompt_prefix_hashes
    return Dispatch(record.request_id, record.instance_id or instance_id, record.model or model,
                    record.dispatched_at_s, record.prompt_tokens, max(1.0, output), record.max_tokens or None,
                    hashes if check_hashes(hashes, "") is None else b"")


def coefficients_from_message(message: calibration_pb2.BatchTimeCoefficients) -> BatchTimeCoefficients | None:
    """The eq. 12 coefficients of a fit (None when the snapshotter has not fitted any, they are not numbers, or they
    make a step of few tokens free: no per-step and no per-token time, which no engine has)."""
    if message.num_samples == 0:
        return None
    try:
        coefficients = coefficients_from_proto(message)
    except ValueError:
        return None
    return coefficients if coefficients.b0 > 0 or coefficients.b1 > 0 else None
