"""The readable reference of the replay: vLLM V1's scheduler (0.32/0.33, FCFS) step by step.

`ReferenceScheduler` is also a steppable model of an engine (requests can be added between steps), which the
evaluation harness uses to simulate instances.

It follows `vllm/v1/core/sched/scheduler.py` closely and takes no shortcut; the compiled core (native/) must give the
same batches, first-token batch and time, and the parity tests hold it to that. One step is `schedule()` — RUNNING
requests first, in admission order, then WAITING ones in queue order, all under one token budget — followed by
`update_from_output()`: every request whose scheduled tokens reached its last known token samples one, and requests
reaching their length finish and free their KV blocks. Under async scheduling the output of step k is processed after
step k+1 has been scheduled (EngineCore.step_with_batch_queue with two batches in flight).

Prefix caching enters as an input: a request's `cached_tokens` (the query's `query_cached_tokens`) say how much of its
prompt the cache is expected to hold when it is admitted from the waiting queue (`prefix_cache_hit`). With
`enable_prefix_caching`, a request the replay preempts also resumes from its own blocks still cached: vLLM puts a
released request's full blocks at the back of its free queue (its last block first) and the others at the front, and
takes new blocks from the front, evicting what they cached. The replay follows, for each request it preempted, how
many free blocks are ahead of its released ones (`ahead`) and how many of those are gone (`evicted`); a waiting request
of the state whose own blocks are still cached (`num_evictable_blocks`, `num_free_blocks_ahead`: vLLM preempted it
before the state was taken) starts out so.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from bear.core.batch_time import BatchFeatures, BatchTimeCoefficients, is_decode
from bear.core.result import Infeasibility, ReplayResult, ReplayStatus, ScheduledBatch, explain, refused_prompt
from bear.core.state import Arrival, EngineConfig, InstanceState, Query, ResidentRequest

RUNNING, WAITING, FINISHED = "running", "waiting", "finished"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def prefix_cache_hit(cached_tokens: int, num_tokens: int, block_size: int) -> int:
    """Computed tokens a request admitted from the waiting queue starts with, as vLLM's get_computed_blocks finds
    them: the cached prefix in whole blocks, at most num_tokens - 1 (the last token is computed again to sample)."""
    return min(cached_tokens, num_tokens - 1) // block_size * block_size


@dataclass(slots=True, eq=False)  # identity: two requests with equal counts are still two requests
class SchedulerRequest:
    id: str
    prompt: int
    computed: int
    output: int
    placeholders: int
    stop_length: int  # output length at which it finishes
    max_tokens: int
    blocks: int
    where: str
    cached: int = 0  # prompt tokens the prefix cache holds at an admission from WAITING (ResidentRequest.cached_tokens)
    hashed: int = 0  # its full blocks vLLM has cached (prefix caching): as its latest scheduling found its tokens
    # Prefix caching, once the replay preempted it: its full blocks that others hold (kept) and that it released to
    # the back of the free queue, `ahead` free blocks before the first of them to go; `evicted` of those are gone.
    kept_hashed: int = 0
    hashed_freed: int = 0
    ahead: int = 0
    evicted: int = 0

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.output


@dataclass(slots=True)
class Step:
    scheduled: list[tuple[SchedulerRequest, int]] = field(default_factory=list)
    # (prefill tokens, decode tokens, context tokens) per scheduled request, in order: the step's composition.
    entries: list[tuple[int, int, int]] = field(default_factory=list)
    sampled: list[SchedulerRequest] = field(default_factory=list)

    @property
    def features(self) -> BatchFeatures:
        """Eq. 12 features of the step (exact integer sums over its entries)."""
        return BatchFeatures.of_batch(self.entries)
    preempted: bool = False
    doomed: SchedulerRequest | None = None  # preempted itself with nothing else running: it can never complete
    outputs_applied: int = 0  # sampled tokens processed in this step (async: the previous step's)
    finished: list[SchedulerRequest] = field(default_factory=list)  # reached their length in this step's update


class ReferenceScheduler:
    """vLLM's scheduling rules over one instance's state; requests can be added between steps."""

    def __init__(self, state: InstanceState) -> None:
        self.engine: EngineConfig = state.engine
        self.free_blocks = state.free_blocks
        self.shared_blocks = state.shared_blocks  # paid off by the first blocks released (InstanceState)
        self.running: list[SchedulerRequest] = [self._request(r, RUNNING) for r in state.running]
        self.waiting: deque[SchedulerRequest] = deque(self._request(r, WAITING) for r in state.waiting)
        # Async: requests that sample a token in the step in flight.
        self.in_flight: list[SchedulerRequest] = [r for r in self.running if r.placeholders > 0]
        self.num_preemptions = 0
        # Waiting with blocks of their own in the free queue (prefix caching on), in the order those go: the state's
        # (by their blocks' place in the queue), then those preempted here, in that order.
        self._resumable: list[SchedulerRequest] = sorted((r for r in self.waiting if r.hashed_freed),
                                                         key=lambda r: r.ahead)

    def add_request(self, request: ResidentRequest) -> SchedulerRequest:
        """A new request joins the back of the waiting queue (before the next step is scheduled)."""
        added = self._request(request, WAITING)
        self.waiting.append(added)
        return added

    def state(self) -> InstanceState:
        """The engine's state now, in vLLM's terms (remaining output tokens: up to each request's stop length)."""
        def resident(r: SchedulerRequest) -> ResidentRequest:
            cached, evictable, ahead = r.cached, 0, 0
            if r in self._resumable:
                cached = self._cached(r)
                evictable = r.hashed_freed - r.evicted
                ahead = max(min(r.ahead, self.free_blocks - evictable), 0) if evictable else 0
            return ResidentRequest(r.id, r.prompt, r.computed, r.output, max(r.stop_length - r.output, 1), r.blocks,
                                   r.max_tokens, r.placeholders, cached, evictable, ahead)

        return InstanceState(self.engine, self.free_blocks, tuple(map(resident, self.running)),
                             tuple(map(resident, self.waiting)), self.shared_blocks)

    def _request(self, r: ResidentRequest, where: str) -> SchedulerRequest:
        max_tokens = r.max_tokens if r.max_tokens is not None else self.engine.max_model_len - r.num_prompt_tokens
        # When the step in flight was scheduled, its output before was not in yet (async scheduling).
        known = r.num_prompt_tokens + r.num_output_tokens - (r.num_output_placeholders > 0 and r.num_output_tokens > 0)
        request = SchedulerRequest(
            r.id, r.num_prompt_tokens, r.num_computed_tokens, r.num_output_tokens, r.num_output_placeholders,
            r.stop_length(self.engine), max_tokens, r.num_allocated_blocks, where, r.cached_tokens,
            hashed=min(r.num_computed_tokens, known) // self.engine.block_size,
        )
        if r.num_evictable_blocks:  # its own blocks still cached (the state's): it resumes from what is left of them
            request.kept_hashed = r.cached_tokens // self.engine.block_size - r.num_evictable_blocks
            request.hashed_freed, request.ahead, request.cached = r.num_evictable_blocks, r.num_free_blocks_ahead, 0
        return request

    def step(self) -> Step:
        """One engine step: schedule, then process the outputs that are due (this step's, or the previous one's)."""
        step = self.schedule()
        if self.engine.async_scheduling:
            step.outputs_applied = self.process_outputs(self.in_flight, step.finished)
            self.in_flight = step.sampled
        else:
            step.outputs_applied = self.process_outputs(step.sampled, step.finished)
        return step

    def schedule(self) -> Step:
        # Invariant: no prefill or decode phases; each request gets min(tokens it lacks, budget left) tokens.
        step = Step()
        budget = self.engine.max_num_batched_tokens
        resident = len(self.running) + len(self.waiting)
        threshold = self.engine.long_prefill_token_threshold if resident > 1 else 0
        budget = self._schedule_running(step, budget, threshold)
        if not step.preempted:  # no admissions in a step that preempted
            self._schedule_waiting(step, budget, threshold)
        return step

    def _schedule_running(self, step: Step, budget: int, threshold: int) -> int:
        engine = self.engine
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if request.placeholders > 0 and request.computed + 2 - request.placeholders >= request.prompt + request.max_tokens:
                index += 1  # async: the step in flight already samples its last allowed token
                continue
            tokens = request.num_tokens + request.placeholders - request.computed
            if 0 < threshold < tokens:
                tokens = threshold
            tokens = min(tokens, budget, engine.max_model_len - request.computed - 1)
            if tokens <= 0:
                index += 1
                continue
            needed = max(_cdiv(min(request.computed + tokens, engine.max_model_len), engine.block_size) - request.blocks, 0)
            while needed > self.free_blocks:
                victim = self.running.pop()  # FCFS: the most recently admitted request
                self._preempt(victim)
                step.preempted = True
                if victim is request:  # it cannot be scheduled; stop scanning running requests
                    if not self.running:
                        step.doomed = request
                    return budget
            self._allocate(request, needed)
            self._add(step, request, tokens)
            budget -= tokens
            index += 1
        return budget

    def _schedule_waiting(self, step: Step, budget: int, threshold: int) -> None:
        engine = self.engine
        while budget > 0 and self.waiting and len(self.running) < engine.max_num_seqs:
            request = self.waiting[0]
            # A request starting from scratch first takes the cached part of its prompt (whole blocks): it starts with
            # those tokens computed, and its chunk attends to them as context. Blocks stay conservative: the admission
            # checks still reserve the whole sequence, and the request takes all its blocks, the cached ones too, from
            # the free pool (exact when no running request holds the cached blocks, which then sit in vLLM's free
            # queue; else vLLM takes fewer).
            hit = prefix_cache_hit(self._cached(request), request.num_tokens, engine.block_size) \
                if not request.computed else 0
            tokens = request.num_tokens - request.computed - hit
            if 0 < threshold < tokens:
                tokens = threshold
            if not engine.enable_chunked_prefill and tokens > budget:
                return
            tokens = min(tokens, budget)
            watermark = engine.watermark_blocks if self.running else 0
            # Admission reserves the whole sequence; the first request that does not fit blocks the queue.
            if engine.scheduler_reserve_full_isl:
                full = _cdiv(min(request.num_tokens, engine.max_model_len), engine.block_size)
                if full + watermark > self.free_blocks:
                    return
            needed = max(_cdiv(min(request.computed + hit + tokens, engine.max_model_len), engine.block_size)
                         - request.blocks, 0)
            if needed + watermark > self.free_blocks:
                return
            request.computed += hit
            request.hashed = hit // engine.block_size
            self.waiting.popleft()
            self.running.append(request)
            request.where = RUNNING
            if request in self._resumable:
                self._resumed(request, hit // engine.block_size)
            self._allocate(request, needed, taken=max(needed - hit // engine.block_size, 0))  # the hit: found, not taken
            self._add(step, request, tokens)
            budget -= tokens

    def _cached(self, request: SchedulerRequest) -> int:
        """Tokens the prefix cache holds for a request being admitted: its `cached_tokens`, or what is left of its own
        blocks if the replay preempted it (prefix caching on), whichever is more."""
        if request not in self._resumable:
            return request.cached
        left = request.kept_hashed + request.hashed_freed - request.evicted
        return max(request.cached, left * self.engine.block_size)

    def _resumed(self, request: SchedulerRequest, hit_blocks: int) -> None:
        """A preempted request admitted again takes its cached blocks out of the free queue (not from its front):
        the requests preempted after it have them no longer ahead."""
        at = self._resumable.index(request)
        touched = min(request.hashed_freed - request.evicted, max(hit_blocks - request.kept_hashed, 0))
        for later in self._resumable[at + 1:]:
            later.ahead = max(later.ahead - touched, 0)
        del self._resumable[at]

    def _allocate(self, request: SchedulerRequest, blocks: int, taken: int | None = None) -> None:
        """`blocks` for the request, `taken` of them (all by default) from the front of the free queue, evicting the
        cached blocks they reach."""
        self.free_blocks -= blocks
        request.blocks += blocks
        taken = blocks if taken is None else taken
        for waiting in self._resumable:
            if taken > waiting.ahead:
                waiting.evicted = min(waiting.evicted + taken - waiting.ahead, waiting.hashed_freed)
            waiting.ahead = max(waiting.ahead - taken, 0)

    def _add(self, step: Step, request: SchedulerRequest, tokens: int) -> None:
        decode = is_decode(tokens)
        entry = (0, 1, request.computed) if decode else (tokens, 0, request.computed)
        step.entries.append(entry)
        step.scheduled.append((request, tokens))
        placeholders_before = request.placeholders
        request.computed += tokens
        # vLLM caches its full blocks of known tokens as it schedules them (KVCacheManager.allocate_slots)
        request.hashed = max(request.hashed, min(request.computed, request.num_tokens) // self.engine.block_size)
        if request.computed >= request.num_tokens + placeholders_before:  # not a partial prefill chunk: samples
            step.sampled.append(request)
            if self.engine.async_scheduling:
                request.placeholders += 1

    def _preempt(self, request: SchedulerRequest) -> None:
        """Recompute preemption: blocks freed, progress lost, back to the front of the waiting queue."""
        free_before = self.free_blocks
        to_front = self._release(request)
        if self.engine.enable_prefix_caching:  # behind every block free before, and its own that went to the front
            request.ahead, request.evicted = free_before + to_front, 0
            self._resumable.append(request)
        request.computed = 0
        request.placeholders = 0
        request.where = WAITING
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def _release(self, request: SchedulerRequest) -> int:
        """The request's blocks go back to the free pool, but for those another running request still holds. Its full
        blocks (cached, prefix caching on) join the back of the free queue, behind the blocks free now, and the rest
        the front: returns how many went to the front."""
        kept = min(self.shared_blocks, request.blocks)
        freed = request.blocks - kept
        to_front = freed
        if self.engine.enable_prefix_caching:
            hashed = min(request.hashed, request.blocks)
            request.kept_hashed = min(kept, hashed)
            request.hashed_freed = min(max(hashed - kept, 0), freed)
            to_front = freed - request.hashed_freed
            for waiting in self._resumable:
                waiting.ahead += to_front
        self.shared_blocks -= kept
        self.free_blocks += freed
        request.blocks = 0
        return to_front

    def process_outputs(self, samplers: list[SchedulerRequest], finished: list[SchedulerRequest]) -> int:
        """Appends one token per sampler (a preempted one's stale token too) and finishes those at their length."""
        applied = 0
        for request in samplers:
            if request.where == FINISHED:
                continue
            applied += 1
            request.output += 1
            if request.placeholders > 0:
                request.placeholders -= 1
            if request.output < request.stop_length:
                continue
            if request.where == RUNNING:
                self.running.remove(request)
                self._release(request)
            else:
                self.waiting.remove(request)
                if request in self._resumable:  # its blocks stay where they are in the free queue
                    self._resumable.remove(request)
            request.where = FINISHED
            finished.append(request)
        return applied


class EngineClock:
    """When an engine schedules and executes its steps, from their predicted durations (seconds since the state).

    Step m is scheduled once the engine has processed the output of step m-1 (sync) or m-2 (async scheduling, two
    steps in flight); it executes once step m-1 has finished. At time 0 the state is the engine's just before it
    schedules its next step; under async scheduling the step before it is still executing for `in_flight_s`. An idle
    engine schedules again when a request arrives. End times are `origin + eq. 12 time of the batches since origin`,
    on exact integer feature sums (the compiled core does the same operations, so both agree to the last bit).
    """

    def __init__(self, coefficients: BatchTimeCoefficients, *, async_scheduling: bool, in_flight_s: float) -> None:
        self.coefficients = coefficients
        self.async_scheduling = async_scheduling
        self.last_end = in_flight_s if async_scheduling else 0.0  # end of step m-1
        self.origin = self.last_end  # steps run back to back from here
        self.sums = BatchFeatures()
        self.num_timed = 0
        self.end_before_last = 0.0  # end of step m-2
        self.not_before = 0.0  # an idle or frozen engine schedules again no earlier than this

    def next_schedule_s(self) -> float:
        base = self.end_before_last if self.async_scheduling else self.last_end
        return max(base, self.not_before)

    def execute(self, features: BatchFeatures | None, scheduled_at_s: float) -> float:
        """Runs a step scheduled at `scheduled_at_s` (None: an empty step, no forward pass); returns its end."""
        start = max(self.last_end, scheduled_at_s)
        if start > self.last_end:  # the engine was idle: time restarts from here
            self.origin, self.sums, self.num_timed = start, BatchFeatures(), 0
        if features is not None:
            self.sums = self.sums + features
            self.num_timed += 1
        end = self.origin + self.coefficients.time_s(self.sums, self.num_timed)
        self.end_before_last, self.last_end = self.last_end, end
        return end


def replay_reference(
    state: InstanceState,
    query: Query,
    coefficients: BatchTimeCoefficients,
    *,
    horizon_s: float = math.inf,
    max_steps: int = 1_000_000,
    query_time_s: float = 0.0,
    in_flight_s: float = 0.0,
    arrivals: Sequence[Arrival] = (),
    query_cached_tokens: int = 0,
) -> ReplayResult:
    """Steps the reference scheduler until the query samples its first token; always records the batches.

    The query (and each of `arrivals`) joins the waiting queue before the first step scheduled at or after its
    arrival time. The TTFT runs from `query_time_s` to the end of the step that samples the query's first token.
    `query_cached_tokens`: the query's prompt tokens this instance's prefix cache holds when it is admitted.
    """
    engine = state.engine
    scheduler = ReferenceScheduler(state)
    refused = refused_prompt(engine, query.num_prompt_tokens)
    if refused is not Infeasibility.NONE:
        return _stopped(ReplayStatus.INFEASIBLE, refused, query.id, state, query, horizon_s)
    query_request = ResidentRequest(query.id, query.num_prompt_tokens, 0, 0, query.output_tokens,
                                    cached_tokens=query_cached_tokens)
    pending = deque(sorted([*arrivals, Arrival(query_time_s, query_request)], key=lambda a: a.time_s))
    clock = EngineClock(coefficients, async_scheduling=engine.async_scheduling, in_flight_s=in_flight_s)
    watched: SchedulerRequest | None = None
    batches: list[ScheduledBatch] = []
    end = 0.0
    while True:
        if len(batches) >= max_steps:
            return _stopped(ReplayStatus.EXCEEDS_HORIZON, Infeasibility.STEP_LIMIT, None, state, query, horizon_s,
                            batches, end - query_time_s, scheduler.num_preemptions)
        scheduled_at = clock.next_schedule_s()
        if not scheduler.running and not scheduler.waiting:  # idle until the next arrival
            scheduled_at = max(scheduled_at, pending[0].time_s)
        while pending and pending[0].time_s <= scheduled_at:
            arrival = pending.popleft()
            added = scheduler.add_request(arrival.request)
            watched = added if arrival.request is query_request else watched
        step = scheduler.step()
        end = clock.execute(step.features if step.scheduled else None, scheduled_at)
        batches.append(ScheduledBatch(
            tuple((r.id, n) for r, n in step.scheduled), step.features,
            coefficients.time_s(step.features) if step.scheduled else 0.0,
        ))
        elapsed = end - query_time_s
        if watched is not None and any(r is watched for r in step.sampled):
            return ReplayResult(ReplayStatus.FIRST_TOKEN, len(batches), elapsed, elapsed, len(batches), len(batches),
                                scheduler.num_preemptions, "", tuple(batches))
        if elapsed > horizon_s:
            return _stopped(ReplayStatus.EXCEEDS_HORIZON, Infeasibility.NONE, None, state, query, horizon_s,
                            batches, elapsed, scheduler.num_preemptions)
        # A request alone in RUNNING could not grow within the whole cache: it can never complete (it needs at least
        # as many blocks again when it resumes: the replay takes even cached blocks from the free pool). Or nothing
        # changed: the state is frozen until the next arrival, and for good if none is left.
        frozen = not step.scheduled and not step.preempted and not step.outputs_applied
        if step.doomed is not None or (frozen and not pending):
            head = step.doomed.id if step.doomed else (scheduler.waiting[0].id if scheduler.waiting else query.id)
            return _stopped(ReplayStatus.INFEASIBLE, Infeasibility.STUCK, head, state, query, horizon_s,
                            batches, elapsed, scheduler.num_preemptions)
        if frozen:
            clock.not_before = pending[0].time_s


def _stopped(
    status: ReplayStatus,
    kind: Infeasibility,
    blocking_id: str | None,
    state: InstanceState,
    query: Query,
    horizon_s: float,
    batches: list[ScheduledBatch] | None = None,
    elapsed_s: float = 0.0,
    num_preemptions: int = 0,
) -> ReplayResult:
    batches = batches or []
    return ReplayResult(status, None, None, elapsed_s, len(batches), len(batches), num_preemptions,
                        explain(kind, blocking_id, state, query, horizon_s), tuple(batches))
