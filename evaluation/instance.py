"""A simulated vLLM instance in virtual time: vLLM's scheduling rules, step times from the reference H100 model.

The engine loop is EngineCore's. Synchronous scheduling: schedule step m when step m-1's output has been processed
(it ended), execute it, process its output. Async scheduling (vLLM's default on GPUs, two steps in flight): step m is
scheduled as soon as the output of step m-2 has been processed, while step m-1 executes, and runs after it. An idle
engine schedules when a request arrives. A request arriving at time t joins the first step scheduled at or after t.
A token sampled by step m exists when step m ends: a request's TTFT is the end of the step that samples its first
token minus its arrival.

The scheduler is the project's reference engine model (`bear.core.reference.ReferenceScheduler`, checked batch for
batch against vLLM's own scheduler); each step's duration is the reference H100 model's, with its seeded noise. The
requests' true output lengths are known here only: what the instance publishes (`snapshot`) is what a real engine's
snapshot plugin would: the state just before a step was scheduled, and the step then executing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from bear.core.reference import ReferenceScheduler, SchedulerRequest, Step
from bear.core.state import InstanceState, ResidentRequest
from bear.core.wire import engine_to_proto
from bear.evaluation.h100_model import ReferenceStepModel
from bear.evaluation.pool_spec import InstanceSpec
from bear.v1 import calibration_pb2, snapshot_pb2

SNAPSHOT_HISTORY_S = 5.0  # how far back snapshots are kept for stale reads


@dataclass(slots=True)
class ServedRequest:
    """A request's life at the instance (times in seconds of virtual time)."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # its true length
    first_token_s: float | None = None
    finished_s: float | None = None
    tokens_seen: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class ExecutedStep:
    """One step as calibration sees it: its composition and how long it took."""

    index: int
    scheduled_at_s: float
    started_s: float
    duration_s: float
    entries: tuple[tuple[int, int, int], ...]  # (prefill tokens, decode tokens, context tokens) per request


@dataclass(frozen=True, slots=True)
class _Published:
    """The state the engine was in just before scheduling step `next_step_index`, at `taken_at_s`."""

    taken_at_s: float
    next_step_index: int
    running: tuple[tuple, ...]
    waiting: tuple[tuple, ...]
    free_blocks: int
    executing: ExecutedStep | None  # the step executing then (async: counted in the state already)


@dataclass
class SimulatedInstance:
    spec: InstanceSpec
    step_model: ReferenceStepModel
    rng: np.random.Generator
    scheduler: ReferenceScheduler = field(init=False)
    served: dict[str, ServedRequest] = field(default_factory=dict)
    steps: list[ExecutedStep] = field(default_factory=list)
    record_steps: bool = True
    # Called with (time, idle) whenever the instance publishes its state: just before a schedule call, and when it
    # goes idle at the end of its last step (a real-time driver writes the state then).
    on_state: Callable[[float, bool], None] | None = None
    last_step: Step | None = field(default=None, init=False)  # what the last schedule call scheduled

    def __post_init__(self) -> None:
        engine = self.spec.engine
        self.scheduler = ReferenceScheduler(InstanceState(engine, engine.num_gpu_blocks))
        self._pending: deque[tuple[float, ResidentRequest]] = deque()
        self._last_end_s = 0.0  # end of the last step executed (m-1)
        self._end_before_last_s = 0.0  # end of the one before (m-2)
        self._executing: ExecutedStep | None = None  # the last step scheduled
        self._last_scheduled_s = 0.0
        self._index = 0
        self._published: deque[_Published] = deque()
        self._forgotten_until_s = -math.inf  # snapshots taken up to this time were dropped from the history

    # --- requests --------------------------------------------------------------------------------------------------
    def submit(self, request_id: str, arrival_s: float, prompt_tokens: int, output_tokens: int) -> None:
        """A request arrives (in non-decreasing arrival order); it will stop after `output_tokens` tokens."""
        if self._pending and arrival_s < self._pending[-1][0]:
            raise ValueError("requests must be submitted in arrival order")
        self.served[request_id] = ServedRequest(request_id, arrival_s, prompt_tokens, output_tokens)
        self._pending.append((arrival_s, ResidentRequest(request_id, prompt_tokens, 0, 0, output_tokens)))

    @property
    def num_resident(self) -> int:
        return len(self.scheduler.running) + len(self.scheduler.waiting) + len(self._pending)

    # --- the engine loop -------------------------------------------------------------------------------------------
    def next_schedule_s(self) -> float | None:
        """When the engine next schedules a step, or None if it has nothing to do and nothing pending."""
        at = self._end_before_last_s if self.spec.engine.async_scheduling else self._last_end_s
        at = max(at, self._last_scheduled_s)  # after an idle spell, the second step follows the first at once
        if self.scheduler.running or self.scheduler.waiting:
            return at
        return max(at, self._pending[0][0]) if self._pending else None

    def schedule_step(self) -> ExecutedStep | None:
        """Runs the engine loop's next schedule call (at `next_schedule_s()`); returns the step, None if empty."""
        scheduled_at = self.next_schedule_s()
        if scheduled_at is None:
            raise RuntimeError("nothing to schedule")
        self._last_scheduled_s = scheduled_at
        while self._pending and self._pending[0][0] <= scheduled_at:
            self.scheduler.add_request(self._pending.popleft()[1])
        self._publish(scheduled_at)
        step = self.scheduler.step()
        self.last_step = step
        self._index += 1
        start = max(self._last_end_s, scheduled_at)
        duration = self.step_model.step_time_s(step.entries, self.rng) if step.entries else 0.0
        end = start + duration
        self._end_before_last_s, self._last_end_s = self._last_end_s, end
        executed = ExecutedStep(self._index, scheduled_at, start, duration, tuple(step.entries))
        self._executing = executed if step.entries else None
        if self.record_steps and step.entries:
            self.steps.append(executed)
        for request in step.sampled:
            self._token(request, end)
        if not self.scheduler.running and not self.scheduler.waiting:
            self._publish(end, idle=True)  # the engine went idle: the (empty) state, written once the last output is in
        return self._executing

    def _token(self, request: SchedulerRequest, at_s: float) -> None:
        served = self.served[request.id]
        if served.tokens_seen >= served.output_tokens:
            return  # async: a finished request scheduled once more; its token is dropped
        served.tokens_seen += 1
        if served.first_token_s is None:
            served.first_token_s = at_s
        if served.tokens_seen == served.output_tokens:
            served.finished_s = at_s

    # --- what the instance publishes -------------------------------------------------------------------------------
    def _publish(self, scheduled_at: float, idle: bool = False) -> None:
        """Records the state as the engine has it now, just before a schedule call (what the snapshot plugin writes),
        or once idle."""
        if self.on_state is not None:
            self.on_state(scheduled_at, idle)
        s = self.scheduler
        executing = self._executing if self.spec.engine.async_scheduling and not idle else None
        self._published.append(_Published(
            scheduled_at, self._index + 1,
            tuple((r.id, r.prompt, r.computed, r.output, r.max_tokens, r.blocks, r.placeholders) for r in s.running),
            tuple((r.id, r.prompt, r.computed, r.output, r.max_tokens, r.blocks, r.placeholders) for r in s.waiting),
            s.free_blocks, executing))
        while self._published and self._published[0].taken_at_s < scheduled_at - SNAPSHOT_HISTORY_S:
            self._forgotten_until_s = self._published.popleft().taken_at_s

    def snapshot(self, as_of_s: float) -> snapshot_pb2.InstanceSnapshot:
        """The latest snapshot taken at or before `as_of_s` (before the first step: the idle engine's). Raises
        ValueError for a time whose snapshot is no longer kept (SNAPSHOT_HISTORY_S)."""
        if as_of_s < self._forgotten_until_s:
            raise ValueError(f"{self.spec.instance_id}: no snapshot kept as of {as_of_s:.3f} s (snapshots are kept "
                             f"{SNAPSHOT_HISTORY_S:g} s)")
        chosen = None
        for published in reversed(self._published):
            if published.taken_at_s <= as_of_s:
                chosen = published
                break
        if chosen is None:
            chosen = _Published(0.0, self._index + 1, (), (), self.spec.engine.num_gpu_blocks, None)
        snapshot = self._to_proto(chosen)
        snapshot.read_at_s = max(as_of_s, chosen.taken_at_s)  # the sidecar found it current then
        return snapshot

    def _to_proto(self, p: _Published) -> snapshot_pb2.InstanceSnapshot:
        snapshot = snapshot_pb2.InstanceSnapshot(
            instance_id=self.spec.instance_id, model=self.spec.model, pool=self.spec.model,
            sequence_number=p.next_step_index, taken_at_s=p.taken_at_s, engine=engine_to_proto(self.spec.engine),
            num_free_blocks=p.free_blocks, next_step_index=p.next_step_index)
        for rows, target in ((p.running, snapshot.running), (p.waiting, snapshot.waiting)):
            for rid, prompt, computed, output, max_tokens, blocks, placeholders in rows:
                target.add(request_id=rid, num_prompt_tokens=prompt, num_computed_tokens=computed,
                           num_output_tokens=output, max_tokens=max_tokens, num_allocated_blocks=blocks,
                           num_output_placeholders=placeholders)
        if p.executing is not None:
            step = snapshot.step_in_progress
            step.step_index = p.executing.index
            step.started_at_s = p.executing.scheduled_at_s
            step.execution_started_at_s = p.executing.started_s
            for prefill, decode, context in p.executing.entries:
                step.entries.add(num_prefill_tokens=prefill, num_decode_tokens=decode, num_context_tokens=context)
        return snapshot

    def batch_records(self) -> Iterator[calibration_pb2.BatchRecord]:
        """The executed steps as the snapshotter's step ring publishes them (for calibration)."""
        for step in self.steps:
            yield calibration_pb2.BatchRecord(
                step_index=step.index, started_at_s=step.scheduled_at_s, duration_s=step.duration_s,
                execution_started_at_s=step.started_s,
                entries=[calibration_pb2.BatchEntry(num_prefill_tokens=p, num_decode_tokens=d, num_context_tokens=c)
                         for p, d, c in step.entries])

    @property
    def last_end_s(self) -> float:
        """When the last step scheduled ends."""
        return self._last_end_s
