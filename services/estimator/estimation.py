"""TTFT estimates of one query on many instances, from their latest snapshots (the estimator's domain).

For each instance the estimator keeps its latest snapshot — the engine's state just before it scheduled a step, taken
at `taken_at_s` — prepared once for the compiled replay, its calibration (eq. 12 coefficients, prefill throughput,
LPS parameters) and the requests routers dispatched to it. A query arriving at `now_s` is estimated by replaying the
snapshot on the engine's clock: the snapshot's age becomes the query's arrival time in the replay (so steps scheduled
before it arrived run without it), the step still executing when the snapshot was taken (async scheduling) delays
the first replayed step, and requests dispatched since the snapshot join the queue at their own dispatch times,
ahead of the query — those dispatched more than DISPATCH_TRANSIT_S before the engine was last found unchanged
(`read_at_s` of an idle engine's snapshot) excepted: a request that should have reached the engine by then and is not
in its state never did (never sent, refused by vLLM), and would otherwise make an idle instance look busy for as long
as it stays idle. Residents' remaining output lengths come from their predicted length at dispatch, conditioned on
what they have generated (`RemainingTokens`). A missing or too old snapshot falls back to the LPS closed form. A
snapshot of a queue longer than the snapshotter writes (`num_omitted_waiting`) has the requests it leaves out prefill
ahead of the query (`_behind_omitted`): a lower bound.
On an engine with prefix caching (its snapshot says), the query, the requests dispatched since the snapshot and the
snapshot's waiting requests are admitted with the part of their prompt the instance's prefix cache likely holds
(`PrefixIndex`, fed by the prompts routed there: the router names each prompt's prefix blocks), and prefill the rest.
A waiting request the engine preempted comes with what the engine's own prefix cache holds of it (its snapshot
reports its hit and where its blocks sit in the free queue): those figures replace the guess.

An instance whose sidecar has no eq. 12 fit yet (a new replica, a replaced pod: its engine has executed too few
steps) is replayed with the coefficients of a calibrated peer — the same model on an engine of the same settings and
about the same KV cache, so the same hardware — and says so in the estimate's reason: without it a latency-aware
policy would never send it the queries whose steps its sidecar needs to fit.

While the feed is cut off from Redis (`feed_cut_off`), snapshots cannot arrive however healthy the engines are: for
FEED_OUTAGE_GRACE_S beyond the usual limit the replay goes on from the last snapshot, aged forward, with the
dispatches the routers sent along since (LPS, with its rates measured over the last minute, would tell an instance
that took most of the recent traffic from one that did not by little else than an unbounded wait).

The estimator service (`bear.estimator.snapshot_feed`) resolves residents' remaining lengths before it adopts a
snapshot (`resident_lengths` gives the inputs, the `remaining` passed to `update_snapshot` the answers), so that
adopting a snapshot never waits on the predictor. An instance id the estimator does not know is answered NONE.

A snapshot's times must be numbers no more than MAX_CLOCK_AHEAD_S ahead of the estimator's clock (`time_fault`): one
taken or read in the future would pass for newer than every later snapshot, and never age. Snapshots are ordered by
`taken_at_s`, which survives engine restarts (`supersedes`); one held that was taken ahead of the estimator's clock
gives way to a greater sequence number too.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from bear.core.batch_time import BatchFeatures, BatchTimeCoefficients
from bear.core.lps import LpsParameters, lps_ttft_s
from bear.core.prefill_throughput import backlog_ttft_s, remaining_prefill_tokens
from bear.core.reference import prefix_cache_hit
from bear.core.replay import PreparedArrivals, PreparedState, Target, estimate_many, prepare, prepare_arrivals
from bear.core.result import Infeasibility, ReplayStatus, explain, refused_prompt
from bear.core.state import Arrival, InvalidState, Query, ResidentRequest, check_engine
from bear.core.wire import engine_from_proto, state_from_snapshot
from bear.estimator.prefix_index import PrefixIndex
from bear.estimator.remaining import catalogue_name
from bear.v1 import snapshot_pb2

# E[remaining output tokens] of residents of one model: (model, predicted output tokens at dispatch, tokens generated,
# max_tokens with 0 for none), arrays of equal length -> array (e.g. Predictor.expected_remaining_tokens_many).
RemainingTokens = Callable[[str, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
# by model: (requests, predicted length, generated tokens with those in flight, max_tokens, tokens in flight)
_ResidentGroups = dict[str, tuple[list[snapshot_pb2.RequestState], np.ndarray, np.ndarray, np.ndarray, np.ndarray]]

MAX_CLOCK_AHEAD_S = 5.0  # how far a snapshot's times may be ahead of the estimator's clock (hosts' clock skew)
PEER_KV_BLOCKS_TOLERANCE = 0.1  # a peer's KV cache may differ by this fraction (the same GPU and memory share)
FEED_OUTAGE_GRACE_S = 10.0  # snapshots this much older than the limit still replay while Redis is unreachable
# A replayed time beyond this (~30 years) comes of coefficients or a speed ratio no engine has (times overflow), not
# of any queue: no estimate.
MAX_REPLAYED_S = 1e9
DISPATCH_TRANSIT_S = 0.5  # a routed request reaches the engine's queue within this (client, API server, tokenising)


class Method(enum.StrEnum):
    REPLAY = "replay"  # the BEA replay of the instance's snapshot
    LPS = "lps"  # closed form (eq. 13-15): no usable snapshot
    NONE = "none"  # nothing to estimate from


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A query a router sent to an instance."""

    request_id: str
    instance_id: str
    model: str
    dispatched_at_s: float
    num_prompt_tokens: int
    predicted_output_tokens: float  # the predictor's mean length
    max_tokens: int | None = None  # the request's max_tokens, where the router was given it
    prefix_hashes: bytes = b""  # the prompt's prefix blocks (bear.common.prefix_blocks), where the router had its text


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the estimator knows of an instance's speed."""

    coefficients: BatchTimeCoefficients
    prefill_tokens_per_s: float | None = None  # eq. 8's θ
    lps: LpsParameters | None = None


@dataclass(frozen=True, slots=True)
class TtftEstimate:
    instance_id: str
    ttft_s: float | None  # None: unknown; math.inf: the query can never be served there (LPS: the wait is unbounded)
    method: Method
    snapshot_age_s: float | None = None
    num_batches: int = 0
    lower_bound: bool = False  # the replay stopped at its horizon: the TTFT is at least this
    reason: str = ""
    prefill_tps_ttft_s: float | None = None  # eq. 8 on the same snapshot, for the prefill-throughput ablation
    cached_tokens: int = 0  # the query's prompt tokens the replay took as found in the prefix cache
    idle_s: float | None = None  # the engine had no work for this long at the query's arrival (None: it had some)


class _Dispatches:
    """An instance's dispatches by request id, and in the order of their dispatch times (the replay wants those made
    since a snapshot; expiry wants the oldest): each Estimate reads only the few made since the snapshot, however many
    the instance was sent within the time they are kept."""

    __slots__ = ("by_id", "_times", "_ids", "changes")

    def __init__(self) -> None:
        self.by_id: dict[str, Dispatch] = {}
        self._times: list[float] = []  # ascending
        self._ids: list[str] = []  # aligned with _times
        self.changes = 0  # changes but for new dispatches added last (`since(..., start)`): one moved, expired

    def __len__(self) -> int:
        """Entries in dispatch order (a re-recorded dispatch's old one included until it expires)."""
        return len(self._times)

    def add(self, dispatch: Dispatch) -> bool:
        """Keeps the dispatch (replacing one of the same request id made at another time); whether its id is new."""
        known = self.by_id.get(dispatch.request_id)
        if known is not None and known.dispatched_at_s == dispatch.dispatched_at_s:
            return False  # the same dispatch again (routers send their latest along with calls); kept as it is now
        self.by_id[dispatch.request_id] = dispatch
        at = bisect.bisect_right(self._times, dispatch.dispatched_at_s)  # nearly always the end
        self._times.insert(at, dispatch.dispatched_at_s)
        self._ids.insert(at, dispatch.request_id)
        if known is not None or at < len(self._times) - 1:
            self.changes += 1
        return known is None

    def since(self, after_s: float, start: int = 0) -> Iterator[Dispatch]:
        """Dispatches made after `after_s`, in dispatch order; from entry `start` on (`len` before dispatches were
        added, with no change between: the ones added since)."""
        for at in range(max(start, bisect.bisect_right(self._times, after_s)), len(self._times)):
            dispatch = self.by_id.get(self._ids[at])
            if dispatch is not None and dispatch.dispatched_at_s == self._times[at]:  # not since re-recorded
                yield dispatch

    def expire(self, before_s: float) -> None:
        """Forgets dispatches made before `before_s`."""
        end = bisect.bisect_left(self._times, before_s)
        for at in range(end):
            dispatch = self.by_id.get(self._ids[at])
            if dispatch is not None and dispatch.dispatched_at_s == self._times[at]:
                del self.by_id[self._ids[at]]
        del self._times[:end], self._ids[:end]
        if end:
            self.changes += 1


@dataclass(frozen=True, slots=True)
class _Omitted:
    """The waiting requests a snapshot leaves out (the snapshotter writes the head of a queue longer than its rows)."""

    count: int
    tokens_each: int | None  # what each is taken to prefill: the written waiting rows' mean (None: none written)

    @staticmethod
    def of(snapshot: snapshot_pb2.InstanceSnapshot) -> _Omitted | None:
        if not snapshot.num_omitted_waiting:
            return None
        written = [r.num_prompt_tokens + r.num_output_tokens for r in snapshot.waiting]  # a preempted one recomputes
        return _Omitted(snapshot.num_omitted_waiting, max(1, round(sum(written) / len(written))) if written else None)


@dataclass(slots=True)
class _Instance:
    model: str
    snapshot: snapshot_pb2.InstanceSnapshot | None = None
    prepared: PreparedState | None = None
    omitted: _Omitted | None = None  # waiting requests `snapshot` leaves out, if it leaves out any
    pending_decode_tokens: float = 0.0  # Σ residents' remaining output tokens in `prepared`
    prefill_backlog_tokens: int = 0  # Σ residents' remaining prefill tokens in `prepared` (eq. 8)
    step_in_progress: InProgress | None = None  # of `snapshot`
    calibration: Calibration | None = None
    dispatches: _Dispatches = field(default_factory=_Dispatches)
    prefixes: PrefixIndex = field(default_factory=PrefixIndex)  # what its prefix cache likely holds
    arrivals: _Arrivals | None = None  # the dispatches since `prepared`, as the last Estimate replayed them
    refusal: str = ""  # why its latest snapshot was refused, if it was (cleared when one is adopted)
    # (snapshot, version of `dispatches` and model, its residents by model) from `resident_lengths`, to its adoption
    resident_groups: tuple[snapshot_pb2.InstanceSnapshot, tuple[int, int, str], _ResidentGroups] | None = None


@dataclass(slots=True)
class _Arrivals:
    """An instance's dispatches since its snapshot as arrivals for the replay, checked and converted once: between
    two snapshots every Estimate replays the same ones, plus those dispatched since the last. Valid while the
    snapshot, the cut-off time, the dispatches (but for new ones added last) and the prefix account (but for new
    prompts) stay as they were."""

    prepared: PreparedState
    after_s: float  # dispatches made after this are arrivals
    changes: int  # the dispatches' `changes` when read
    forgotten: int  # the prefix account's `forgotten` when read
    read: int  # the dispatches' entries read
    prepared_arrivals: PreparedArrivals


class Estimator:
    def __init__(self, remaining: RemainingTokens, mean_output_tokens: Mapping[str, float], *,
                 max_snapshot_age_s: float = 2.0, dispatch_ttl_s: float = 600.0,
                 request_key: Callable[[str], str] = lambda engine_id: engine_id,
                 default_output_tokens: float = 256.0) -> None:
        self._remaining = remaining
        self._mean_output_tokens = dict(mean_output_tokens)  # a resident's length when its dispatch is unknown
        self._default_output_tokens = default_output_tokens  # the same, for a model without a mean
        self._max_age_s = max_snapshot_age_s
        self.feed_cut_off = False  # set by the feed while it cannot reach Redis
        self._dispatch_ttl_s = dispatch_ttl_s
        self._request_key = request_key  # the router's request id of an engine's request id
        self._instances: dict[str, _Instance] = {}

    def add_instance(self, instance_id: str, model: str) -> None:
        """Knows `instance_id` from now on (an instance already known keeps its state; a new model name is adopted)."""
        instance = self._instances.setdefault(instance_id, _Instance(model))
        if model:
            instance.model = model

    def remove_instance(self, instance_id: str) -> None:
        self._instances.pop(instance_id, None)

    def instance_ids(self) -> list[str]:
        """The known instances, in the order they became known."""
        return list(self._instances)

    def knows(self, instance_id: str) -> bool:
        return instance_id in self._instances

    def model(self, instance_id: str) -> str:
        return self._instance(instance_id).model

    def calibration(self, instance_id: str) -> Calibration | None:
        return self._instance(instance_id).calibration

    def has_dispatch(self, instance_id: str, request_id: str) -> bool:
        return request_id in self._instance(instance_id).dispatches.by_id

    def set_calibration(self, instance_id: str, calibration: Calibration) -> None:
        self._instance(instance_id).calibration = calibration

    def record_dispatch(self, dispatch: Dispatch) -> None:
        instance = self._instance(dispatch.instance_id)
        # Kept as long as dispatches are made, not only while snapshots come (none may be adopted for a while).
        instance.dispatches.expire(dispatch.dispatched_at_s - MAX_CLOCK_AHEAD_S - self._dispatch_ttl_s)
        if instance.dispatches.add(dispatch) and not self._refused_by_engine(instance, dispatch.num_prompt_tokens):
            output_tokens = min(dispatch.predicted_output_tokens, dispatch.max_tokens or math.inf)
            instance.prefixes.add(dispatch.prefix_hashes, output_tokens, dispatch.dispatched_at_s)

    @staticmethod
    def _refused_by_engine(instance: _Instance, num_prompt_tokens: int) -> bool:
        """Whether the instance's engine refuses a prompt this long at once (its cache then never holds it)."""
        return (instance.prepared is not None
                and refused_prompt(instance.prepared.state.engine, num_prompt_tokens) is not Infeasibility.NONE)

    def update_snapshot(self, snapshot: snapshot_pb2.InstanceSnapshot, now_s: float,
                        remaining: RemainingTokens | None = None) -> bool:
        """Adopts a newer snapshot (`supersedes`: an older one is ignored; the same state found current later
        refreshes its age) and prepares it for replays; `remaining` replaces the estimator's own for this snapshot.
        Returns whether the snapshot was adopted. A snapshot the replay cannot use, or whose times are not plausible
        at `now_s` (`time_fault`), raises InvalidState and leaves the previous one."""
        fault = time_fault(snapshot, now_s)
        if fault is not None:
            raise InvalidState(fault)
        instance = self._instance(snapshot.instance_id)
        instance.dispatches.expire(now_s - self._dispatch_ttl_s)  # also while the engine's state stands still
        current = instance.snapshot
        if current is not None and not supersedes(snapshot, current, now_s):
            if snapshot.taken_at_s == current.taken_at_s and snapshot.read_at_s > current.read_at_s:
                current.read_at_s = snapshot.read_at_s
            return False
        # Nothing of the instance changes before the engine's settings are known to be usable (a refused snapshot
        # leaves the previous one, and what the estimator holds with it, as they were).
        check_engine(engine_from_proto(snapshot.engine))
        if current is not None and engine_restarted(snapshot, current):
            instance.prefixes.clear()  # the engine started over: so did its prefix cache
        instance.prefixes.set_capacity(snapshot.engine.num_gpu_blocks, snapshot.engine.block_size)
        lengths = self._residents_remaining(instance, snapshot, remaining or self._remaining)
        self._forget_admitted_prefixes(instance, snapshot.running)
        state = state_from_snapshot(snapshot, lambda r: lengths[r.request_id])
        if snapshot.engine.enable_prefix_caching:
            state = dataclasses.replace(state, waiting=tuple(
                r if m.HasField("num_cached_tokens") else self._with_cache_hit(instance, snapshot.engine, r)
                for r, m in zip(state.waiting, snapshot.waiting, strict=True)))
        prepared = prepare(state)
        instance.snapshot, instance.prepared, instance.refusal = snapshot, prepared, ""
        instance.omitted = _Omitted.of(snapshot)
        instance.prefill_backlog_tokens = remaining_prefill_tokens(prepared.state)
        instance.step_in_progress = step_in_progress(snapshot)
        instance.pending_decode_tokens = float(sum(lengths.values()))
        return True

    def resident_lengths(self, snapshot: snapshot_pb2.InstanceSnapshot
                         ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """What `update_snapshot` will ask `RemainingTokens` for the snapshot's residents: by model, (predicted output
        tokens at dispatch, tokens generated, max_tokens with 0 for none)."""
        groups = self._resident_groups(self._instance(snapshot.instance_id), snapshot)
        return {model: (predicted, generated, max_tokens) for model, (_, predicted, generated, max_tokens, _)
                in groups.items()}

    def snapshot(self, instance_id: str) -> snapshot_pb2.InstanceSnapshot | None:
        return self._instance(instance_id).snapshot

    def pending_decode_tokens(self, instance_id: str) -> float | None:
        """Predicted output tokens still to come over the instance's residents (from its latest snapshot)."""
        instance = self._instance(instance_id)
        return None if instance.prepared is None else instance.pending_decode_tokens

    def estimate(self, query: Query, instance_ids: Iterable[str], now_s: float,
                 horizon_s: float = math.inf, prefix_hashes: bytes = b"") -> list[TtftEstimate]:
        """One estimate per instance for `query` arriving at `now_s` (replays in one call into the compiled core);
        `prefix_hashes`: its prompt's prefix blocks, for the part each instance's prefix cache likely holds."""
        ids = list(instance_ids)
        max_age_s = self._max_age_s + (FEED_OUTAGE_GRACE_S if self.feed_cut_off else 0.0)
        replayable, targets, ages = [], [], []
        estimates: dict[str, TtftEstimate] = {}
        for instance_id in ids:
            if instance_id not in self._instances:
                estimates[instance_id] = TtftEstimate(instance_id, None, Method.NONE, reason="unknown instance")
                continue
            instance = self._instances[instance_id]
            snapshot, age = instance.snapshot, None
            if snapshot is not None:
                # An idle engine writes nothing new: its state is as old as the last time it was found current. A
                # snapshot ahead of this clock (the engine's host's clock ahead, within MAX_CLOCK_AHEAD_S) is new.
                age = max(0.0, now_s - max(snapshot.taken_at_s, snapshot.read_at_s))
            calibration, borrowed_from = instance.calibration, ""
            if calibration is None and snapshot is not None and age is not None and age <= max_age_s:
                borrowed_from, calibration = self._peer_calibration(instance_id, instance, snapshot)
            if snapshot is None or calibration is None or age is None or age > max_age_s:
                estimates[instance_id] = self._fallback(instance_id, instance, query, age, max_age_s)
                continue
            replayable.append((instance_id, calibration, borrowed_from))
            ages.append(age)
            cached = _cache_hit(instance, snapshot.engine, prefix_hashes, now_s, query.num_prompt_tokens)
            # the query arrives at the snapshot or after it, never before (a clock ahead by 4 s put it 4 s before,
            # and the replay's TTFT counted those 4 s)
            since_taken_s = max(0.0, now_s - snapshot.taken_at_s)
            targets.append(self._target(instance, calibration, snapshot, query, since_taken_s, cached))
        for (instance_id, calibration, borrowed_from), age, target, result in zip(
                replayable, ages, targets, _replay_each(query, targets, horizon_s), strict=True):
            if isinstance(result, InvalidState):
                estimates[instance_id] = TtftEstimate(instance_id, None, Method.NONE, age,
                                                      reason=f"cannot replay: {result}")
                continue
            instance = self._instances[instance_id]
            estimate = self._from_replay(instance_id, calibration, target, query, age, result)
            if (instance.omitted is not None and estimate.method is Method.REPLAY and not estimate.lower_bound
                    and estimate.ttft_s is not None and math.isfinite(estimate.ttft_s)):  # not where it never comes
                estimate = _behind_omitted(estimate, instance.omitted, target, query)
            if target.query_cached_tokens:
                estimate = dataclasses.replace(estimate, cached_tokens=target.query_cached_tokens)
            if _idle(target, instance):
                estimate = dataclasses.replace(estimate, idle_s=max(0.0, target.query_time_s))
            notes = [f"not calibrated yet: eq. 12 coefficients of {borrowed_from} (same model and engine)"] \
                if borrowed_from else []
            if age > self._max_age_s:
                notes.append(f"snapshot {age:.3f} s old, Redis unreachable: replayed forward from it")
            if notes:
                why = "; ".join(notes)
                estimate = dataclasses.replace(estimate, reason=f"{why}; {estimate.reason}" if estimate.reason else why)
            estimates[instance_id] = estimate
        return [estimates[i] for i in ids]

    def _peer_calibration(self, instance_id: str, instance: _Instance, snapshot: snapshot_pb2.InstanceSnapshot
                          ) -> tuple[str, Calibration | None]:
        """The eq. 12 calibration (without the LPS measurements, which are the instance's own) of the first known
        calibrated instance that serves the same model on an engine of the same settings and about the same KV cache;
        ("", None) if there is none."""
        for other_id, other in self._instances.items():
            if (other_id != instance_id and other.calibration is not None and other.snapshot is not None
                    and other.model == instance.model and _same_engine(other.snapshot.engine, snapshot.engine)):
                return other_id, Calibration(other.calibration.coefficients, other.calibration.prefill_tokens_per_s)
        return "", None

    def _target(self, instance: _Instance, calibration: Calibration, snapshot: snapshot_pb2.InstanceSnapshot,
                query: Query, since_taken_s: float, query_cached_tokens: int) -> Target:
        assert instance.prepared is not None
        arrivals = self._arrivals(instance, snapshot)
        if not isinstance(arrivals, PreparedArrivals) or query.id in arrivals.id_set:
            arrivals = tuple(a for a in arrivals if a.request.id != query.id)  # not ahead of itself if dispatched
        in_progress = instance.step_in_progress
        return Target(instance.prepared, calibration.coefficients, query_time_s=since_taken_s,
                      in_flight_s=0.0 if in_progress is None else in_progress.remaining_s(calibration.coefficients),
                      arrivals=arrivals, query_cached_tokens=query_cached_tokens)

    def _arrivals(self, instance: _Instance, snapshot: snapshot_pb2.InstanceSnapshot
                  ) -> PreparedArrivals | tuple[Arrival, ...]:
        """The requests dispatched to the instance since its snapshot and not in it, as they join its queue; as a
        tuple where the replay cannot take them (its check then says why, for this instance alone)."""
        assert instance.prepared is not None
        after_s = max(snapshot.taken_at_s, snapshot.read_at_s - DISPATCH_TRANSIT_S)
        dispatches, known, memo = instance.dispatches, instance.arrivals, None
        if (known is not None and known.prepared is instance.prepared and known.after_s == after_s
                and known.changes == dispatches.changes and known.forgotten == instance.prefixes.forgotten):
            if known.read == len(dispatches):
                return known.prepared_arrivals
            memo = known
        new = [Arrival(d.dispatched_at_s - snapshot.taken_at_s,
                       ResidentRequest(d.request_id, d.num_prompt_tokens, 0, 0, max(1, round(d.predicted_output_tokens)),
                                       max_tokens=d.max_tokens,
                                       cached_tokens=_cache_hit(instance, snapshot.engine, d.prefix_hashes,
                                                                d.dispatched_at_s, d.num_prompt_tokens)))
               for d in dispatches.since(after_s, memo.read if memo is not None else 0)
               if d.request_id not in instance.prepared.id_set
               and 0 < d.num_prompt_tokens < snapshot.engine.max_model_len]  # vLLM rejects longer prompts at once
        try:
            prepared = prepare_arrivals(instance.prepared, new, memo.prepared_arrivals if memo is not None else None)
        except InvalidState:
            return (*(memo.prepared_arrivals if memo is not None else ()), *new)
        instance.arrivals = _Arrivals(instance.prepared, after_s, dispatches.changes, instance.prefixes.forgotten,
                                      len(dispatches), prepared)
        return prepared

    def _forget_admitted_prefixes(self, instance: _Instance, running: Iterable[snapshot_pb2.RequestState]) -> None:
        """Running requests' dispatches keep their prefix blocks no longer: those are in the instance's account, and
        only a request still to be admitted needs its own (up to 8 KiB each, for 600 s, at hundreds a second)."""
        by_id = instance.dispatches.by_id
        for request in running:
            key = self._request_key(request.request_id)
            dispatch = by_id.get(key)
            if dispatch is not None and dispatch.prefix_hashes:
                by_id[key] = dataclasses.replace(dispatch, prefix_hashes=b"")

    def _with_cache_hit(self, instance: _Instance, engine: snapshot_pb2.EngineConfig,
                        request: ResidentRequest) -> ResidentRequest:
        """A waiting resident the engine reports no hit for, with the part of its prompt the prefix cache likely
        holds when it is admitted, as the instance's account of routed prefixes has it."""
        dispatch = instance.dispatches.by_id.get(self._request_key(request.id))
        if dispatch is None or not dispatch.prefix_hashes:
            return request
        cached = _cache_hit(instance, engine, dispatch.prefix_hashes, dispatch.dispatched_at_s,
                            request.num_prompt_tokens)
        return dataclasses.replace(request, cached_tokens=cached) if cached else request

    def _from_replay(self, instance_id: str, calibration: Calibration, target: Target, query: Query, age: float,
                     result) -> TtftEstimate:  # noqa: ANN001 - bear.core.result.ReplayResult
        prefill_tps = None
        if calibration.prefill_tokens_per_s:
            prefill_tps = backlog_ttft_s(self._instances[instance_id].prefill_backlog_tokens,
                                         query.num_prompt_tokens, calibration.prefill_tokens_per_s)
        if result.status is ReplayStatus.FIRST_TOKEN:
            ttft, lower = result.ttft_s, False
        elif result.status is ReplayStatus.EXCEEDS_HORIZON:
            ttft, lower = result.elapsed_s, True
        else:
            ttft, lower = math.inf, False
        if result.status is not ReplayStatus.INFEASIBLE and not ttft <= MAX_REPLAYED_S:
            return TtftEstimate(instance_id, None, Method.NONE, age, result.num_batches,
                                reason=f"cannot replay: the batch-time model gives {ttft} s, more than "
                                       f"{MAX_REPLAYED_S:g} s ({calibration.coefficients})",
                                prefill_tps_ttft_s=prefill_tps)
        return TtftEstimate(instance_id, ttft, Method.REPLAY, age, result.num_batches, lower, result.reason,
                            prefill_tps)

    def _fallback(self, instance_id: str, instance: _Instance, query: Query, age: float | None,
                  max_age_s: float) -> TtftEstimate:
        why = "no snapshot" if age is None else f"snapshot {age:.3f} s old" if age > max_age_s else "not calibrated"
        if instance.refusal and why != "not calibrated":  # e.g. a clock more than MAX_CLOCK_AHEAD_S ahead
            why = f"{why} (its latest snapshot was refused: {instance.refusal})"
        if instance.prepared is not None:  # an engine's settings say, whatever its state, which prompts it refuses
            state = instance.prepared.state
            refused = refused_prompt(state.engine, query.num_prompt_tokens)
            if refused is not Infeasibility.NONE:
                return TtftEstimate(instance_id, math.inf, Method.NONE, age,
                                    reason=f"{why}: {explain(refused, query.id, state, query, math.inf)}")
        calibration = instance.calibration
        if calibration is not None and calibration.lps is not None:
            return TtftEstimate(instance_id, lps_ttft_s(calibration.lps, query.num_prompt_tokens), Method.LPS, age,
                                reason=f"{why}: LPS closed form")
        return TtftEstimate(instance_id, None, Method.NONE, age, reason=f"{why}, no LPS parameters")

    def _residents_remaining(self, instance: _Instance, snapshot: snapshot_pb2.InstanceSnapshot,
                             remaining: RemainingTokens) -> dict[str, int]:
        """Each resident's expected output tokens still to come, the token in flight included (at least 1)."""
        lengths: dict[str, int] = {}
        groups = self._resident_groups(instance, snapshot)
        instance.resident_groups = None
        for model, (group, predicted, generated, max_tokens, in_flight) in groups.items():
            expected = np.asarray(remaining(model, predicted, generated, max_tokens), dtype=np.float64) + in_flight
            if not np.isfinite(expected).all():
                raise ValueError(f"remaining output lengths of model {model!r} are not all finite numbers")
            rounded = np.maximum(np.rint(expected), 1).astype(np.int64)  # half to even, as round()
            lengths.update(zip((r.request_id for r in group), rounded.tolist(), strict=True))
        return lengths

    def _resident_groups(self, instance: _Instance, snapshot: snapshot_pb2.InstanceSnapshot) -> _ResidentGroups:
        """The snapshot's residents by model: (requests, predicted length, generated tokens with those in flight,
        max_tokens, tokens in flight). Kept from `resident_lengths` to the snapshot's adoption (a snapshot a step, all
        its residents) while the instance's dispatches and model stay as they were."""
        version = (instance.dispatches.changes, len(instance.dispatches), instance.model)
        kept = instance.resident_groups
        if kept is not None and kept[0] is snapshot and kept[1] == version:
            return kept[2]
        by_model: dict[str, list[tuple[snapshot_pb2.RequestState, float]]] = {}
        for request in (*snapshot.running, *snapshot.waiting):
            dispatch = instance.dispatches.by_id.get(self._request_key(request.request_id))
            model = dispatch.model if dispatch is not None else instance.model
            predicted = (dispatch.predicted_output_tokens if dispatch is not None
                         else self._mean_output_tokens.get(catalogue_name(model, self._mean_output_tokens),
                                                           self._default_output_tokens))
            by_model.setdefault(model, []).append((request, predicted))
        groups = {}
        for model, group in by_model.items():
            in_flight = np.array([r.num_output_placeholders for r, _ in group], dtype=np.float64)
            generated = np.array([r.num_output_tokens for r, _ in group], dtype=np.float64) + in_flight
            groups[model] = ([r for r, _ in group], np.array([p for _, p in group], dtype=np.float64), generated,
                             np.array([r.max_tokens for r, _ in group], dtype=np.float64), in_flight)
        instance.resident_groups = (snapshot, version, groups)
        return groups

    def note_refused(self, instance_id: str, why: str) -> None:
        """A snapshot of the instance was refused (its clock, its rows): estimates without a replay say why."""
        instance = self._instances.get(instance_id)
        if instance is not None:
            instance.refusal = why

    def _instance(self, instance_id: str) -> _Instance:
        try:
            return self._instances[instance_id]
        except KeyError:
            raise KeyError(f"unknown instance {instance_id!r}") from None


def _cache_hit(instance: _Instance, engine: snapshot_pb2.EngineConfig, prefix_hashes: bytes, before_s: float,
               prompt_tokens: int) -> int:
    """The prompt tokens a request routed at `before_s` finds in the instance's prefix cache as the replay counts them
    (whole blocks, never the last token), by the instance's account; 0 on an engine without prefix caching."""
    if not engine.enable_prefix_caching or not prefix_hashes:
        return 0
    return prefix_cache_hit(instance.prefixes.cached_tokens(prefix_hashes, before_s), prompt_tokens, engine.block_size)


def _behind_omitted(estimate: TtftEstimate, omitted: _Omitted, target: Target, query: Query) -> TtftEstimate:
    """The estimate of a query that waits, in the queue's order, behind the waiting requests the snapshot left out as
    well: their prefill (each the written waiting rows' mean, or the query's prompt where none is written), in steps
    that fill the token budget, added to the replay's TTFT. A lower bound: the residents' decodes that share those
    steps are not counted."""
    tokens_each = omitted.tokens_each or query.num_prompt_tokens
    tokens = omitted.count * tokens_each
    features = BatchFeatures(tokens, 0, 0, omitted.count * (tokens_each * (tokens_each + 1) // 2))
    extra_s = target.coefficients.time_s(features, -(-tokens // target.prepared.state.engine.max_num_batched_tokens))
    why = (f"{omitted.count} waiting requests the snapshot leaves out are ahead of the query: their prefill "
           f"({tokens_each} tokens each) adds {extra_s * 1000:.3f} ms, at least")
    return dataclasses.replace(estimate, ttft_s=estimate.ttft_s + extra_s, lower_bound=True,  # type: ignore[operator]
                               reason=f"{estimate.reason}; {why}" if estimate.reason else why)


def _idle(target: Target, instance: _Instance) -> bool:
    """Whether the query finds the engine without work: its snapshot holds no request and no step in progress, and
    no dispatch is on its way. An engine writes its state after every step, so it has then been idle since the
    snapshot was taken (waking it costs time no batch accounts for: the router learns that apart, per instance)."""
    return not target.prepared.ids and not target.arrivals and instance.step_in_progress is None


def _same_engine(a: snapshot_pb2.EngineConfig, b: snapshot_pb2.EngineConfig) -> bool:
    """Engines whose steps take the same time for the same batch: the same scheduling settings, and KV caches within
    PEER_KV_BLOCKS_TOLERANCE of each other (the same GPU and memory share; vLLM sizes the cache from what is free)."""
    scheduling = ("max_num_batched_tokens", "max_num_seqs", "block_size", "max_model_len", "async_scheduling")
    if any(getattr(a, name) != getattr(b, name) for name in scheduling):
        return False
    larger = max(a.num_gpu_blocks, b.num_gpu_blocks)
    return larger > 0 and abs(a.num_gpu_blocks - b.num_gpu_blocks) <= PEER_KV_BLOCKS_TOLERANCE * larger


def _replay_each(query: Query, targets: list[Target], horizon_s: float) -> list:  # ReplayResult | InvalidState
    """All targets in one call; if one of them cannot be replayed (InvalidState), each alone, so that one bad target
    does not cost the others their estimate."""
    try:
        return estimate_many(query, targets, horizon_s=horizon_s)
    except InvalidState:
        results: list = []
        for target in targets:
            try:
                results.extend(estimate_many(query, [target], horizon_s=horizon_s))
            except InvalidState as error:
                results.append(error)
        return results


def time_fault(snapshot: snapshot_pb2.InstanceSnapshot, now_s: float) -> str | None:
    """Why the snapshot's times cannot be those of a state the estimator's clock has seen by `now_s` (None: they
    can): `taken_at_s` or `read_at_s` not a finite number, or more than MAX_CLOCK_AHEAD_S ahead of `now_s`."""
    for name, at_s in (("taken_at_s", snapshot.taken_at_s), ("read_at_s", snapshot.read_at_s)):
        if not math.isfinite(at_s):
            return f"{name} is {at_s!r}"
        if at_s > now_s + MAX_CLOCK_AHEAD_S:
            return f"{name} is {at_s - now_s:.3f} s ahead of the estimator's clock (at most {MAX_CLOCK_AHEAD_S:g} s)"
    return None


def engine_restarted(snapshot: snapshot_pb2.InstanceSnapshot, current: snapshot_pb2.InstanceSnapshot) -> bool:
    """Whether `snapshot` comes from another run of the engine than `current` (newer): its start time differs, or,
    where a sidecar does not say it, its steps or states are counted from a lower number (they start from 0)."""
    if snapshot.engine_started_at_s and current.engine_started_at_s:
        return snapshot.engine_started_at_s != current.engine_started_at_s
    return (snapshot.next_step_index < current.next_step_index
            or snapshot.sequence_number < current.sequence_number)


def supersedes(snapshot: snapshot_pb2.InstanceSnapshot, current: snapshot_pb2.InstanceSnapshot,
               now_s: float) -> bool:
    """Whether `snapshot` is newer than `current`, the one held at `now_s`: taken later (the order across engine
    restarts, whose sequence numbers may start over); or, while `current` was taken ahead of the estimator's clock
    (a skewed clock), later by the engine's own count (a greater sequence number); or whatever comes once `current`
    is more than MAX_CLOCK_AHEAD_S ahead or not a number (the estimator's clock went back), so that no snapshot held
    can shut out those that follow."""
    if snapshot.taken_at_s > current.taken_at_s:
        return True
    ahead_s = current.taken_at_s - now_s
    if not math.isfinite(ahead_s) or ahead_s > MAX_CLOCK_AHEAD_S:
        return True
    return ahead_s > 0 and snapshot.sequence_number > current.sequence_number


@dataclass(frozen=True, slots=True)
class InProgress:
    """The step executing when a snapshot was taken: its eq. 12 features (summed once per snapshot: a step holds up to
    max_num_seqs requests, and every Estimate call asks for its remaining time) and how long it had run then."""

    features: BatchFeatures
    elapsed_s: float  # from its execution start to the snapshot's taken_at_s

    def remaining_s(self, coefficients: BatchTimeCoefficients) -> float:
        """How long it still runs after the snapshot was taken, by eq. 12 (at least 0)."""
        return max(0.0, coefficients.time_s(self.features) - self.elapsed_s)


def step_in_progress(snapshot: snapshot_pb2.InstanceSnapshot) -> InProgress | None:
    """The step executing when the snapshot was taken (async scheduling: already counted in the state); None when
    none was executing."""
    step = snapshot.step_in_progress
    if (not step.entries or step.step_index >= snapshot.next_step_index
            or not 0 < step.execution_started_at_s < math.inf):
        return None
    features = BatchFeatures.of_batch([(e.num_prefill_tokens, e.num_decode_tokens, e.num_context_tokens)
                                       for e in step.entries])
    return InProgress(features, max(0.0, snapshot.taken_at_s - step.execution_started_at_s))
