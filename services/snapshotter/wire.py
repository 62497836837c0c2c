"""Region records (`reader`) ⇄ bear.v1 messages: snapshots, step records, registrations.

The mapping from vLLM's request state onto the replay's stays in `bear.core` (`state_from_snapshot`): a snapshot carries
vLLM's own counts unchanged.
"""

from __future__ import annotations

from bear.core.batch_time import is_decode
from bear.core.wire import engine_to_proto
from bear.snapshotter.reader import RegionSnapshot, RequestRecord, StepEntryRecord, StepRecord
from bear.v1 import calibration_pb2, snapshot_pb2


def request_to_proto(request: RequestRecord) -> snapshot_pb2.RequestState:
    """The request's counts; its cached prefix only if the plugin reported one (unset fields: not reported)."""
    message = snapshot_pb2.RequestState(
        request_id=request.request_id,
        num_prompt_tokens=request.num_prompt_tokens,
        num_computed_tokens=request.num_computed_tokens,
        num_output_tokens=request.num_output_tokens,
        max_tokens=request.max_tokens,
        num_allocated_blocks=request.num_allocated_blocks,
        num_output_placeholders=request.num_output_placeholders,
        num_preemptions=request.num_preemptions,
        arrival_time_s=request.arrival_time_s,
    )
    if request.num_cached_tokens is not None:
        message.num_cached_tokens = request.num_cached_tokens
        message.num_evictable_blocks = request.num_evictable_blocks or 0
        message.num_free_blocks_ahead = request.num_free_blocks_ahead or 0
    return message


def entry_to_proto(entry: StepEntryRecord) -> calibration_pb2.BatchEntry:
    """A request's share of a step: one decode token, or prefill tokens (bear.core's rule: exactly one token is a
    decode, as vLLM's attention backends split a batch)."""
    decode = is_decode(entry.num_scheduled_tokens)
    return calibration_pb2.BatchEntry(
        request_id=entry.request_id,
        num_prefill_tokens=0 if decode else entry.num_scheduled_tokens,
        num_decode_tokens=1 if decode else 0,
        num_context_tokens=entry.num_computed_tokens,
    )


def step_to_proto(step: StepRecord) -> calibration_pb2.BatchRecord:
    return calibration_pb2.BatchRecord(
        step_index=step.step_index,
        started_at_s=step.scheduled_at_s,
        duration_s=step.duration_s,
        entries=[entry_to_proto(entry) for entry in step.entries],
        execution_started_at_s=step.execution_started_at_s,
        overhead_s=step.overhead_s,
    )


def snapshot_to_proto(snapshot: RegionSnapshot, *, instance_id: str, pool: str, model: str, read_at_s: float,
                      batch_time: calibration_pb2.BatchTimeCoefficients | None,
                      step_time_ratio: float = 0.0) -> snapshot_pb2.InstanceSnapshot:
    """The published snapshot. `model` falls back to the engine's served model name."""
    message = snapshot_pb2.InstanceSnapshot(
        instance_id=instance_id,
        pool=pool,
        model=model or snapshot.engine.model,
        sequence_number=snapshot.sequence_number,
        taken_at_s=snapshot.written_at_s,
        engine=engine_to_proto(snapshot.engine),
        num_free_blocks=snapshot.num_free_blocks,
        running=[request_to_proto(r) for r in snapshot.running],
        waiting=[request_to_proto(r) for r in snapshot.waiting],
        next_step_index=snapshot.next_step_index,
        num_omitted_waiting=snapshot.num_waiting - len(snapshot.waiting),
        read_at_s=read_at_s,
        engine_started_at_s=snapshot.created_at_s,
    )
    if snapshot.in_flight:
        message.step_in_progress.CopyFrom(step_to_proto(snapshot.in_flight[0]))
    if batch_time is not None:
        message.batch_time.CopyFrom(batch_time)
        message.step_time_ratio = step_time_ratio
    return message
