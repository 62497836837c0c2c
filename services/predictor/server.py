"""The gRPC face of the predictor (bear.v1.Predictor): thin, over `bear.predictor.predictor.Predictor`.

Predict tokenises and runs LightGBM: a short prompt (≤ INLINE_PROMPT_CHARS, ~0.1–0.3 ms of work) on the event loop,
since a hop to a thread and back costs as much again; a longer one on a small thread pool (the predictor is
thread-safe) so that the event loop keeps accepting calls. `PredictStream` is Predict's stream twin (many calls over
one stream: how the router calls it, see `bear.common.call_streams`), answered alike. ExpectedRemaining is a few
vectorised table look-ups after its queries are checked and grouped: on the loop for up to INLINE_REMAINING_QUERIES
queries, on the thread pool for more. Bad input is INVALID_ARGUMENT with a message naming the field. Every
call's latency goes to a histogram by method.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
from prometheus_client import Counter, Histogram

from bear.common.call_streams import CallFailed, CallStreamServer, answer_unary

from bear.predictor.predictor import Predictor
from bear.predictor.wire import (
    InvalidRequest,
    predict_arguments,
    predict_response,
    remaining_groups,
    remaining_response,
)
from bear.v1 import predictor_pb2, predictor_pb2_grpc

INLINE_PROMPT_CHARS = 2_000
# ExpectedRemaining checks and groups its queries in Python (~3 µs each): more than this many go to the thread pool,
# so that one large call does not hold every other call up (QA: 100,000 queries held the loop for ~0.3 s).
INLINE_REMAINING_QUERIES = 1_000
SERVICE_NAME = predictor_pb2.DESCRIPTOR.services_by_name["Predictor"].full_name

REQUEST_SECONDS = Histogram(
    "bear_predictor_request_seconds", "Time to answer one call, by method", ["method"],
    buckets=(5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0))
ERRORS = Counter("bear_predictor_errors", "Calls answered with an error status", ["method", "code"])


class PredictorServicer(predictor_pb2_grpc.PredictorServicer):
    def __init__(self, predictor: Predictor, executor: ThreadPoolExecutor, *, max_prompt_chars: int,
                 max_remaining_queries: int) -> None:
        self._predictor = predictor
        self._executor = executor
        self._max_prompt_chars = max_prompt_chars
        self._max_remaining_queries = max_remaining_queries
        self.streams = CallStreamServer(self.answer, predictor_pb2.PredictResult,  # .close() at shutdown
                                        f"/{SERVICE_NAME}/PredictStream", on_error=count_predict_error)

    async def Predict(self, request: predictor_pb2.PredictRequest,  # noqa: N802 - the proto's name
                      context: grpc.aio.ServicerContext) -> predictor_pb2.PredictResponse:
        return await answer_unary(self.answer(request), context, on_error=count_predict_error)

    async def PredictStream(self, calls: AsyncIterator[predictor_pb2.PredictCall],  # noqa: N802
                            context: grpc.aio.ServicerContext) -> None:
        await self.streams.serve(calls, context)

    async def answer(self, request: predictor_pb2.PredictRequest) -> predictor_pb2.PredictResponse:
        started = time.perf_counter()
        catalog = self._predictor.catalog
        try:
            try:
                prompt, models = predict_arguments(request, catalog, self._max_prompt_chars)
            except InvalidRequest as error:
                raise CallFailed(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from None
            if len(prompt) <= INLINE_PROMPT_CHARS:
                predictions = self._predictor.predict(prompt, models)
            else:
                predictions = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._predictor.predict, prompt, models)
            return predict_response(predictions, catalog)
        finally:  # every call the service answered, refused ones too
            REQUEST_SECONDS.labels(method="Predict").observe(time.perf_counter() - started)

    async def ExpectedRemaining(self, request: predictor_pb2.ExpectedRemainingRequest,
                                context: grpc.aio.ServicerContext) -> predictor_pb2.ExpectedRemainingResponse:
        return await answer_unary(self._expected_remaining(request), context, on_error=_remaining_failed)

    async def _expected_remaining(self, request: predictor_pb2.ExpectedRemainingRequest
                                  ) -> predictor_pb2.ExpectedRemainingResponse:
        started = time.perf_counter()
        try:
            try:
                if len(request.queries) <= INLINE_REMAINING_QUERIES:
                    return self._remaining(request)
                return await asyncio.get_running_loop().run_in_executor(self._executor, self._remaining, request)
            except InvalidRequest as error:
                raise CallFailed(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from None
        finally:  # every call the service answered, refused ones too
            REQUEST_SECONDS.labels(method="ExpectedRemaining").observe(time.perf_counter() - started)

    def _remaining(self, request: predictor_pb2.ExpectedRemainingRequest) -> predictor_pb2.ExpectedRemainingResponse:
        groups = remaining_groups(request, self._predictor.catalog, self._max_remaining_queries)
        answers = [self._predictor.expected_remaining_tokens_many(
            g.model, g.predicted_output_tokens, g.generated_tokens, g.max_tokens) for g in groups]
        return remaining_response(len(request.queries), groups, answers)


def count_predict_error(code: grpc.StatusCode) -> None:
    ERRORS.labels(method="Predict", code=code.name).inc()


def _remaining_failed(code: grpc.StatusCode) -> None:
    ERRORS.labels(method="ExpectedRemaining", code=code.name).inc()


def count_malformed(method: str) -> None:
    """A request that did not decode (answered INVALID_ARGUMENT by bear.common.service), counted as its method's own
    refusals are (PredictStream's as Predict's); health's and reflection's are not the predictor's calls."""
    service, _, name = method.rpartition("/")
    if service == f"/{SERVICE_NAME}":
        ERRORS.labels(method="ExpectedRemaining" if name == "ExpectedRemaining" else "Predict",
                      code=grpc.StatusCode.INVALID_ARGUMENT.name).inc()


def register(servicer: PredictorServicer) -> Callable[[grpc.aio.Server], list[str]]:
    """What `bear.common.service.start_server` calls to add the service."""

    def add(server: grpc.aio.Server) -> list[str]:
        predictor_pb2_grpc.add_PredictorServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return add
