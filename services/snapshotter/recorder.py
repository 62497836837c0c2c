"""What the plugin records, and when: vLLM's scheduler state and steps, written into the snapshot region.

Four moments of the engine loop (`plugin` calls them):

- `before_schedule()`, when `schedule()` is entered: the state (free blocks, running list, waiting queue). This is the
  replay's starting point: the state right before a step is scheduled (under async scheduling, with the previous step
  still in flight).
- `step_scheduled(output)`, when `schedule()` returns: the step's composition and start time go into the ring
  (duration 0: in flight). Under async scheduling a step scheduled while another executes starts when that one ends.
  One scheduled with none in flight, straight after the previous step's output was applied with requests left, is
  flagged as following it: the time between the two is the engine's own work between steps, which a reader adds to
  the previous step's time (`overhead_s`) and which async scheduling hides behind the step executing.
- `step_done()`, when `update_from_output()` is entered: the oldest step in flight has finished executing.
- `step_processed(output)`, when `update_from_output()` returns: the step's measured duration. If nothing is left to
  schedule, the state too (no `schedule()` will follow to write it).

Plus `requests_finished()` after requests are aborted (written between steps only), and a heartbeat thread that stamps the region
every HEARTBEAT_S, so that the sidecar can tell an idle engine from a dead one (vLLM kills its EngineCore without
shutting the scheduler down). The recorder never lets an exception out: each entry point contains and counts them
(published in the region as `num_errors`), and logs the first few.

The recorder reads the scheduler through attributes of vLLM 0.32/0.33's `Scheduler` but imports nothing from vLLM.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from bear.snapshotter.cached_blocks import evictable_prefixes
from bear.snapshotter.config import PluginConfig
from bear.snapshotter.region import Capacities, EngineSettings, plugin_max_slots, region_path
from bear.snapshotter.writer import RegionWriter

MAX_LOGGED_ERRORS = 10
HEARTBEAT_S = 1.0
_MAX_IN_FLIGHT = 8  # vLLM keeps at most two steps in flight (three with pipeline parallelism); more means lost outputs


@dataclass(slots=True)
class _InFlightStep:
    output: Any  # vLLM's SchedulerOutput, matched by identity in update_from_output
    index: int
    started_mono_s: float | None  # None while it waits behind another step


class SnapshotRecorder:
    """Writes one vLLM scheduler's state and steps into its snapshot region."""

    def __init__(self, scheduler: Any, config: PluginConfig, is_async: bool, logger: logging.Logger):
        self._scheduler = scheduler
        self._logger = logger
        engine = engine_settings(scheduler, is_async)
        if is_async and not engine.async_scheduling:
            logger.warning("BEAR snapshot plugin: the engine runs one step at a time (async scheduling is off in its "
                           "config, as on vLLM's CPU build): the snapshots say synchronous")
        elif not is_async and engine_overlaps_steps(scheduler):
            logger.warning("BEAR snapshot plugin: the engine overlaps steps but the scheduler class is synchronous: "
                           "use --scheduler-cls bear.snapshotter.plugin.AsyncSnapshotScheduler with "
                           "--async-scheduling; the snapshots say synchronous")
        capacities = Capacities(
            max_rows=engine.max_num_seqs + config.max_waiting_rows,
            max_step_entries=engine.max_num_seqs,
            num_ring_steps=config.ring_steps,
            max_slots=plugin_max_slots(engine.max_num_seqs + config.max_waiting_rows, engine.max_num_seqs,
                                       config.ring_steps),
            max_id_bytes=config.max_id_bytes,
        )
        rank = scheduler.vllm_config.parallel_config.data_parallel_rank
        self.path = region_path(config.region + (f"-dp{rank}" if rank else ""))
        # Read once: these objects live as long as the scheduler. Queues and lists are read at every write, since
        # vLLM replaces some of them (`running` after aborts). Blocks are those of the first KV cache group (the only
        # one of a plain attention model).
        self._blocks = scheduler.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks
        self._num_free_blocks = scheduler.kv_cache_manager.block_pool.get_num_free_blocks
        # Prefix caching on: what the cache still holds of each preempted request waiting to resume.
        self._cached_prefixes = (functools.partial(evictable_prefixes, scheduler.kv_cache_manager)
                                 if engine.enable_prefix_caching else None)
        self._in_flight: deque[_InFlightStep] = deque()
        # Steps in flight when schedule() is entered: one under async scheduling (the previous step executes), else 0
        self._in_flight_at_state = 1 if is_async and engine.async_scheduling else 0
        self._done_mono_s = 0.0
        self._done_wall_s = 0.0
        # The last step's output was applied with requests left: the engine schedules the next one without waiting.
        self._goes_on = False
        self._writer = RegionWriter(self.path, capacities, scheduler.requests.get, with_placeholders=is_async)
        try:
            self._writer.write_engine(engine)
            self._write_state()
        except BaseException:
            self._writer.close()
            raise
        self._stop_beating = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="bear-snapshot-heartbeat", daemon=True)
        self._heartbeat.start()
        logger.info("BEAR snapshot region %s: %d bytes, %s", self.path, self._writer.layout.size, capacities)

    @property
    def num_errors(self) -> int:
        return self._writer.num_errors

    def before_schedule(self) -> None:
        try:
            self._write_state()
        except Exception as error:  # noqa: BLE001 - nothing may reach the engine
            self._contain(error, "before_schedule")

    def step_scheduled(self, output: Any) -> None:
        try:
            self._writer.slots.release(output.finished_req_ids, self._writer.num_scheduled_steps)
            if output.total_num_scheduled_tokens <= 0:
                self._goes_on = False  # an empty step between: the engine's time until the next is not its overhead
                return
            cached, new = output.scheduled_cached_reqs, output.scheduled_new_reqs
            num_running_scheduled = len(cached.req_ids) - len(cached.resumed_req_ids)
            # Every running request of the state just written was scheduled, in order: their entries come from the
            # rows. Otherwise (some waited their turn, or were preempted) every entry is looked up.
            from_state = num_running_scheduled if num_running_scheduled == self._writer.num_running_rows else 0
            computed = dict(zip(cached.req_ids[from_state:], cached.num_computed_tokens[from_state:]))
            computed.update((r.req_id, r.num_computed_tokens) for r in new)
            now_mono, now_wall = time.perf_counter(), time.time()
            idle = not self._in_flight
            follows, self._goes_on = idle and self._goes_on, False
            index = self._writer.write_scheduled_step(now_wall, now_wall if idle else 0.0,
                                                      output.num_scheduled_tokens, from_state, computed, follows)
            if len(self._in_flight) >= _MAX_IN_FLIGHT:
                self._in_flight.popleft()
            self._in_flight.append(_InFlightStep(output, index, now_mono if idle else None))
        except Exception as error:  # noqa: BLE001
            self._contain(error, "step_scheduled")

    def step_done(self) -> None:
        """Timestamp only: the engine is about to apply the oldest step's output."""
        self._done_mono_s = time.perf_counter()
        self._done_wall_s = time.time()

    def step_processed(self, output: Any) -> None:
        try:
            step = self._pop_in_flight(output)
            index, duration_s, next_step = None, 0.0, None
            if step is not None and step.started_mono_s is not None:
                index, duration_s = step.index, max(self._done_mono_s - step.started_mono_s, 0.0)
            if self._in_flight and self._in_flight[0].started_mono_s is None:
                following = self._in_flight[0]
                following.started_mono_s = self._done_mono_s
                next_step = (following.index, self._done_wall_s)
            self._writer.write_processed_step(index, duration_s, next_step)
            has_requests = self._scheduler.has_requests()
            self._goes_on = index is not None and has_requests
            if not has_requests:
                self._write_state()
        except Exception as error:  # noqa: BLE001
            self._contain(error, "step_processed")

    def requests_finished(self) -> None:
        """Requests were aborted. Between steps the state is written at once (an idle engine schedules nothing that
        would write it); while a step executes it is not: vLLM already counts the step's tokens as computed but has
        no output for them, which no state before a step shows (the replay refuses it), and the next schedule() or
        update_from_output() writes the state anyway."""
        try:
            if len(self._in_flight) <= self._in_flight_at_state:
                self._write_state()
        except Exception as error:  # noqa: BLE001
            self._contain(error, "requests_finished")

    def close(self) -> None:
        self._stop_beating.set()
        self._heartbeat.join(2 * HEARTBEAT_S)
        try:
            self._writer.close()
        except Exception as error:  # noqa: BLE001
            self._contain(error, "close")

    def _beat(self) -> None:
        while not self._stop_beating.wait(HEARTBEAT_S):
            try:
                self._writer.beat(time.time())
            except Exception as error:  # noqa: BLE001 - the region is gone: stop beating, say so once
                self._contain(error, "heartbeat")
                return

    def _write_state(self) -> None:
        scheduler = self._scheduler
        self._writer.write_state(scheduler.running, (scheduler.kv_holding_waiting, scheduler.waiting), self._blocks,
                                 self._num_free_blocks(), time.time(), self._cached_prefixes)

    def _pop_in_flight(self, output: Any) -> _InFlightStep | None:
        """The in-flight step of `output` (normally the oldest); steps before it lost their outputs and are dropped."""
        for position, step in enumerate(self._in_flight):
            if step.output is output:
                for _ in range(position + 1):
                    self._in_flight.popleft()
                return step
        return None

    def _contain(self, error: Exception, where: str) -> None:
        self._writer.num_errors += 1
        if self._writer.num_errors <= MAX_LOGGED_ERRORS:
            self._logger.warning("BEAR snapshot plugin: %s failed (%d so far; the engine is unaffected): %r",
                                 where, self._writer.num_errors, error, exc_info=self._writer.num_errors == 1)


def engine_settings(scheduler: Any, is_async: bool) -> EngineSettings:
    """The scheduler's settings as the replay needs them. `max_num_seqs` is the admission limit: vLLM admits a waiting
    request while fewer than `max_num_active_reqs` run (--max-num-active-seqs, else max_num_seqs).

    `async_scheduling` is what the engine does, not what the class is: the engine overlaps two steps only while its
    scheduler config says so, and platforms turn it off (vLLM's CPU build always does, `--async-scheduling` or not);
    an `AsyncScheduler` stepped one step at a time schedules as the synchronous one does."""
    config = scheduler.scheduler_config
    served = scheduler.vllm_config.model_config.served_model_name
    return EngineSettings(
        max_num_batched_tokens=scheduler.max_num_scheduled_tokens,
        max_num_seqs=getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs),
        block_size=scheduler.block_size,
        num_gpu_blocks=scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        max_model_len=scheduler.max_model_len,
        watermark=float(config.watermark),
        enable_chunked_prefill=bool(config.enable_chunked_prefill),
        scheduler_reserve_full_isl=bool(scheduler.scheduler_reserve_full_isl),
        async_scheduling=is_async and engine_overlaps_steps(scheduler),
        model=(served[0] if isinstance(served, list) else served) or "",
        enable_prefix_caching=bool(getattr(scheduler.kv_cache_manager, "enable_caching", False)),
    )


def engine_overlaps_steps(scheduler: Any) -> bool:
    """Whether the engine schedules a step while the one before runs (vLLM's final scheduler config)."""
    return bool(getattr(scheduler.scheduler_config, "async_scheduling", False))
