"""vLLM scheduler classes that publish the engine's state into a snapshot region after every step.

    BEAR_SNAPSHOT_REGION=bear-snapshot vllm serve MODEL --no-async-scheduling
        --scheduler-cls bear.snapshotter.plugin.SnapshotScheduler

(always say which: vLLM turns async scheduling on by itself where the platform supports it, and the class must match)

`SnapshotScheduler` is vLLM's synchronous `Scheduler`, `AsyncSnapshotScheduler` its `AsyncScheduler` (async scheduling,
the GPU default; pass it together with `--async-scheduling`). They schedule exactly as their base classes do; the
recording (`recorder.SnapshotRecorder`) runs around `schedule()` and `update_from_output()` and never raises into the
engine. If the region cannot be created, the engine serves without snapshots and says so in its log.

This module runs inside vLLM's EngineCore process: it imports vLLM, the standard library and the snapshotter's small
region modules, nothing else of BEAR.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from bear.snapshotter.config import PluginConfig
from bear.snapshotter.recorder import SnapshotRecorder

# A child of vLLM's logger, so that messages appear in the engine's log with its format.
logger = logging.getLogger("vllm.bear_snapshotter")


class _SnapshotMixin:
    """The recording hooks, shared by the synchronous and the asynchronous scheduler."""

    _snapshots: SnapshotRecorder | None

    def _start_snapshots(self, is_async: bool) -> None:
        try:
            self._snapshots = SnapshotRecorder(self, PluginConfig.from_environ(), is_async, logger)
        except Exception:  # noqa: BLE001 - serving goes on without snapshots
            logger.exception("BEAR snapshot plugin disabled: the snapshot region could not be set up")
            self._snapshots = None

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self._snapshots is not None:
            self._snapshots.before_schedule()
        output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        if self._snapshots is not None:
            self._snapshots.step_scheduled(output)
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        if self._snapshots is not None:
            self._snapshots.step_done()
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        if self._snapshots is not None:
            self._snapshots.step_processed(scheduler_output)
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        finished = super().finish_requests(request_ids, finished_status)  # type: ignore[misc]
        if self._snapshots is not None and finished:
            self._snapshots.requests_finished()
        return finished

    def shutdown(self) -> None:
        super().shutdown()  # type: ignore[misc]
        if self._snapshots is not None:
            self._snapshots.close()
            self._snapshots = None


class SnapshotScheduler(_SnapshotMixin, Scheduler):
    """vLLM's synchronous scheduler, publishing snapshots."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start_snapshots(is_async=False)


class AsyncSnapshotScheduler(_SnapshotMixin, AsyncScheduler):
    """vLLM's asynchronous scheduler (two steps in flight), publishing snapshots."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start_snapshots(is_async=True)
