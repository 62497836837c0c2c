"""Small builders of the estimator's inputs (snapshots as the snapshotter publishes them, dispatch records as the
router writes them), so that a test states only what it is about."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from bear.common import redis_keys
from bear.core.batch_time import BatchTimeCoefficients
from bear.v1 import calibration_pb2, router_pb2, snapshot_pb2

COEFFICIENTS = BatchTimeCoefficients(b0=0.004, b1=2e-5, b2=1e-8, b3=1e-9)
PREFILL_TOKENS_PER_S = 40_000.0
BLOCK_SIZE = 16


def engine(**overrides: object) -> snapshot_pb2.EngineConfig:
    settings: dict[str, object] = dict(max_num_batched_tokens=2048, max_num_seqs=256, block_size=BLOCK_SIZE,
                                       num_gpu_blocks=1000, max_model_len=32768, enable_chunked_prefill=True,
                                       enable_prefix_caching=True)
    settings.update(overrides)
    return snapshot_pb2.EngineConfig(**settings)  # type: ignore[arg-type]


def batch_time(coefficients: BatchTimeCoefficients = COEFFICIENTS,
               prefill_tokens_per_s: float = PREFILL_TOKENS_PER_S) -> calibration_pb2.BatchTimeCoefficients:
    return calibration_pb2.BatchTimeCoefficients(
        intercept_s=coefficients.b0, per_token_s=coefficients.b1, per_decode_context_token_s=coefficients.b2,
        per_prefill_attention_token_s=coefficients.b3, num_samples=200, mape=0.05,
        prefill_tokens_per_s=prefill_tokens_per_s)


def decoding(request_id: str, prompt: int = 100, output: int = 1, *, placeholders: int = 0,
             max_tokens: int = 0) -> snapshot_pb2.RequestState:
    """A running request whose prompt is done."""
    computed = prompt + output + placeholders - 1
    return snapshot_pb2.RequestState(request_id=request_id, num_prompt_tokens=prompt, num_computed_tokens=computed,
                                     num_output_tokens=output, num_output_placeholders=placeholders,
                                     max_tokens=max_tokens, num_allocated_blocks=-(-computed // BLOCK_SIZE))


def queued(request_id: str, prompt: int = 100) -> snapshot_pb2.RequestState:
    return snapshot_pb2.RequestState(request_id=request_id, num_prompt_tokens=prompt)


def snapshot(instance_id: str, taken_at_s: float, running: Sequence[snapshot_pb2.RequestState] = (),
             waiting: Sequence[snapshot_pb2.RequestState] = (), *, read_at_s: float | None = None, model: str = "m",
             engine_config: snapshot_pb2.EngineConfig | None = None,
             coefficients: calibration_pb2.BatchTimeCoefficients | None = None, calibrated: bool = True,
             sequence_number: int | None = None) -> snapshot_pb2.InstanceSnapshot:
    """A snapshot whose free blocks are what its running requests leave."""
    engine_config = engine_config or engine()
    message = snapshot_pb2.InstanceSnapshot(
        instance_id=instance_id, pool="pool", model=model, taken_at_s=taken_at_s,
        read_at_s=taken_at_s if read_at_s is None else read_at_s,
        sequence_number=int(taken_at_s * 1000) if sequence_number is None else sequence_number,
        engine=engine_config, running=list(running), waiting=list(waiting),
        num_free_blocks=engine_config.num_gpu_blocks - sum(r.num_allocated_blocks for r in running))
    if calibrated:
        message.batch_time.CopyFrom(coefficients or batch_time())
    return message


def registration(instance_id: str, model: str = "m") -> snapshot_pb2.InstanceRegistration:
    return snapshot_pb2.InstanceRegistration(instance_id=instance_id, pool="pool", model=model,
                                             endpoint=f"http://{instance_id}:8000")


def dispatch_record(request_id: str, instance_id: str, dispatched_at_s: float, prompt_tokens: int = 100,
                    predicted_output_tokens: float = 50.0, model: str = "m") -> router_pb2.DispatchRecord:
    return router_pb2.DispatchRecord(request_id=request_id, instance_id=instance_id, model=model,
                                     dispatched_at_s=dispatched_at_s, prompt_tokens=prompt_tokens,
                                     predicted_output_tokens=predicted_output_tokens)


def record_dispatch(client, record: router_pb2.DispatchRecord) -> object:  # noqa: ANN001 - a redis client
    """What the router writes for a dispatched query (bear.common.redis_keys); with an asyncio client, await it."""
    pipe = client.pipeline(transaction=False)
    pipe.set(redis_keys.dispatch_key(record.request_id), record.SerializeToString(),
             px=int(redis_keys.DISPATCH_TTL_S * 1000))
    pipe.zadd(redis_keys.dispatches_key(record.instance_id), {record.request_id: record.dispatched_at_s})
    return pipe.execute()


def fallback_lengths(predicted: float) -> Callable[[snapshot_pb2.RequestState], int]:
    """The estimator's fallback remaining length of a resident predicted at `predicted` tokens (in flight included)."""

    def remaining(request: snapshot_pb2.RequestState) -> int:
        generated = request.num_output_tokens + request.num_output_placeholders
        left = max(1.0, predicted - generated)
        if request.max_tokens:
            left = min(left, request.max_tokens - generated)
        return max(1, round(float(np.maximum(left, 0.0)) + request.num_output_placeholders))

    return remaining


class FakeClock:
    """Wall-clock time that moves only when told."""

    def __init__(self, now_s: float = 1_800_000_000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
