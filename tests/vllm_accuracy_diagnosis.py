"""Why an end-to-end TTFT estimate was off (`tests/vllm_accuracy.py`): each query's estimate re-done offline from what
the estimator had, set against what the engine did.

The harness records every snapshot published on Redis's channel (`SnapshotLog`, with the time it arrived) and, at the
end, the routers' dispatch records. For a query estimated at `t` (its dispatch time: the router records it right after
the estimate), `diagnose` takes the latest snapshot that had arrived by then, adds the queries dispatched since it was
taken and not in it (as the estimator does), and replays it with every resident's true remaining length (outputs are
exactly max_tokens here) and, under prefix caching, the prompt tokens each waiting request, arrival and the query
found cached (their computed tokens when the engine first scheduled them), recording the batches. Against the step
ring it reports:

- `age_ms`: t − taken_at of that snapshot; `num_added`: dispatches added as arrivals; `num_in_transit`: queries routed
  before the snapshot was taken that had not reached the engine's queue by then (neither resident nor added);
- `replayed_batches` vs `real_batches`: batches up to the query's first token in the replay and in the engine (from
  the snapshot's next step on);
- `step_time_error_pct`: eq. 12 on the real batches' compositions vs their measured times (execution and the
  engine's own work after each, `overhead_s`), summed;
- `gaps_ms`: engine time between those steps that no step's time covers (the engine's work after a step the next did
  not follow straight on);
- `late_ms`: engine arrival of the query − t (the estimator assumes the query arrives at t);
- `offline_ttft_ms`: the offline replay's TTFT from t (with true lengths), to set beside the router's prediction.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import redis

from bear.common import redis_keys
from bear.core.batch_time import BatchFeatures, is_decode
from bear.core.replay import estimate, prepare
from bear.core.state import Arrival, Query, ResidentRequest
from bear.core.wire import coefficients_from_proto, state_from_snapshot
from bear.estimator.request_ids import router_request_id
from bear.snapshotter.reader import StepRecord
from bear.v1 import router_pb2, snapshot_pb2


class SnapshotLog:
    """Every snapshot published on the channel, with the time it arrived here (a thread of its own)."""

    def __init__(self, redis_url: str):
        self._client = redis.Redis.from_url(redis_url, socket_timeout=5)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(redis_keys.SNAPSHOTS_CHANNEL)
        self.received: list[tuple[float, snapshot_pb2.InstanceSnapshot]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="snapshot-log", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            message = self._pubsub.get_message(timeout=0.1)
            if message is not None:
                self.received.append((time.time(), snapshot_pb2.InstanceSnapshot.FromString(message["data"])))

    def dispatches(self, request_ids: Sequence[str]) -> dict[str, router_pb2.DispatchRecord]:
        values = self._client.mget([redis_keys.dispatch_key(r) for r in request_ids]) if request_ids else []
        return {r: router_pb2.DispatchRecord.FromString(v) for r, v in zip(request_ids, values) if v is not None}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pubsub.close()
        self._client.close()


@dataclass(frozen=True, slots=True)
class Diagnosis:
    request_id: str
    age_ms: float
    num_added: int
    num_in_transit: int
    replayed_batches: int
    real_batches: int
    offline_ttft_ms: float
    step_time_error_pct: float
    gaps_ms: float
    late_ms: float


@dataclass(frozen=True, slots=True)
class QueryFacts:
    """What the harness knows of one query (request id, prompt tokens, max_tokens)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int


def diagnose(queries: Sequence[QueryFacts], snapshots: Sequence[tuple[float, snapshot_pb2.InstanceSnapshot]],
             dispatches: Mapping[str, router_pb2.DispatchRecord], steps: Mapping[int, StepRecord]
             ) -> list[Diagnosis]:
    by_id = {q.request_id: q for q in queries}
    received = sorted(snapshots, key=lambda pair: pair[0])
    arrived_at = [at for at, _ in received]
    first_step, first_token_step, arrival, hits = _engine_facts(steps)
    found = []
    for query in queries:
        dispatch = dispatches.get(query.request_id)
        if dispatch is None or query.request_id not in first_token_step:
            continue
        t = dispatch.dispatched_at_s
        position = bisect.bisect_right(arrived_at, t) - 1
        if position < 0:
            continue
        snapshot = received[position][1]
        if not snapshot.HasField("batch_time"):
            continue
        found.append(_diagnose_one(query, t, snapshot, by_id, dispatches, steps, first_step, first_token_step,
                                   arrival, hits))
    return found


def _engine_facts(steps: Mapping[int, StepRecord]) -> tuple[dict[str, int], dict[str, int], dict[str, float],
                                                            dict[str, int]]:
    """Router request id → the first step scheduling it, the step computing its last prompt token, its arrival, and
    the prompt tokens it found in the prefix cache (its computed tokens when first scheduled)."""
    first_step: dict[str, int] = {}
    first_token_step: dict[str, int] = {}
    arrival: dict[str, float] = {}
    hits: dict[str, int] = {}
    for index in sorted(steps):
        for entry in steps[index].entries:
            key = router_request_id(entry.request_id)
            first_step.setdefault(key, index)
            arrival.setdefault(key, entry.arrival_time_s)
            hits.setdefault(key, entry.num_computed_tokens)
            if key not in first_token_step and (entry.num_computed_tokens + entry.num_scheduled_tokens
                                                >= entry.num_prompt_tokens):
                first_token_step[key] = index
    return first_step, first_token_step, arrival, hits


def _diagnose_one(query: QueryFacts, t: float, snapshot: snapshot_pb2.InstanceSnapshot,
                  by_id: Mapping[str, QueryFacts], dispatches: Mapping[str, router_pb2.DispatchRecord],
                  steps: Mapping[int, StepRecord], first_step: Mapping[str, int], first_token_step: Mapping[str, int],
                  arrival: Mapping[str, float], hits: Mapping[str, int]) -> Diagnosis:
    coefficients = coefficients_from_proto(snapshot.batch_time).at_speed(snapshot.step_time_ratio)  # as the estimator
    residents = {router_request_id(r.request_id) for r in (*snapshot.running, *snapshot.waiting)}
    # True remaining lengths: outputs are exactly max_tokens.
    state = state_from_snapshot(snapshot, lambda r: max(1, r.max_tokens - r.num_output_tokens))
    added, in_transit = [], 0
    for other_id, record in sorted(dispatches.items(), key=lambda pair: pair[1].dispatched_at_s):
        other = by_id.get(other_id)
        if other is None or other_id == query.request_id or other_id in residents:
            continue
        if snapshot.taken_at_s < record.dispatched_at_s < t:
            added.append(Arrival(record.dispatched_at_s - snapshot.taken_at_s,
                                 ResidentRequest(other_id, other.prompt_tokens, 0, 0, other.max_tokens,
                                                 cached_tokens=min(hits.get(other_id, 0), other.prompt_tokens))))
        elif record.dispatched_at_s <= snapshot.taken_at_s and first_step.get(other_id, -1) >= snapshot.next_step_index:
            in_transit += 1
    # The engine's own prefix-cache hits, for the query, the arrivals and the snapshot's waiting requests — except
    # those the snapshot reports what the cache holds of (preempted ones: their first scheduling's hit is long gone).
    state = replace(state, waiting=tuple(
        r if message.HasField("num_cached_tokens")
        else replace(r, cached_tokens=min(hits.get(router_request_id(r.id), 0), r.num_prompt_tokens))
        for r, message in zip(state.waiting, snapshot.waiting, strict=True)))
    hit = min(hits.get(query.request_id, 0), query.prompt_tokens)
    result = estimate(prepare(state), Query(query.request_id, query.prompt_tokens, query.max_tokens), coefficients,
                      query_time_s=t - snapshot.taken_at_s, arrivals=added, query_cached_tokens=hit,
                      record_batches=True)
    last = first_token_step[query.request_id]
    real = [steps[i] for i in range(snapshot.next_step_index, last + 1) if i in steps]
    predicted_s = sum(coefficients.time_s(_features(s)) for s in real)
    measured_s = sum(s.duration_s + s.overhead_s for s in real)
    span_s = (real[-1].execution_started_at_s + real[-1].duration_s + real[-1].overhead_s - real[0].scheduled_at_s
              if real else 0.0)
    return Diagnosis(
        request_id=query.request_id,
        age_ms=1e3 * (t - snapshot.taken_at_s),
        num_added=len(added),
        num_in_transit=in_transit,
        replayed_batches=result.first_token_batch or result.num_batches,
        real_batches=last + 1 - snapshot.next_step_index,
        offline_ttft_ms=1e3 * (result.ttft_s or 0.0),
        step_time_error_pct=100 * (predicted_s - measured_s) / measured_s if measured_s > 0 else float("nan"),
        gaps_ms=1e3 * (span_s - measured_s),
        late_ms=1e3 * (arrival.get(query.request_id, t) - t),
    )


def _features(step: StepRecord) -> BatchFeatures:
    return BatchFeatures.of_batch(
        (0 if is_decode(e.num_scheduled_tokens) else e.num_scheduled_tokens, 1 if is_decode(e.num_scheduled_tokens)
         else 0, e.num_computed_tokens) for e in step.entries)


def summary_lines(diagnoses: Sequence[Diagnosis]) -> list[str]:
    if not diagnoses:
        return ["diagnosis: nothing to diagnose"]
    exact = sum(d.replayed_batches == d.real_batches for d in diagnoses)
    return [
        f"diagnosis of {len(diagnoses)} queries: offline replay's batch count exact for {exact} "
        f"({100 * exact / len(diagnoses):.0f}%), median |replayed - real| "
        f"{np.median([abs(d.replayed_batches - d.real_batches) for d in diagnoses]):.0f}",
        f"  snapshot age at the estimate: median {np.median([d.age_ms for d in diagnoses]):.0f} ms, "
        f"max {max(d.age_ms for d in diagnoses):.0f} ms; dispatches added: median "
        f"{np.median([d.num_added for d in diagnoses]):.0f}; queries in transit (not counted): "
        f"{sum(d.num_in_transit for d in diagnoses)} over {sum(d.num_in_transit > 0 for d in diagnoses)} queries",
        f"  eq. 12 on the real steps: median error {np.median([d.step_time_error_pct for d in diagnoses]):+.1f}% "
        f"(summed per query); gaps between steps: median {np.median([d.gaps_ms for d in diagnoses]):.1f} ms per "
        f"query; query reached the engine median {np.median([d.late_ms for d in diagnoses]):.1f} ms after the estimate",
    ]


def table_lines(diagnoses: Sequence[Diagnosis]) -> list[str]:
    lines = [f"{'query':>10} {'age ms':>6} {'added':>5} {'transit':>7} {'replayed':>8} {'real':>5} {'offline':>8} "
             f"{'eq12 %':>7} {'gaps ms':>7} {'late ms':>7}"]
    lines += [f"{d.request_id:>10} {d.age_ms:>6.0f} {d.num_added:>5} {d.num_in_transit:>7} {d.replayed_batches:>8} "
              f"{d.real_batches:>5} {d.offline_ttft_ms:>8.1f} {d.step_time_error_pct:>+7.1f} {d.gaps_ms:>7.1f} "
              f"{d.late_ms:>7.1f}" for d in diagnoses]
    return lines

