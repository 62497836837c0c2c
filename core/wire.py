"""bear.v1 messages ⇄ core domain objects: the one place the wire types and the replay's inputs meet."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from bear.core.batch_time import BatchFeatures, BatchTimeCoefficients, CalibrationFit
from bear.core.state import EngineConfig, InstanceState, ResidentRequest
from bear.v1 import calibration_pb2, snapshot_pb2

# Predicted output tokens still to come for a resident request (≥ 1), e.g. from the predictor's E[L − g | L > g].
RemainingTokens = Callable[[snapshot_pb2.RequestState], int]


def engine_from_proto(message: snapshot_pb2.EngineConfig) -> EngineConfig:
    return EngineConfig(
        max_num_batched_tokens=message.max_num_batched_tokens,
        max_num_seqs=message.max_num_seqs,
        block_size=message.block_size,
        num_gpu_blocks=message.num_gpu_blocks,
        max_model_len=message.max_model_len,
        enable_chunked_prefill=message.enable_chunked_prefill,
        long_prefill_token_threshold=message.long_prefill_token_threshold,
        scheduler_reserve_full_isl=message.scheduler_reserve_full_isl,
        watermark=message.watermark,
        async_scheduling=message.async_scheduling,
        enable_prefix_caching=message.enable_prefix_caching,
    )


class EngineFields(Protocol):
    """What `engine_to_proto` reads: an `EngineConfig`, or the engine settings a snapshot region records."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_gpu_blocks: int
    enable_chunked_prefill: bool
    long_prefill_token_threshold: int
    max_model_len: int
    scheduler_reserve_full_isl: bool
    watermark: float
    async_scheduling: bool
    enable_prefix_caching: bool


def engine_to_proto(engine: EngineFields) -> snapshot_pb2.EngineConfig:
    return snapshot_pb2.EngineConfig(
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_num_seqs=engine.max_num_seqs,
        block_size=engine.block_size,
        num_gpu_blocks=engine.num_gpu_blocks,
        enable_chunked_prefill=engine.enable_chunked_prefill,
        long_prefill_token_threshold=engine.long_prefill_token_threshold,
        max_model_len=engine.max_model_len,
        scheduler_reserve_full_isl=engine.scheduler_reserve_full_isl,
        watermark=engine.watermark,
        async_scheduling=engine.async_scheduling,
        enable_prefix_caching=engine.enable_prefix_caching,
    )


def state_from_snapshot(snapshot: snapshot_pb2.InstanceSnapshot, remaining: RemainingTokens) -> InstanceState:
    """The replay's starting state: the snapshot's requests with a predicted remaining length each, and, on an
    engine with prefix caching, what its cache holds of those it reports it for (preempted requests waiting)."""
    prefix_caching = snapshot.engine.enable_prefix_caching

    def resident(message: snapshot_pb2.RequestState) -> ResidentRequest:
        # In ResidentRequest's order of fields, by position: a snapshot a step, every resident.
        fields = (message.request_id, message.num_prompt_tokens, message.num_computed_tokens, message.num_output_tokens,
                  max(1, remaining(message)), message.num_allocated_blocks, message.max_tokens or None,
                  message.num_output_placeholders)
        if prefix_caching and message.HasField("num_cached_tokens"):
            return ResidentRequest(*fields, message.num_cached_tokens, message.num_evictable_blocks,
                                   message.num_free_blocks_ahead)
        return ResidentRequest(*fields)

    running = tuple(resident(r) for r in snapshot.running)
    # Blocks held (usable minus free) fewer than the running requests' counts add up to: prefix-cache hits on blocks
    # another running request holds (InstanceState.shared_blocks).
    held = sum(r.num_allocated_blocks for r in running) + snapshot.num_free_blocks
    return InstanceState(
        engine=engine_from_proto(snapshot.engine),
        free_blocks=snapshot.num_free_blocks,
        running=running,
        waiting=tuple(resident(r) for r in snapshot.waiting),
        shared_blocks=max(0, held - snapshot.engine.num_gpu_blocks),
    )


def features_from_record(record: calibration_pb2.BatchRecord) -> BatchFeatures:
    return BatchFeatures.of_batch(
        (e.num_prefill_tokens, e.num_decode_tokens, e.num_context_tokens) for e in record.entries
    )


# Measured step times outside these bounds are no forward pass of any engine (a clock or a writer gone wrong): one step
# of 1e-300 s drives the relative-error fit to all-zero coefficients, i.e. every TTFT estimate to 0.
MIN_STEP_TIME_S = 1e-6
MAX_STEP_TIME_S = 3600.0


def samples_from_records(records: Iterable[calibration_pb2.BatchRecord]) -> list[tuple[BatchFeatures, float]]:
    """(features, measured time) of executed steps, for calibration (steps still in progress are skipped, and so are
    times outside [MIN_STEP_TIME_S, MAX_STEP_TIME_S]): a step's time is its execution and the engine's own work after
    it until the next step (`overhead_s`, where known)."""
    samples = []
    for record in records:
        time_s = record.duration_s + record.overhead_s
        if record.duration_s > 0 and MIN_STEP_TIME_S <= time_s <= MAX_STEP_TIME_S:
            samples.append((features_from_record(record), time_s))
    return samples


def coefficients_to_proto(fit: CalibrationFit, fitted_at_s: float = 0.0) -> calibration_pb2.BatchTimeCoefficients:
    c = fit.coefficients
    return calibration_pb2.BatchTimeCoefficients(
        intercept_s=c.b0, per_token_s=c.b1, per_decode_context_token_s=c.b2, per_prefill_attention_token_s=c.b3,
        mape=fit.mape, num_samples=fit.num_samples, fitted_at_s=fitted_at_s,
    )


def coefficients_from_proto(message: calibration_pb2.BatchTimeCoefficients) -> BatchTimeCoefficients:
    return BatchTimeCoefficients(message.intercept_s, message.per_token_s, message.per_decode_context_token_s,
                                 message.per_prefill_attention_token_s)
