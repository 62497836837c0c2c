"""The predictor service over real gRPC (port 0): a small artifact trained here from the synthetic corpus, Predict and
ExpectedRemaining against the in-process predictor, bad input, health, reflection, metrics, and `bear serve
predictor` as a process (its /metrics, a graceful SIGTERM, a bad artifact)."""

from __future__ import annotations

import math
import re
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

from bear.predictor.catalog import PAPER_POOL
from bear.predictor.config import PredictorServiceConfig
from bear.predictor.main import PredictorService
from bear.predictor.predictor import Predictor, load_predictor
from bear.predictor.synthetic_corpus import generate
from bear.predictor.training import TrainingConfig, train
from bear.v1 import predictor_pb2, predictor_pb2_grpc
from tests.served import BEAR, serving
from tests.service_loop import LoopThread

SMALL, MEDIUM, LARGE = PAPER_POOL.names
PROMPT = "Summarize the following report in about 200 words.\n\n" + "The audit reviews the grant program. " * 40


@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("predictor") / "artifact"
    train(generate(450, seed=1).table, PAPER_POOL, TrainingConfig(num_trees=30)).save(folder)
    return folder


@pytest.fixture(scope="module")
def reference(artifact_dir: Path) -> Iterator[Predictor]:
    predictor = load_predictor(artifact_dir)
    yield predictor
    predictor.close()


@pytest.fixture(scope="module")
def channel(artifact_dir: Path) -> Iterator[grpc.Channel]:
    """A channel to the predictor service, running on an event loop in a background thread."""
    loop = LoopThread()
    service = PredictorService(PredictorServiceConfig(model_dir=str(artifact_dir), host="127.0.0.1", grpc_port=0,
                                                      metrics_port=None, max_prompt_chars=20_000))
    running = loop.run(service.start())
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    yield channel
    channel.close()
    loop.run(running.stop())
    service.close()
    loop.close()


@pytest.fixture
def stub(channel: grpc.Channel) -> predictor_pb2_grpc.PredictorStub:
    return predictor_pb2_grpc.PredictorStub(channel)


def test_predict_answers_what_the_predictor_predicts_with_costs_in_micro_dollars(
        stub: predictor_pb2_grpc.PredictorStub, reference: Predictor) -> None:
    reply = stub.Predict(predictor_pb2.PredictRequest(prompt=PROMPT), timeout=10)
    expected = reference.predict(PROMPT)
    assert [p.model for p in reply.predictions] == [SMALL, MEDIUM, LARGE]
    for got in reply.predictions:
        want, spec = expected[got.model], PAPER_POOL.spec(got.model)
        assert (got.accuracy, got.output_tokens, got.prompt_tokens) == (want.accuracy, want.output_tokens,
                                                                        want.prompt_tokens)
        assert got.cost_micro_usd == pytest.approx(want.cost_usd * 1e6)
        assert got.cost_micro_usd == pytest.approx(spec.cost_microusd(want.prompt_tokens, want.output_tokens))
        assert (got.input_usd_per_mtok, got.output_usd_per_mtok) == (spec.input_usd_per_mtok,
                                                                    spec.output_usd_per_mtok)


def test_predict_for_some_models_keeps_catalogue_order(stub: predictor_pb2_grpc.PredictorStub) -> None:
    reply = stub.Predict(predictor_pb2.PredictRequest(prompt="Give three tips.", models=[LARGE, SMALL]), timeout=10)
    assert [p.model for p in reply.predictions] == [SMALL, LARGE]


@pytest.mark.parametrize(("request_", "message"), [
    (predictor_pb2.PredictRequest(prompt=""), "prompt is empty"),
    (predictor_pb2.PredictRequest(prompt="hi", models=["gpt-9"]), r"models\[0\]: unknown model 'gpt-9'"),
    (predictor_pb2.PredictRequest(prompt="x" * 20_001), "at most 20000"),
    (predictor_pb2.PredictRequest(prompt="x" * 6_000_000), "at most 20000"),  # over gRPC's default 4 MiB too
])
def test_bad_predict_requests_are_invalid_argument(stub: predictor_pb2_grpc.PredictorStub,
                                                   request_: predictor_pb2.PredictRequest, message: str) -> None:
    with pytest.raises(grpc.RpcError) as error:
        stub.Predict(request_, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and re.search(message, error.value.details())


def test_expected_remaining_answers_a_batch_of_several_models(stub: predictor_pb2_grpc.PredictorStub,
                                                              reference: Predictor) -> None:
    rng = np.random.default_rng(3)
    models = [PAPER_POOL.names[i] for i in rng.integers(0, 3, size=300)]
    predicted = rng.uniform(20, 800, size=300)
    generated = rng.integers(0, 1500, size=300)
    max_tokens = np.where(rng.random(300) < 0.5, generated + rng.integers(1, 500, size=300), 0)
    reply = stub.ExpectedRemaining(predictor_pb2.ExpectedRemainingRequest(queries=[
        predictor_pb2.RemainingQuery(model=m, predicted_output_tokens=p, generated_tokens=int(g), max_tokens=int(c))
        for m, p, g, c in zip(models, predicted, generated, max_tokens, strict=True)]), timeout=10)
    expected = [reference.expected_remaining_tokens(m, p, int(g), int(c) or None)
                for m, p, g, c in zip(models, predicted, generated, max_tokens, strict=True)]
    assert list(reply.remaining_tokens) == pytest.approx(expected)
    assert min(reply.remaining_tokens) >= 1


def test_expected_remaining_knows_a_model_by_its_repository_id_as_predict_does(
        stub: predictor_pb2_grpc.PredictorStub, reference: Predictor) -> None:
    """A pool registered under vLLM's default served name (the repository id) asks with it (QA: Predict took
    `Qwen/Qwen3-8B`, ExpectedRemaining refused it)."""
    query = predictor_pb2.RemainingQuery(model=f"Qwen/{SMALL}", predicted_output_tokens=300, generated_tokens=120)
    reply = stub.ExpectedRemaining(predictor_pb2.ExpectedRemainingRequest(queries=[query]), timeout=10)
    assert list(reply.remaining_tokens) == pytest.approx([reference.expected_remaining_tokens(SMALL, 300, 120)])


def test_a_bad_remaining_query_is_invalid_argument(stub: predictor_pb2_grpc.PredictorStub) -> None:
    with pytest.raises(grpc.RpcError) as error:
        stub.ExpectedRemaining(predictor_pb2.ExpectedRemainingRequest(queries=[
            predictor_pb2.RemainingQuery(model=SMALL, predicted_output_tokens=10),
            predictor_pb2.RemainingQuery(model=SMALL, predicted_output_tokens=math.inf)]), timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("queries[1].predicted_output_tokens")


def test_a_large_remaining_call_is_answered_off_the_event_loop_alike(stub: predictor_pb2_grpc.PredictorStub,
                                                                     reference: Predictor) -> None:
    """Over INLINE_REMAINING_QUERIES the checks and grouping run on the thread pool (QA: 100,000 queries held the
    loop, and every other call, for ~0.3 s): the same answers, the same refusals."""
    from bear.predictor.server import INLINE_REMAINING_QUERIES

    count = INLINE_REMAINING_QUERIES * 3
    queries = [predictor_pb2.RemainingQuery(model=PAPER_POOL.names[i % 3], predicted_output_tokens=50 + i % 700,
                                            generated_tokens=i % 400) for i in range(count)]
    reply = stub.ExpectedRemaining(predictor_pb2.ExpectedRemainingRequest(queries=queries), timeout=30)
    assert len(reply.remaining_tokens) == count
    for i in (0, 1, count // 2, count - 1):
        assert reply.remaining_tokens[i] == pytest.approx(
            reference.expected_remaining_tokens(PAPER_POOL.names[i % 3], 50 + i % 700, i % 400))
    queries[-1].predicted_output_tokens = math.nan
    with pytest.raises(grpc.RpcError) as error:
        stub.ExpectedRemaining(predictor_pb2.ExpectedRemainingRequest(queries=queries), timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(f"queries[{count - 1}].predicted_output_tokens")


def test_the_message_limit_carries_as_many_remaining_queries_as_allowed(artifact_dir: Path) -> None:
    """(QA: BEAR_PREDICTOR_MAX_REMAINING_QUERIES=1,000,000 was taken, but 500,000 queries were over the message
    limit, which followed the prompt limit alone: RESOURCE_EXHAUSTED.)"""
    from bear.predictor.config import MAX_REMAINING_QUERIES_LIMIT

    query = predictor_pb2.RemainingQuery(model="Qwen/Qwen3-32B", predicted_output_tokens=200.5,
                                         generated_tokens=4_000_000_000, max_tokens=4_000_000_000)
    for allowed in (1_000_000, MAX_REMAINING_QUERIES_LIMIT):
        config = PredictorServiceConfig(model_dir=str(artifact_dir), max_remaining_queries=allowed)
        service = PredictorService(config)
        try:
            limit = service.settings().max_receive_message_bytes
        finally:
            service.close()
        assert limit >= allowed * (query.ByteSize() + 5)  # each query with its tag and length
    with pytest.raises(ValueError, match="BEAR_PREDICTOR_MAX_REMAINING_QUERIES must be in"):
        PredictorServiceConfig(model_dir=str(artifact_dir), max_remaining_queries=MAX_REMAINING_QUERIES_LIMIT + 1)


def test_latency_is_recorded_per_method(stub: predictor_pb2_grpc.PredictorStub) -> None:
    def count(method: str) -> float:
        return REGISTRY.get_sample_value("bear_predictor_request_seconds_count", {"method": method}) or 0.0

    before = count("Predict"), count("ExpectedRemaining")
    stub.Predict(predictor_pb2.PredictRequest(prompt="hello"), timeout=10)
    stub.ExpectedRemaining(predictor_pb2.ExpectedRemainingRequest(), timeout=10)
    assert (count("Predict"), count("ExpectedRemaining")) == (before[0] + 1, before[1] + 1)


def test_every_call_answered_with_an_error_is_counted_by_its_code(stub: predictor_pb2_grpc.PredictorStub,
                                                                  channel: grpc.Channel) -> None:
    """The service's refusals and those of the stream of calls (a bad deadline, a call id in flight), unary or
    streamed: each one in bear_predictor_errors_total (only the service's own were, before)."""
    def errors(method: str, code: str) -> float:
        return REGISTRY.get_sample_value("bear_predictor_errors_total", {"method": method, "code": code}) or 0.0

    before = errors("Predict", "INVALID_ARGUMENT"), errors("ExpectedRemaining", "INVALID_ARGUMENT")
    with pytest.raises(grpc.RpcError):
        stub.Predict(predictor_pb2.PredictRequest(prompt=" "), timeout=10)
    with pytest.raises(grpc.RpcError):
        stub.ExpectedRemaining(predictor_pb2.ExpectedRemainingRequest(queries=[
            predictor_pb2.RemainingQuery(model="no-such-model", predicted_output_tokens=10)]), timeout=10)
    stream = channel.stream_stream("/bear.v1.Predictor/PredictStream",
                                   request_serializer=predictor_pb2.PredictCall.SerializeToString,
                                   response_deserializer=predictor_pb2.PredictResult.FromString)
    calls = [predictor_pb2.PredictCall(call_id=1, request=predictor_pb2.PredictRequest(prompt="hi"), timeout_ms=-1),
             predictor_pb2.PredictCall(call_id=2, request=predictor_pb2.PredictRequest(prompt=""), timeout_ms=5000)]
    results = list(stream(iter(calls), timeout=10))
    assert sorted(r.error.code for r in results) == ["INVALID_ARGUMENT", "INVALID_ARGUMENT"]
    assert (errors("Predict", "INVALID_ARGUMENT"), errors("ExpectedRemaining", "INVALID_ARGUMENT")) == (
        before[0] + 3, before[1] + 1)


def test_health_and_reflection(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "bear.v1.Predictor"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    (answer,) = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                timeout=5)
    assert "bear.v1.Predictor" in {s.name for s in answer.list_services_response.service}


def test_bear_serve_predictor_serves_metrics_and_stops_on_sigterm(artifact_dir: Path) -> None:
    with serving("predictor", "--model-dir", str(artifact_dir), "--grpc-port", "0", "--metrics-port", "0", "--host",
                 "127.0.0.1") as (process, grpc_port, metrics_port):
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            reply = predictor_pb2_grpc.PredictorStub(channel).Predict(predictor_pb2.PredictRequest(prompt="hi"),
                                                                      timeout=10)
        assert len(reply.predictions) == 3
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        assert 'bear_predictor_request_seconds_count{method="Predict"} 1.0' in scraped
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0


def test_bear_serve_predictor_refuses_a_directory_that_is_no_artifact(tmp_path: Path) -> None:
    completed = subprocess.run([BEAR, "serve", "predictor", "--model-dir", str(tmp_path), "--grpc-port", "0"],
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 2 and completed.stderr.startswith("bear serve predictor: ")
