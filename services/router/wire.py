"""bear.v1 messages ⇄ the router's domain objects: the Router API, the predictor's and the estimator's replies, and
what Redis holds (registrations, snapshots, dispatch records)."""

from __future__ import annotations

import math

from bear.common.prices import price_ok
from bear.core.wire import engine_from_proto
from bear.router.decision import DispatchRecord, Outcome, RouteResult
from bear.router.pool import Registration
from bear.router.query import RouteQuery
from bear.router.signals import InstanceEstimate, ModelPrediction, QueueLengths
from bear.routing.contract import Decision
from bear.v1 import estimator_pb2, predictor_pb2, router_pb2, snapshot_pb2

_METHODS = {
    estimator_pb2.ESTIMATE_METHOD_REPLAY: "replay",
    estimator_pb2.ESTIMATE_METHOD_LPS: "lps",
    estimator_pb2.ESTIMATE_METHOD_NONE: "none",
    estimator_pb2.ESTIMATE_METHOD_UNSPECIFIED: "none",
}
_DECISIONS = {Decision.ROUTE: router_pb2.DECISION_ROUTE, Decision.SHED: router_pb2.DECISION_SHED}


# The Router API ---------------------------------------------------------------------------------------------------

def query_from_proto(request: router_pb2.RouteRequest) -> RouteQuery:
    which = request.WhichOneof("query")
    return RouteQuery(
        request_id=request.request_id,
        prompt=request.prompt if which == "prompt" else None,
        prompt_tokens=request.prompt_tokens if which == "prompt_tokens" else None,
        ttft_slo_ms=request.ttft_slo_ms,
        lambda_per_micro_usd=request.lambda_per_micro_usd if request.HasField("lambda_per_micro_usd") else None,
        delta_per_s=request.delta_per_s if request.HasField("delta_per_s") else None,
        policy=request.policy,
        allowed_models=tuple(request.allowed_models),
        max_tokens=request.max_tokens if request.HasField("max_tokens") else None,
    )


def decision_to_proto(result: RouteResult) -> router_pb2.RouteDecision:
    return router_pb2.RouteDecision(
        request_id=result.request_id,
        decision=_DECISIONS[result.decision],
        instance_id=result.instance_id,
        endpoint=result.endpoint,
        model=result.model,
        policy=result.policy,
        reason=result.reason,
        candidates=[router_pb2.CandidateDecision(
            instance_id=c.instance_id, model=c.model, endpoint=c.endpoint, predicted_accuracy=c.predicted_accuracy,
            predicted_output_tokens=c.predicted_output_tokens, prompt_tokens=c.prompt_tokens,
            predicted_cost_micro_usd=c.predicted_cost_micro_usd, utility=c.utility, ttft_known=c.ttft_known,
            predicted_ttft_ms=c.predicted_ttft_ms, ttft_method=c.ttft_method, feasible=c.feasible, score=c.score,
            snapshot_age_ms=c.snapshot_age_ms, cached_prompt_tokens=c.cached_prompt_tokens, idle_ms=c.idle_ms)
            for c in result.candidates],
        degraded=result.degraded,
        degraded_reason=result.degraded_reason,
        decision_ms=result.decision_ms,
        ttft_budget_ms=result.ttft_budget_ms,
    )


def outcome_from_proto(report: router_pb2.OutcomeReport) -> Outcome:
    return Outcome(report.request_id, report.observed_ttft_ms, report.output_tokens, report.observed_e2e_ms)


def ack_to_proto(known: bool, predicted_ttft_ms: float) -> router_pb2.OutcomeAck:
    return router_pb2.OutcomeAck(known=known, predicted_ttft_ms=predicted_ttft_ms)


# The predictor and the estimator ----------------------------------------------------------------------------------

def predict_request(prompt: str) -> predictor_pb2.PredictRequest:
    return predictor_pb2.PredictRequest(prompt=prompt)  # every model of the catalogue: matched to instances here


def predictions_from_proto(reply: predictor_pb2.PredictResponse) -> dict[str, ModelPrediction]:
    return {p.model: ModelPrediction(p.model, p.accuracy, p.output_tokens, p.prompt_tokens, p.cost_micro_usd,
                                     p.output_usd_per_mtok)
            for p in reply.predictions}


def estimate_request(query_id: str, prompt_tokens: int, output_tokens: float, instance_ids: list[str],
                     horizon_ms: float, prefix_hashes: bytes = b"") -> estimator_pb2.EstimateRequest:
    return estimator_pb2.EstimateRequest(query_id=query_id, prompt_tokens=prompt_tokens,
                                         predicted_output_tokens=output_tokens, instance_ids=instance_ids,
                                         horizon_ms=horizon_ms, prompt_prefix_hashes=prefix_hashes)


def estimates_from_proto(reply: estimator_pb2.EstimateResponse) -> dict[str, InstanceEstimate]:
    return {e.instance_id: estimate_from_proto(e) for e in reply.estimates}


def estimate_from_proto(e: estimator_pb2.InstanceEstimate) -> InstanceEstimate:
    method = _METHODS.get(e.method, "none")
    # Queue lengths come from a snapshot: one was used when the replay ran or when it has an age.
    has_snapshot = method == "replay" or e.snapshot_age_ms > 0
    return InstanceEstimate(
        instance_id=e.instance_id, method=method, known=e.known, feasible=e.feasible, ttft_ms=e.ttft_ms,
        lower_bound=e.lower_bound, snapshot_age_ms=e.snapshot_age_ms if has_snapshot else None,
        num_batches=e.num_batches, reason=e.reason,
        prefill_tps_ttft_ms=e.prefill_tps_ttft_ms if e.prefill_tps_ttft_ms > 0 else None,
        num_running=e.num_running if has_snapshot else None, num_waiting=e.num_waiting if has_snapshot else None,
        pending_decode_tokens=e.pending_decode_tokens if has_snapshot else None,
        cached_prompt_tokens=e.cached_prompt_tokens,
        idle_ms=e.idle_ms if e.HasField("idle_ms") else None,
    )


# Redis ------------------------------------------------------------------------------------------------------------

def registration_from_bytes(payload: bytes) -> Registration:
    r = snapshot_pb2.InstanceRegistration.FromString(payload)
    for name in ("input_usd_per_million_tokens", "output_usd_per_million_tokens"):
        if not price_ok(getattr(r, name)):  # a sidecar's settings refuse it: not a registration BEAR wrote
            raise ValueError(f"{name} is {getattr(r, name):g}")
    return Registration(r.instance_id, r.pool, r.model, r.endpoint, r.input_usd_per_million_tokens,
                        r.output_usd_per_million_tokens)


def queue_lengths_from_bytes(payload: bytes, now_s: float) -> QueueLengths:
    s = snapshot_pb2.InstanceSnapshot.FromString(payload)
    age_ms = max(0.0, now_s - max(s.taken_at_s, s.read_at_s)) * 1000
    usable = min(s.engine.block_size, s.engine.num_gpu_blocks, s.engine.max_model_len) > 0
    return QueueLengths(len(s.running), len(s.waiting) + s.num_omitted_waiting, age_ms,
                        engine_from_proto(s.engine) if usable else None)


def dispatch_to_bytes(record: DispatchRecord) -> bytes:
    return dispatch_to_proto(record).SerializeToString()


def dispatch_to_proto(record: DispatchRecord) -> router_pb2.DispatchRecord:
    return router_pb2.DispatchRecord(
        request_id=record.request_id, instance_id=record.instance_id, model=record.model,
        dispatched_at_s=record.dispatched_at_s, prompt_tokens=record.prompt_tokens,
        predicted_output_tokens=record.predicted_output_tokens,
        predicted_ttft_ms=record.predicted_ttft_ms if math.isfinite(record.predicted_ttft_ms) else 0.0,
        ttft_slo_ms=record.ttft_slo_ms, ttft_offset_ms=record.ttft_offset_ms,
        ttft_exact=record.ttft_exact, max_tokens=record.max_tokens, prompt_prefix_hashes=record.prompt_prefix_hashes,
        engine_idle=record.engine_idle)


def dispatch_from_bytes(payload: bytes) -> DispatchRecord:
    r = router_pb2.DispatchRecord.FromString(payload)
    return DispatchRecord(r.request_id, r.instance_id, r.model, r.dispatched_at_s, r.prompt_tokens,
                          r.predicted_output_tokens, r.predicted_ttft_ms, r.ttft_slo_ms, r.ttft_offset_ms,
                          r.ttft_exact, r.max_tokens, r.prompt_prefix_hashes, r.engine_idle)
