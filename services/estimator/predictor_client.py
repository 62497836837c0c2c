"""Residents' remaining lengths from the predictor service (bear.v1.Predictor/ExpectedRemaining), with a deadline.

A `RemainingSource` for `bear.estimator.remaining.RemainingLengths`: one call per model and batch of rows; any
failure (unreachable, too slow, an error status) is `RemainingUnavailable`, INVALID_ARGUMENT about the model marked
as an unknown model.
"""

from __future__ import annotations

import grpc
import numpy as np

from bear.common.channels import CLIENT_CHANNEL_OPTIONS
from bear.common.service import client_interceptors
from bear.estimator.remaining import RemainingUnavailable
from bear.v1 import predictor_pb2, predictor_pb2_grpc


class PredictorRemainingClient:
    def __init__(self, address: str, timeout_s: float) -> None:
        self._channel = grpc.aio.insecure_channel(address, options=CLIENT_CHANNEL_OPTIONS,
                                               interceptors=client_interceptors())
        self._stub = predictor_pb2_grpc.PredictorStub(self._channel)
        self._timeout_s = timeout_s

    async def __call__(self, model: str, predicted: np.ndarray, generated: np.ndarray,
                       max_tokens: np.ndarray) -> np.ndarray:
        request = predictor_pb2.ExpectedRemainingRequest(queries=[
            predictor_pb2.RemainingQuery(model=model, predicted_output_tokens=float(p), generated_tokens=int(g),
                                         max_tokens=int(m))
            for p, g, m in zip(predicted, generated, max_tokens, strict=True)])
        try:
            reply = await self._stub.ExpectedRemaining(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as error:
            details = error.details() or ""
            unknown_model = error.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown model" in details
            raise RemainingUnavailable(f"{error.code().name}: {details}", unknown_model=unknown_model) from None
        if len(reply.remaining_tokens) != len(request.queries):
            raise RemainingUnavailable(f"the predictor answered {len(reply.remaining_tokens)} rows for "
                                       f"{len(request.queries)}")
        return np.array(reply.remaining_tokens, dtype=np.float64)

    async def close(self) -> None:
        await self._channel.close()
