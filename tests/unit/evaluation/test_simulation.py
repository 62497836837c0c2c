"""The simulated pool: conservation, determinism, engine timing, and the router's inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bear.core.state import EngineConfig
from bear.evaluation.h100_model import ReferenceStepModel
from bear.evaluation.instance import SNAPSHOT_HISTORY_S, SimulatedInstance
from bear.evaluation.pool_spec import InstanceSpec, paper_pool
from bear.evaluation.router import SimulatedRouter


def _instance(seed: int = 0, **engine_overrides: object) -> SimulatedInstance:
    spec = paper_pool()[1]
    engine = dataclasses.replace(spec.engine, **engine_overrides)
    spec = dataclasses.replace(spec, engine=engine)
    return SimulatedInstance(spec, ReferenceStepModel.for_model(spec.shape_name, spec.tensor_parallel),
                             np.random.default_rng(seed))


def _serve(instance: SimulatedInstance, count: int = 300, rate_qps: float = 6.0, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    at = 0.0
    for n in range(count):
        at += rng.exponential(1 / rate_qps)
        while (nxt := instance.next_schedule_s()) is not None and nxt < at:
            instance.schedule_step()
        instance.submit(f"r{n}", at, int(rng.integers(20, 4000)), int(rng.integers(1, 800)))
    while instance.next_schedule_s() is not None:
        instance.schedule_step()


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_every_arrival_finishes_exactly_once_with_its_tokens(async_scheduling: bool) -> None:
    instance = _instance(async_scheduling=async_scheduling, num_gpu_blocks=3000)  # small cache: preemptions happen
    _serve(instance)
    assert len(instance.served) == 300
    for served in instance.served.values():
        assert served.tokens_seen == served.output_tokens
        assert served.arrival_s <= served.first_token_s <= served.finished_s
    assert not instance.scheduler.running and not instance.scheduler.waiting
    assert instance.scheduler.free_blocks == instance.spec.engine.num_gpu_blocks
    assert instance.scheduler.num_preemptions > 0


def test_runs_are_deterministic_per_seed() -> None:
    first, second, other = _instance(3), _instance(3), _instance(4)
    for instance in (first, second, other):
        _serve(instance, count=120)
    ttft = lambda i: [r.ttft_s for r in i.served.values()]  # noqa: E731
    assert ttft(first) == ttft(second)
    assert ttft(first) != ttft(other)  # the step-time noise differs


def test_async_scheduling_schedules_a_step_ahead() -> None:
    sync, asynchronous = _instance(async_scheduling=False), _instance(async_scheduling=True)
    for instance in (sync, asynchronous):
        instance.submit("a", 0.0, 100, 50)
        for _ in range(4):
            instance.schedule_step()
    # Sync: each step is scheduled when the previous one ends; async: while the previous one runs.
    sync_steps, async_steps = sync.steps, asynchronous.steps
    assert all(s.scheduled_at_s == p.started_s + p.duration_s for p, s in zip(sync_steps, sync_steps[1:]))
    assert all(s.scheduled_at_s <= p.started_s + 1e-12 for p, s in zip(async_steps[1:], async_steps[2:]))


def test_snapshots_show_the_state_before_a_schedule_call() -> None:
    instance = _instance(async_scheduling=True)
    instance.submit("a", 0.0, 1000, 20)
    instance.submit("b", 0.0, 50, 20)
    instance.schedule_step()  # step 1: both prefill
    instance.schedule_step()  # step 2: scheduled while step 1 runs
    snapshot = instance.snapshot(instance.steps[1].scheduled_at_s)
    assert snapshot.next_step_index == 2
    assert [r.request_id for r in snapshot.running] == ["a", "b"]
    assert snapshot.running[0].num_computed_tokens == 1000 and snapshot.running[0].num_output_placeholders == 1
    assert snapshot.step_in_progress.step_index == 1  # executing, already counted in the state
    assert snapshot.read_at_s >= snapshot.taken_at_s


def test_a_read_older_than_the_kept_history_is_refused_not_made_up() -> None:
    # It returned an empty, idle engine: a router reading that far back replayed a pool with nothing in it.
    instance = _instance()
    assert len(instance.snapshot(-1.0).running) == 0  # before the first step: the idle engine, truly
    _serve(instance, count=120)
    end = instance.steps[-1].scheduled_at_s
    assert instance.snapshot(end - SNAPSHOT_HISTORY_S + 0.5).taken_at_s > 0
    with pytest.raises(ValueError, match="no snapshot kept"):
        instance.snapshot(end - SNAPSHOT_HISTORY_S - 5.0)
    with pytest.raises(ValueError, match="staleness_s must be in"):
        SimulatedRouter([instance], None, None, staleness_s=SNAPSHOT_HISTORY_S + 1)  # type: ignore[arg-type]


def test_the_paper_pool_has_kv_capacity_from_memory_minus_weights() -> None:
    pool = {spec.model: spec for spec in paper_pool()}
    assert set(pool) == {"Qwen3-0.6B", "Qwen3-8B", "Qwen3-32B"}
    assert pool["Qwen3-32B"].tensor_parallel == 2
    blocks = {model: spec.engine.num_gpu_blocks for model, spec in pool.items()}
    assert blocks["Qwen3-0.6B"] > blocks["Qwen3-8B"] > blocks["Qwen3-32B"] > 10_000
    engine: EngineConfig = pool["Qwen3-8B"].engine
    assert (engine.max_num_batched_tokens, engine.max_num_seqs, engine.block_size) == (8192, 1024, 16)
    assert isinstance(pool["Qwen3-8B"], InstanceSpec)


@pytest.mark.parametrize(("weights", "named"), [({"delta_per_s": float("inf")}, "delta_per_s"),
                                                ({"delta_per_s": float("nan")}, "delta_per_s"),
                                                ({"delta_per_s": -1.0}, "delta_per_s"),
                                                ({"lambda_per_micro_usd": float("nan")}, "lambda_per_micro_usd"),
                                                ({"lambda_per_micro_usd": 1e10}, "lambda_per_micro_usd")])
def test_weights_the_router_would_refuse_are_refused_before_a_run(weights: dict[str, float], named: str) -> None:
    # QA: δ = inf routed as δ = 0, NaN sent every query to one model, λ = NaN made every figure NaN
    from bear.evaluation.simulation import run

    with pytest.raises(ValueError, match=rf"{named} must be a number in \[0, 1e\+09\]"):
        run([], None, None, [], None, **weights)  # type: ignore[arg-type]
