"""The replay facade: one entry point over the compiled core (the production engine) and the Python reference.

    prepared = prepare(state)                                  # once per snapshot: checks and converts it
    result = estimate(prepared, query, coefficients, horizon_s=slo_s + margin_s)
    results = estimate_many(query, [Target(prepared_a, coefs_a), Target(prepared_b, coefs_b)])   # GIL released
    arrivals = prepare_arrivals(prepared_a, [Arrival(...), ...])   # checked and converted once, extended as more come
    results = estimate_many(query, [Target(prepared_a, coefs_a, arrivals=arrivals)])

The clock starts when the state was taken. A query (or an `Arrival` dispatched since) arriving `query_time_s` later
joins the first step scheduled at or after it; under async scheduling the step executing when the state was taken
still runs for `in_flight_s`. `replay(..., engine=ReplayEngine.REFERENCE)` runs the step-by-step Python reference
instead; both give identical batches, first-token batch and time.

Prefix caching: each resident request and arrival carries `cached_tokens`; the query's cache hit depends on the
instance, so it is given per instance: `Target.query_cached_tokens`, or `query_cached_tokens=` of `estimate` and
`replay` (the prompt tokens that instance's prefix cache holds when the query is admitted; default 0).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from bear.core import _native
from bear.core.batch_time import BatchFeatures, BatchTimeCoefficients
from bear.core.reference import replay_reference
from bear.core.result import Infeasibility, ReplayResult, ReplayStatus, ScheduledBatch, explain
from bear.core.state import (
    Arrival,
    EngineConfig,
    InstanceState,
    InvalidState,
    Query,
    ResidentRequest,
    check_arrivals,
    check_query,
    check_query_cached_tokens,
    check_state,
)

DEFAULT_MAX_STEPS = 1_000_000


class ReplayEngine(enum.StrEnum):
    NATIVE = "native"  # the compiled core: event-driven, closed-form runs of quiet steps
    REFERENCE = "reference"  # the readable Python reference, step by step


@dataclass(frozen=True, slots=True, eq=False)
class PreparedState:
    """An instance state checked and converted for the compiled core; estimate against it as often as needed."""

    state: InstanceState
    native: _native.PreparedState
    ids: tuple[str, ...]  # running, then waiting
    id_set: frozenset[str]


@dataclass(frozen=True, slots=True, eq=False)
class PreparedArrivals:
    """Arrivals checked against a prepared state and converted for the compiled core (`prepare_arrivals`): an
    estimator replays one instance for many queries between two snapshots, with the same requests dispatched since,
    and converts each of them once. Iterates and counts as its `arrivals`."""

    prepared: PreparedState
    arrivals: tuple[Arrival, ...]
    id_set: frozenset[str]
    native: tuple[_native.Arrivals, ...]

    def __len__(self) -> int:
        return len(self.arrivals)

    def __iter__(self) -> Iterator[Arrival]:
        return iter(self.arrivals)


@dataclass(frozen=True, slots=True)
class Target:
    """One instance to estimate a query against: its prepared state, coefficients and timing (see module doc)."""

    prepared: PreparedState
    coefficients: BatchTimeCoefficients
    query_time_s: float = 0.0
    in_flight_s: float = 0.0
    arrivals: tuple[Arrival, ...] | PreparedArrivals = ()  # PreparedArrivals: of this `prepared`
    query_cached_tokens: int = 0  # prompt tokens of the query this instance's prefix cache holds when it is admitted


_ENGINE_FIELDS = tuple(field.name for field in dataclasses.fields(EngineConfig))
LONGER_THAN_ANY_ENGINE = 2**40  # tokens: more than any max_model_len the replay takes (MAX_ENGINE_TOKENS)
_ENGINE_COUNTS = ("max_num_batched_tokens", "max_num_seqs", "block_size", "num_gpu_blocks", "max_model_len",
                  "long_prefill_token_threshold")
# Counts beyond it may wrap the compiled core's 64-bit sums (an instance's blocks, a request's tokens) past its checks.
_SAFE_COUNT = 1 << 40


def prepare(state: InstanceState) -> PreparedState:
    """Checks `state` (raises InvalidState) and converts it once for the compiled core.

    The compiled core checks what `check_state` does but the requests' ids and max_tokens, on counts its 64-bit sums
    hold (a snapshot a step: this runs hundreds of times a second); `check_state` runs where those do not settle it,
    and to name a fault the core found: the same states pass and fail, with the same errors, as with `check_state`
    first."""
    ids = tuple(r.id for r in state.running) + tuple(r.id for r in state.waiting)
    id_set = frozenset(ids)
    try:
        running, waiting = _table(state.running), _table(state.waiting)
        if not _core_checks_suffice(state, running, waiting, len(id_set) == len(ids)):
            check_state(state)
        engine = _native.EngineConfig()
        for name in _ENGINE_FIELDS:
            setattr(engine, name, getattr(state.engine, name))
        native = _native.PreparedState(engine, state.free_blocks, running, waiting, state.shared_blocks)
    except InvalidState:
        raise
    except (ValueError, OverflowError, TypeError):
        check_state(state)  # raises InvalidState naming the fault, where it sees one
        raise
    return PreparedState(state, native, ids, id_set)


def _core_checks_suffice(state: InstanceState, running: np.ndarray, waiting: np.ndarray, unique_ids: bool) -> bool:
    """Whether the compiled core's checks of `state` are `check_state`'s: its ids unique, no request at or past its
    max_tokens (the core reads 0 and below as none), every count far inside 64 bits."""
    engine = state.engine
    counts = [getattr(engine, name) for name in _ENGINE_COUNTS] + [state.free_blocks, state.shared_blocks]
    return (unique_ids and -_SAFE_COUNT < min(counts) and max(counts) < _SAFE_COUNT
            and all(not t.size or (-_SAFE_COUNT < t.min() and t.max() < _SAFE_COUNT) for t in (running, waiting))
            and not any(r.max_tokens is not None and not r.num_output_tokens < r.max_tokens
                        for r in (*state.running, *state.waiting)))


def prepare_arrivals(prepared: PreparedState, arrivals: Sequence[Arrival],
                     after: PreparedArrivals | None = None) -> PreparedArrivals:
    """Checks `arrivals` against `prepared` (raises InvalidState) and converts them once for the compiled core;
    `after`: arrivals of the same state, already prepared, that come first (only the new ones are checked and
    converted)."""
    if after is not None and after.prepared is not prepared:
        raise InvalidState("arrivals prepared for another state cannot be extended with this one's")
    if arrivals:
        check_arrivals(arrivals, prepared.state.engine,
                       prepared.id_set | after.id_set if after is not None else prepared.id_set)
    new_ids = {a.request.id for a in arrivals}
    if after is None:
        return PreparedArrivals(prepared, tuple(arrivals), frozenset(new_ids), tuple(_native_arrivals(arrivals)))
    return PreparedArrivals(prepared, after.arrivals + tuple(arrivals), after.id_set | new_ids,
                            after.native + tuple(_native_arrivals(arrivals)))


def _table(requests: Sequence[ResidentRequest]) -> np.ndarray:
    rows = [
        (r.num_prompt_tokens, r.num_computed_tokens, r.num_output_tokens, _length(r.remaining_output_tokens),
         r.num_allocated_blocks, _length(r.max_tokens or 0), r.num_output_placeholders, r.cached_tokens,
         r.num_evictable_blocks, r.num_free_blocks_ahead)
        for r in requests
    ]
    return np.array(rows, dtype=np.int64).reshape(len(rows), 10)


def estimate(
    prepared: PreparedState,
    query: Query,
    coefficients: BatchTimeCoefficients,
    *,
    horizon_s: float = math.inf,
    query_time_s: float = 0.0,
    in_flight_s: float = 0.0,
    arrivals: Sequence[Arrival] | PreparedArrivals = (),
    query_cached_tokens: int = 0,
    record_batches: bool = False,
    shortcuts: bool = True,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> ReplayResult:
    """Replays `prepared` with the compiled core until the query's first token (or the horizon)."""
    if not isinstance(arrivals, PreparedArrivals):
        arrivals = tuple(arrivals)
    target = Target(prepared, coefficients, query_time_s, in_flight_s, arrivals, query_cached_tokens)
    _check(target, query)
    native = _native.replay(prepared.native, _native_query(query, query_cached_tokens),
                            _native_coefficients(coefficients), horizon_s, record_batches, shortcuts, max_steps,
                            query_time_s, in_flight_s, _converted_arrivals(arrivals))
    return _result(native, target, query, horizon_s, record_batches)


def estimate_many(query: Query, targets: Sequence[Target], *, horizon_s: float = math.inf) -> list[ReplayResult]:
    """Estimates one query against many instances in one call into the compiled core (GIL released)."""
    for target in targets:
        _check(target, query)
    natives = _native.replay_each(
        [_native.Candidate(t.prepared.native, _native_coefficients(t.coefficients), t.query_time_s, t.in_flight_s,
                           _converted_arrivals(t.arrivals), t.query_cached_tokens) for t in targets],
        _native_query(query),
        horizon_s,
    )
    return [_result(native, target, query, horizon_s) for native, target in zip(natives, targets, strict=True)]


def replay(
    state: InstanceState,
    query: Query,
    coefficients: BatchTimeCoefficients,
    *,
    horizon_s: float = math.inf,
    query_time_s: float = 0.0,
    in_flight_s: float = 0.0,
    arrivals: Sequence[Arrival] = (),
    query_cached_tokens: int = 0,
    record_batches: bool = False,
    engine: ReplayEngine = ReplayEngine.NATIVE,
    shortcuts: bool = True,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> ReplayResult:
    """Replays `state` once with the chosen engine (raises InvalidState on an inconsistent state or query)."""
    if engine is ReplayEngine.NATIVE:
        return estimate(prepare(state), query, coefficients, horizon_s=horizon_s, query_time_s=query_time_s,
                        in_flight_s=in_flight_s, arrivals=arrivals, query_cached_tokens=query_cached_tokens,
                        record_batches=record_batches, shortcuts=shortcuts, max_steps=max_steps)
    check_state(state)
    check_query(query, state, arrivals, query_cached_tokens)
    _check_timing(query_time_s, in_flight_s)
    result = replay_reference(state, query, coefficients, horizon_s=horizon_s, max_steps=max_steps,
                              query_time_s=query_time_s, in_flight_s=in_flight_s, arrivals=arrivals,
                              query_cached_tokens=query_cached_tokens)
    return result if record_batches else dataclasses.replace(result, batches=())


def _check(target: Target, query: Query) -> None:
    if query.num_prompt_tokens < 1 or query.output_tokens < 1:
        raise InvalidState("query: num_prompt_tokens and output_tokens must be >= 1")
    if query.id in target.prepared.id_set:
        raise InvalidState(f"query.id {query.id!r} is also a resident request's id")
    check_query_cached_tokens(target.query_cached_tokens, query)
    _check_timing(target.query_time_s, target.in_flight_s)
    arrivals = target.arrivals
    if isinstance(arrivals, PreparedArrivals):
        if arrivals.prepared is not target.prepared:
            raise InvalidState("the target's arrivals were prepared for another state")
        if query.id in arrivals.id_set:
            raise InvalidState(f"query.id {query.id!r} is also an arrival's id")
    elif arrivals:
        check_arrivals(arrivals, target.prepared.state.engine, set(target.prepared.id_set) | {query.id})


def _check_timing(query_time_s: float, in_flight_s: float) -> None:
    if not (math.isfinite(query_time_s) and math.isfinite(in_flight_s) and in_flight_s >= 0):
        raise InvalidState("query_time_s must be finite and in_flight_s finite and >= 0")


def _native_query(query: Query, cached_tokens: int = 0) -> _native.Query:
    return _native.Query(_length(query.num_prompt_tokens), _length(query.output_tokens), cached_tokens)


def _length(tokens: int) -> int:
    """A length as the compiled core's 64-bit integers take it: any past max_model_len (at most MAX_ENGINE_TOKENS)
    acts alike, a prompt refused and an output ending there, so the longest are capped far inside 64 bits."""
    return min(tokens, LONGER_THAN_ANY_ENGINE)


def _converted_arrivals(arrivals: Sequence[Arrival] | PreparedArrivals) -> Sequence[_native.Arrivals]:
    return arrivals.native if isinstance(arrivals, PreparedArrivals) else _native_arrivals(arrivals)


def _native_arrivals(arrivals: Sequence[Arrival]) -> list[_native.Arrivals]:
    if not arrivals:
        return []
    return _native.arrivals(np.array([a.time_s for a in arrivals], dtype=np.float64),
                            _table([a.request for a in arrivals]))


_coefficient_cache: dict[BatchTimeCoefficients, _native.BatchTimeCoefficients] = {}


def _native_coefficients(coefficients: BatchTimeCoefficients) -> _native.BatchTimeCoefficients:
    native = _coefficient_cache.get(coefficients)
    if native is None:
        if len(_coefficient_cache) > 4096:  # instances recalibrate now and then; keep the cache bounded
            _coefficient_cache.clear()
        native = _native.BatchTimeCoefficients(coefficients.b0, coefficients.b1, coefficients.b2, coefficients.b3)
        _coefficient_cache[coefficients] = native
    return native


# Indexed by the compiled core's enum values (bear::Status, bear::Infeasibility).
_STATUS = (ReplayStatus.FIRST_TOKEN, ReplayStatus.EXCEEDS_HORIZON, ReplayStatus.INFEASIBLE)
_INFEASIBILITY = (Infeasibility.NONE, Infeasibility.PROMPT_TOO_LONG, Infeasibility.PROMPT_EXCEEDS_CACHE,
                  Infeasibility.STUCK, Infeasibility.STEP_LIMIT)


def _result(native: _native.Result, target: Target, query: Query, horizon_s: float,
            record_batches: bool = False) -> ReplayResult:
    status_value, infeasibility, blocking, first_token_batch, num_batches, num_steps, preemptions, time_s = (
        native.summary()
    )
    status = _STATUS[status_value]
    batches = _batches(native, target, query) if record_batches else ()
    if status is ReplayStatus.FIRST_TOKEN:
        return ReplayResult(status, first_token_batch, time_s, time_s, num_batches, num_steps, preemptions, "", batches)
    blocking_id = None if blocking < 0 else _names(target, query)[blocking]
    reason = explain(_INFEASIBILITY[infeasibility], blocking_id, target.prepared.state, query, horizon_s)
    return ReplayResult(status, None, None, time_s, num_batches, num_steps, preemptions, reason, batches)


def _names(target: Target, query: Query) -> tuple[str, ...]:
    """Request ids by the compiled core's indices: residents, arrivals, the query."""
    return (*target.prepared.ids, *(a.request.id for a in target.arrivals), query.id)


def _batches(native: _native.Result, target: Target, query: Query) -> tuple[ScheduledBatch, ...]:
    names = _names(target, query)
    return tuple(
        ScheduledBatch(
            tuple((names[index], tokens) for index, tokens in b.scheduled),
            BatchFeatures(b.num_prefill_tokens, b.num_decode_tokens, b.decode_context, b.prefill_attention),
            b.time_s,
        )
        for b in native.batches
    )
