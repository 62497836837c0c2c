"""The experiments' common setting, built as in the paper (§5.1): train the predictors on one synthetic evaluation
table, calibrate each simulated instance by profiling it (eq. 12 coefficients, prefill throughput, LPS parameters),
then evaluate on fresh queries from another table.

Profiling an instance alone: Poisson arrivals of training queries at a fraction of its capacity and beyond it; its
executed steps fit eq. 12 and eq. 8's throughput, and the overloaded phase gives the LPS service rate μ (completions
per second) and concurrency k (mean running requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bear.core.batch_time import fit
from bear.core.lps import LpsParameters
from bear.core.prefill_throughput import fit_prefill_throughput
from bear.core.wire import samples_from_records
from bear.estimator.estimation import Calibration, Estimator
from bear.evaluation.h100_model import ReferenceStepModel
from bear.evaluation.instance import SimulatedInstance
from bear.evaluation.pool_spec import InstanceSpec, paper_pool
from bear.evaluation.router import Prediction
from bear.evaluation.simulation import Prices, WorkloadQuery, oracle_remaining
from bear.evaluation.workload import Mmpp2, poisson_arrivals_s, ttft_targets_s
from bear.predictor.catalog import PAPER_POOL
from bear.predictor.predictor import Predictor
from bear.predictor.progress import Progress, no_progress
from bear.predictor.synthetic_corpus import generate
from bear.predictor.tokenizers import get_tokenizer
from bear.predictor.training import train

MICRO_USD_PER_USD = 1e6


@dataclass(frozen=True, slots=True)
class ScenarioConfig:
    seed: int = 0
    train_rows: int = 6000  # training table rows (prompts × 3 models)
    test_prompts: int = 1500  # distinct evaluation prompts queries are drawn from
    profile_queries: int = 400  # per instance and phase
    looseness: float = 1.0  # 2: TTFT targets twice as loose


@dataclass(frozen=True, slots=True)
class TestPrompt:
    task: str
    prompt_tokens: int
    true_score: dict[str, float]
    true_output_tokens: dict[str, int]
    predictions: dict[str, Prediction]


@dataclass
class Scenario:
    config: ScenarioConfig
    specs: tuple[InstanceSpec, ...]
    predictor: Predictor
    prices: Prices
    calibrations: dict[str, Calibration]
    prompts: list[TestPrompt]
    profiles: dict[str, dict[str, float]] = field(default_factory=dict)  # per instance: fit MAPE, μ, k, θ
    step_samples: dict[str, list] = field(default_factory=dict)  # per instance: (BatchFeatures, duration) profiled

    def instances(self, seed: int) -> list[SimulatedInstance]:
        return [_instance(spec, np.random.default_rng([seed, i])) for i, spec in enumerate(self.specs)]

    def estimator(self, *, max_snapshot_age_s: float = 2.0, oracle_lengths: bool = False) -> Estimator:
        """A fresh estimator with the profiled calibrations (oracle: residents' remaining lengths are exact, given
        `run(..., oracle_lengths=True)`)."""
        remaining = oracle_remaining if oracle_lengths else self.predictor.expected_remaining_tokens_many
        estimator = Estimator(remaining, _mean_lengths(self.prompts), max_snapshot_age_s=max_snapshot_age_s)
        for spec in self.specs:
            estimator.add_instance(spec.instance_id, spec.model)
            estimator.set_calibration(spec.instance_id, self.calibrations[spec.instance_id])
        return estimator

    def workload(self, rate_qps: float, num_queries: int, seed: int, *, mmpp_ratio: float | None = None,
                 looseness: float | None = None) -> list[WorkloadQuery]:
        if num_queries < 0:
            raise ValueError(f"num_queries must be >= 0, got {num_queries}")
        rng = np.random.default_rng([seed, 7])
        if mmpp_ratio is None:
            arrivals = poisson_arrivals_s(rate_qps, num_queries, rng)
        else:
            arrivals = Mmpp2(rate_qps, mmpp_ratio).arrivals_s(num_queries, rng)
        chosen = rng.integers(0, len(self.prompts), size=num_queries)
        tokens = np.array([self.prompts[i].prompt_tokens for i in chosen])
        targets = ttft_targets_s(tokens, rng, looseness=self.config.looseness if looseness is None else looseness)
        return [WorkloadQuery(f"q{seed}-{n}", float(arrivals[n]), self.prompts[i].task, self.prompts[i].prompt_tokens,
                              float(targets[n]), self.prompts[i].true_score, self.prompts[i].true_output_tokens,
                              self.prompts[i].predictions)
                for n, i in enumerate(chosen)]


def build_scenario(config: ScenarioConfig = ScenarioConfig(), progress: Progress = no_progress) -> Scenario:
    training = generate(config.train_rows, config.seed)
    predictor = Predictor(train(training.table, PAPER_POOL, progress=progress))
    prices = Prices({m.name: m.input_usd_per_mtok for m in PAPER_POOL},
                    {m.name: m.output_usd_per_mtok for m in PAPER_POOL})
    test = generate(config.test_prompts * len(PAPER_POOL), config.seed + 1000)
    prompts = _test_prompts(test.table, predictor, progress)
    specs = paper_pool()
    calibrations, profiles, samples = {}, {}, {}
    for i, spec in enumerate(progress(specs, "profiling instances", len(specs))):
        calibrations[spec.instance_id], profiles[spec.instance_id], samples[spec.instance_id] = _profile(
            spec, training.table, config, i)
    return Scenario(config, specs, predictor, prices, calibrations, prompts, profiles, samples)


def capacity_qps(scenario: Scenario, spec: InstanceSpec, seed: int, *, completions: int = 600) -> float:
    """An instance's highest sustainable throughput on the test mix: kept full (max_num_seqs requests in flight, the
    engine admitting what its KV cache holds), completions per second over `completions` completions once warmed up:
    after at least as many as were submitted at the start (while those drain, the short ones first, the rate is
    biased high: ~10% at 400 completions on the paper's engines) and at least `completions`."""
    if completions < 2:
        raise ValueError(f"completions must be >= 2, got {completions!r}")
    rng = np.random.default_rng([seed, 13])
    instance = _instance(spec, np.random.default_rng([seed, 14]))
    instance.record_steps = False
    active: set[str] = set()
    submitted = 0

    def submit(at: float) -> None:
        nonlocal submitted
        prompt = scenario.prompts[int(rng.integers(0, len(scenario.prompts)))]
        request_id = f"capacity-{submitted}"
        instance.submit(request_id, at, prompt.prompt_tokens, prompt.true_output_tokens[spec.model])
        active.add(request_id)
        submitted += 1

    for _ in range(spec.engine.max_num_seqs):
        submit(0.0)
    warmup = max(completions, spec.engine.max_num_seqs)
    finish_times: list[float] = []
    while len(finish_times) < warmup + completions:
        instance.schedule_step()
        done = [r for r in active if instance.served[r].finished_s is not None]
        for request_id in done:
            active.discard(request_id)
            finish_times.append(instance.served[request_id].finished_s)
            submit(instance.last_end_s)
    finish_times.sort()
    window = finish_times[warmup:]
    return (len(window) - 1) / (window[-1] - window[0])


def serve_alone(scenario: Scenario, spec: InstanceSpec, rate_qps: float, count: int, seed: int) -> list:
    """Serves `count` test queries arriving at `rate_qps` on one instance alone; returns its served requests."""
    rng = np.random.default_rng([seed, 11])
    instance = _instance(spec, np.random.default_rng([seed, 12]))
    for n, (at, k) in enumerate(zip(poisson_arrivals_s(rate_qps, count, rng),
                                    rng.integers(0, len(scenario.prompts), size=count), strict=True)):
        while (nxt := instance.next_schedule_s()) is not None and nxt < at:
            instance.schedule_step()
        prompt = scenario.prompts[k]
        instance.submit(f"alone-{n}", float(at), prompt.prompt_tokens, prompt.true_output_tokens[spec.model])
    while instance.next_schedule_s() is not None:
        instance.schedule_step()
    return list(instance.served.values())


def _instance(spec: InstanceSpec, rng: np.random.Generator) -> SimulatedInstance:
    return SimulatedInstance(spec, ReferenceStepModel.for_model(spec.shape_name, spec.tensor_parallel), rng)


def _test_prompts(table, predictor: Predictor, progress: Progress) -> list[TestPrompt]:  # noqa: ANN001 - EvalTable
    by_prompt: dict[str, dict[str, tuple[float, int]]] = {}
    tasks: dict[str, str] = {}
    for text, model, score, length, task in zip(table.prompts, table.models, table.scores, table.output_tokens,
                                                table.tasks, strict=True):
        by_prompt.setdefault(text, {})[model] = (float(score), int(length))
        tasks[text] = task
    prompts = []
    complete = [t for t, m in by_prompt.items() if len(m) == len(PAPER_POOL)]
    for text in progress(complete, "predicting test prompts", len(complete)):
        predicted = predictor.predict(text)
        prompts.append(TestPrompt(
            tasks[text], next(iter(predicted.values())).prompt_tokens,
            {m: by_prompt[text][m][0] for m in predicted}, {m: by_prompt[text][m][1] for m in predicted},
            {m: Prediction(p.accuracy, p.output_tokens, p.cost_usd * MICRO_USD_PER_USD) for m, p in predicted.items()}))
    return prompts


def _mean_lengths(prompts: Sequence[TestPrompt]) -> dict[str, float]:
    models = prompts[0].predictions.keys() if prompts else ()
    return {m: float(np.mean([p.predictions[m].output_tokens for p in prompts])) for m in models}


def _profile(spec: InstanceSpec, table, config: ScenarioConfig,  # noqa: ANN001 - EvalTable
             index: int) -> tuple[Calibration, dict[str, float], list]:
    """Serves training queries of the instance's model alone: first past saturation (μ, k), then at half of it."""
    rows = table.rows_of(spec.model)
    rng = np.random.default_rng([config.seed, 99, index])
    tokens = _prompt_tokens(table, rows)
    instance = _instance(spec, np.random.default_rng([config.seed, 98, index]))
    overload = _serve(instance, rows, tokens, table, rate_qps=1000.0, count=config.profile_queries, rng=rng)
    mu = overload["completions_per_s"]
    _serve(instance, rows, tokens, table, rate_qps=0.5 * mu, count=config.profile_queries, rng=rng,
           start_s=instance.last_end_s + 1.0)
    samples = samples_from_records(instance.batch_records())
    calibration_fit = fit(samples)
    throughput = fit_prefill_throughput(samples)
    lps = LpsParameters(arrival_rate_qps=0.0, service_rate_qps=mu, concurrency=max(1.0, overload["mean_running"]),
                        prefill_tokens_per_s=throughput)
    profile = {"batch_time_mape": calibration_fit.mape, "num_steps": float(len(samples)), "service_rate_qps": mu,
               "concurrency": overload["mean_running"], "prefill_tokens_per_s": throughput}
    return Calibration(calibration_fit.coefficients, throughput, lps), profile, samples


def _prompt_tokens(table, rows: np.ndarray) -> np.ndarray:  # noqa: ANN001 - EvalTable
    tokenizer = get_tokenizer(PAPER_POOL.spec(table.models[rows[0]]).tokenizer)
    return np.array([max(1, len(tokenizer.token_keys(table.prompts[r]))) for r in rows])


def _serve(instance: SimulatedInstance, rows: np.ndarray, tokens: np.ndarray, table, *,  # noqa: ANN001
           rate_qps: float, count: int, rng: np.random.Generator, start_s: float = 0.0) -> dict[str, float]:
    arrivals = start_s + poisson_arrivals_s(rate_qps, count, rng)
    picked = rng.integers(0, len(rows), size=count)
    running_samples = []
    for n, (at, k) in enumerate(zip(arrivals, picked, strict=True)):
        while (nxt := instance.next_schedule_s()) is not None and nxt < at:
            instance.schedule_step()
            running_samples.append(len(instance.scheduler.running))
        row = rows[k]
        instance.submit(f"profile-{instance.spec.instance_id}-{start_s}-{n}", float(at), int(tokens[k]),
                        int(table.output_tokens[row]))
    first = instance.last_end_s
    while instance.next_schedule_s() is not None:
        instance.schedule_step()
        running_samples.append(len(instance.scheduler.running))
    span = max(instance.last_end_s - max(first, float(arrivals[0])), 1e-9)
    return {"completions_per_s": count / max(instance.last_end_s - float(arrivals[0]), 1e-9),
            "mean_running": float(np.mean(running_samples)) if running_samples else 1.0, "span_s": span}
