"""Region records → bear.v1 messages, and the published snapshot as the replay's starting state."""

from __future__ import annotations

from pathlib import Path

from bear.core.state import check_state
from bear.core.wire import features_from_record, samples_from_records, state_from_snapshot
from bear.snapshotter.reader import RegionReader, RegionSnapshot, StepEntryRecord, StepRecord
from bear.snapshotter.wire import entry_to_proto, snapshot_to_proto, step_to_proto
from bear.v1 import calibration_pb2
from tests.region_builders import ENGINE, FakeEngine, decoding, small_capacities, waiting


def read_snapshot(tmp_path: Path, running: list, queue: list, scheduled: dict[str, int] | None = None,
                  max_rows: int = 8) -> RegionSnapshot:
    engine = FakeEngine(str(tmp_path / "region"), small_capacities(max_rows=max_rows))
    engine.write_state(running, queue, num_free_blocks=500)
    if scheduled:
        engine.schedule(scheduled)
    snapshot = RegionReader(str(tmp_path / "region")).read()
    assert snapshot is not None
    return snapshot


def test_one_scheduled_token_is_a_decode_and_more_are_prefill() -> None:
    cases = [  # (prompt, scheduled, computed before) → (prefill, decode, context)
        ((100, 1, 102), (0, 1, 102)),  # decoding
        ((100, 1, 100), (0, 1, 100)),  # first decode, right after the prompt
        ((100, 1, 99), (0, 1, 99)),  # the prompt's last token, alone: costs as a decode
        ((100, 40, 60), (40, 0, 60)),  # a chunk
        ((100, 103, 0), (103, 0, 0)),  # a preempted request recomputing prompt and outputs
    ]
    for (prompt, scheduled, computed), expected in cases:
        entry = entry_to_proto(StepEntryRecord("r", prompt, scheduled, computed))
        assert (entry.num_prefill_tokens, entry.num_decode_tokens, entry.num_context_tokens) == expected


def test_step_records_keep_timing_and_feed_the_batch_time_features() -> None:
    step = StepRecord(7, scheduled_at_s=10.0, execution_started_at_s=10.5, duration_s=0.25,
                      entries=(StepEntryRecord("a", 100, 1, 104), StepEntryRecord("b", 50, 50, 0)), complete=True,
                      overhead_s=0.002)
    record = step_to_proto(step)
    assert (record.step_index, record.started_at_s, record.execution_started_at_s, record.duration_s,
            record.overhead_s) == (7, 10.0, 10.5, 0.25, 0.002)
    assert samples_from_records([record])[0][1] == 0.252  # the step's time in eq. 12: execution and overhead
    features = features_from_record(record)
    assert (features.num_prefill_tokens, features.num_decode_tokens, features.decode_context,
            features.prefill_attention) == (50, 1, 104, 50 * 51 // 2)


def test_a_snapshot_carries_the_engine_s_counts_and_feeds_the_replay(tmp_path: Path) -> None:
    running = [decoding("a", prompt=900, outputs=3), decoding("b", prompt=20, outputs=1)]
    snapshot = read_snapshot(tmp_path, running, [waiting("c", prompt=300)], scheduled={"a": 1, "b": 1, "c": 300})
    fit = calibration_pb2.BatchTimeCoefficients(intercept_s=0.004, per_token_s=2e-5, mape=0.09, num_samples=100)
    message = snapshot_to_proto(snapshot, instance_id="i-1", pool="small", model="", read_at_s=5.0, batch_time=fit)
    assert (message.instance_id, message.pool, message.model, message.read_at_s) == ("i-1", "small", ENGINE.model, 5.0)
    assert message.sequence_number == snapshot.sequence_number and message.taken_at_s == snapshot.written_at_s
    assert message.engine_started_at_s == snapshot.created_at_s > 0  # a restart gives another (its caches empty)
    assert message.engine.num_gpu_blocks == ENGINE.num_gpu_blocks and message.num_free_blocks == 500
    assert message.engine.enable_prefix_caching
    assert [(r.request_id, r.num_computed_tokens, r.num_output_tokens, r.num_allocated_blocks) for r in
            message.running] == [("a", 902, 3, 57), ("b", 20, 1, 2)]
    assert [r.request_id for r in message.waiting] == ["c"] and message.num_omitted_waiting == 0
    assert message.next_step_index == 0 and message.step_in_progress.step_index == 0
    assert [e.request_id for e in message.step_in_progress.entries] == ["a", "b", "c"]
    assert message.batch_time == fit
    state = state_from_snapshot(message, remaining=lambda request: 10)
    check_state(state)
    assert [r.id for r in state.running] == ["a", "b"] and state.free_blocks == 500


def test_a_truncated_state_says_how_many_waiting_requests_it_leaves_out(tmp_path: Path) -> None:
    snapshot = read_snapshot(tmp_path, [decoding("a")], [waiting(f"w{i}") for i in range(6)], max_rows=3)
    message = snapshot_to_proto(snapshot, instance_id="i", pool="p", model="m", read_at_s=0.0, batch_time=None)
    assert [r.request_id for r in message.waiting] == ["w0", "w1"] and message.num_omitted_waiting == 4
    assert message.model == "m" and not message.HasField("batch_time") and not message.HasField("step_in_progress")
