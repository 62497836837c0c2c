"""A simulated instance served in real time, writing its snapshot region as the vLLM plugin does.

The instance is the evaluation harness's (`evaluation.instance.SimulatedInstance`: the reference scheduler, step
times from the reference H100 model) with the wall clock as its virtual clock. An engine thread runs every schedule
call when it is due and, through the snapshotter's own `RegionWriter`, writes what the plugin writes in a real engine
at the same moments: the state right before each schedule call, the step when scheduled (in flight), its duration once
it has executed, the state again when the engine goes idle, and a heartbeat every second. A snapshotter sidecar reading
the region (`bear.snapshotter.main.run`) cannot tell it from a vLLM engine.

Clients `submit` requests (they arrive now) and are told, at the moment each happens, of every request's first token
and of its completion (`on_event`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bear.core.reference import SchedulerRequest
from bear.evaluation.h100_model import ReferenceStepModel
from bear.evaluation.instance import SimulatedInstance
from bear.evaluation.pool_spec import InstanceSpec
from bear.snapshotter.region import Capacities, EngineSettings, region_path
from bear.snapshotter.writer import RegionWriter

logger = logging.getLogger("bear.demo")

HEARTBEAT_S = 1.0  # as the plugin's recorder
RING_STEPS = 128
MAX_WAITING_ROWS = 1024

FIRST_TOKEN = "first_token"
FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class RequestEvent:
    kind: str  # FIRST_TOKEN or FINISHED
    instance_id: str
    request_id: str
    at_s: float  # when it happened (Unix seconds)
    arrival_s: float  # when the request arrived at the instance


class _RequestView:
    """A reference-scheduler request seen through the attributes the region writer reads from vLLM's `Request`."""

    __slots__ = ("request", "request_id", "num_prompt_tokens", "max_tokens", "arrival_time", "num_preemptions")

    def __init__(self, request: SchedulerRequest, arrival_s: float):
        self.request = request
        self.request_id = request.id
        self.num_prompt_tokens = request.prompt
        self.max_tokens = request.max_tokens
        self.arrival_time = arrival_s
        self.num_preemptions = 0  # the reference scheduler does not count them; nothing downstream reads it

    @property
    def num_computed_tokens(self) -> int:
        return self.request.computed

    @property
    def num_output_placeholders(self) -> int:
        return self.request.placeholders

    @property
    def _output_token_ids(self) -> range:
        return range(self.request.output)


@dataclass(slots=True)
class _InFlight:
    index: int  # the writer's step index
    duration_s: float
    started: bool  # execution began (the engine was idle when it was scheduled, or the step before it ended)


class LiveInstance:
    """One simulated engine in real time. `start` runs its engine thread; `stop` ends it and removes the region."""

    def __init__(self, spec: InstanceSpec, seed: int, on_event: Callable[[RequestEvent], None], region: str,
                 clock: Callable[[], float] = time.time):
        self.spec = spec
        self.region_path = region_path(region)
        self._on_event = on_event
        self._clock = clock
        self._instance = SimulatedInstance(spec, ReferenceStepModel.for_model(spec.shape_name, spec.tensor_parallel),
                                           np.random.default_rng(seed), record_steps=False,
                                           on_state=self._state_published)
        engine = spec.engine
        capacities = Capacities(max_rows=engine.max_num_seqs + MAX_WAITING_ROWS, max_step_entries=engine.max_num_seqs,
                                num_ring_steps=RING_STEPS,
                                max_slots=2 * (engine.max_num_seqs + MAX_WAITING_ROWS) + 4 * RING_STEPS)
        self._views: dict[str, _RequestView] = {}
        self._arrivals: dict[str, float] = {}
        self._writer = RegionWriter(self.region_path, capacities, self._views.get,
                                    with_placeholders=engine.async_scheduling)
        self._writer.write_engine(EngineSettings(
            engine.max_num_batched_tokens, engine.max_num_seqs, engine.block_size, engine.num_gpu_blocks,
            engine.long_prefill_token_threshold, engine.max_model_len, engine.watermark, engine.enable_chunked_prefill,
            engine.scheduler_reserve_full_isl, engine.async_scheduling, spec.model))
        self._write_state(self._clock())
        self._wake = threading.Condition()
        self._timed: list[tuple[float, int, Callable[[], RequestEvent | None]]] = []  # (at, tie-break, action)
        self._sequence = itertools.count()
        self._in_flight: deque[_InFlight] = deque()
        self._last_arrival_s = 0.0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"bear-demo-engine-{spec.instance_id}", daemon=True)
        self.num_submitted = 0
        self.num_finished = 0

    @property
    def instance_id(self) -> str:
        return self.spec.instance_id

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._writer.close()

    def submit(self, request_id: str, prompt_tokens: int, output_tokens: int) -> float:
        """A request arrives now; it stops after `output_tokens` tokens (its true length, unknown to the snapshot).
        Returns its arrival time."""
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError(f"request {request_id}: prompt and output must have at least one token")
        with self._wake:
            if request_id in self._arrivals:
                raise ValueError(f"request {request_id} was already submitted to {self.instance_id}")
            arrival = max(self._clock(), self._last_arrival_s)
            self._last_arrival_s = arrival
            self._arrivals[request_id] = arrival
            self._instance.submit(request_id, arrival, prompt_tokens, output_tokens)
            self.num_submitted += 1
            self._wake.notify()
        return arrival

    @property
    def num_unfinished(self) -> int:
        return self.num_submitted - self.num_finished

    # The engine thread --------------------------------------------------------------------------------------------

    def _run(self) -> None:
        """Invariant: every schedule call and timed action runs at or after its time, in time order (a step's end is
        handled before a schedule call at the same instant, as vLLM processes outputs before scheduling again)."""
        beat_at = 0.0
        while True:
            event = None
            with self._wake:
                if self._stopping:
                    return
                now = self._clock()
                if now >= beat_at:
                    self._writer.beat(now)
                    beat_at = now + HEARTBEAT_S
                schedule_at = self._instance.next_schedule_s()
                timed_at = self._timed[0][0] if self._timed else None
                if timed_at is not None and timed_at <= now and (schedule_at is None or timed_at <= schedule_at):
                    event = heapq.heappop(self._timed)[2]()
                elif schedule_at is not None and schedule_at <= now:
                    self._schedule()
                else:
                    due = min(t for t in (beat_at, schedule_at, timed_at) if t is not None)
                    self._wake.wait(max(due - now, 0.0))
            if event is not None:
                self._on_event(event)

    def _at(self, at_s: float, action: Callable[[], RequestEvent | None]) -> None:
        heapq.heappush(self._timed, (at_s, next(self._sequence), action))

    def _schedule(self) -> None:
        step = self._instance.schedule_step()
        scheduled = self._instance.last_step
        writer = self._writer
        if step is not None and scheduled is not None:
            idle = not self._in_flight
            tokens = {request.id: count for request, count in scheduled.scheduled}
            computed = {request.id: entry[2] for (request, _), entry in zip(scheduled.scheduled, scheduled.entries,
                                                                            strict=True)}
            index = writer.write_scheduled_step(step.scheduled_at_s, step.started_s if idle else 0.0, tokens, 0,
                                                computed)
            self._in_flight.append(_InFlight(index, step.duration_s, idle))
            end = step.started_s + step.duration_s
            self._at(end, lambda: self._processed(end))
            self._announce(scheduled.sampled, end)
        if scheduled is not None and scheduled.finished:
            finished = [r.id for r in scheduled.finished]
            writer.slots.release(finished, writer.num_scheduled_steps)
            for request_id in finished:  # the scheduler has dropped them: no state will name them again
                self._views.pop(request_id, None)
                self._arrivals.pop(request_id, None)

    def _processed(self, end_s: float) -> None:
        """The oldest step in flight ended at `end_s`: its duration, and the next one's start, go into its record."""
        done = self._in_flight.popleft()
        next_step = None
        if self._in_flight and not self._in_flight[0].started:
            self._in_flight[0].started = True
            next_step = (self._in_flight[0].index, end_s)
        self._writer.write_processed_step(done.index, done.duration_s, next_step)

    def _announce(self, sampled: list[SchedulerRequest], end_s: float) -> None:
        for request in sampled:
            served = self._instance.served[request.id]
            if served.first_token_s == end_s and served.tokens_seen == 1:
                self._at(end_s, self._event(FIRST_TOKEN, request.id, end_s))
            if served.finished_s == end_s:
                self._at(end_s, self._event(FINISHED, request.id, end_s))

    def _event(self, kind: str, request_id: str, at_s: float) -> Callable[[], RequestEvent]:
        arrival_s = self._instance.served[request_id].arrival_s

        def happen() -> RequestEvent:
            if kind == FINISHED:
                self.num_finished += 1
            return RequestEvent(kind, self.instance_id, request_id, at_s, arrival_s)
        return happen

    # What the plugin writes ----------------------------------------------------------------------------------------

    def _state_published(self, at_s: float, idle: bool) -> None:
        """The simulated engine publishes its state: now (before a schedule call), or at `at_s` once idle."""
        if idle:
            self._at(at_s, lambda: self._write_state(at_s))
        else:
            self._write_state(at_s)

    def _write_state(self, at_s: float) -> None:
        scheduler = self._instance.scheduler
        running = [self._view(r) for r in scheduler.running]
        waiting = [self._view(r) for r in scheduler.waiting]
        blocks = {r.id: range(r.blocks) for r in (*scheduler.running, *scheduler.waiting) if r.blocks}
        self._writer.write_state(running, ((), waiting), blocks, scheduler.free_blocks, at_s)

    def _view(self, request: SchedulerRequest) -> _RequestView:
        view = self._views.get(request.id)
        if view is None or view.request is not request:
            view = self._views[request.id] = _RequestView(request, self._arrivals.get(request.id, 0.0))
        return view
