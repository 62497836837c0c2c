"""The simulated pool's instances: the paper's three Qwen3 deployments on H100s with vLLM's H100 online defaults.

Engine settings (vLLM 0.32 for online serving on an H100): token budget 8192, max_num_seqs 1024, block size 16,
chunked prefill, async scheduling, max_model_len 40960 (Qwen3's context). KV capacity per GPU is the memory vLLM
leaves for the cache: gpu_memory_utilization × 80 GiB − weights − a reserve for activations, CUDA graphs and the
runtime, divided by the bytes a block holds on that GPU (K and V, every layer, the GPU's share of KV heads, bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

from bear.core.state import EngineConfig
from bear.evaluation.model_shapes import GpuShape, gpu_shape

GIB = 1024**3
GPU_MEMORY_BYTES = 80 * GIB  # H100 SXM 80 GB
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
# Assumption: activations at a 8192-token budget, CUDA graphs and the CUDA/PyTorch runtime, per GPU.
RUNTIME_RESERVE_BYTES = 3 * GIB
BF16_BYTES = 2

# vLLM's online-serving defaults on an H100 (EngineArgs for GPUs with >= 70 GiB: budget 8192, 1024 sequences).
H100_BUDGET_TOKENS = 8192
H100_MAX_NUM_SEQS = 1024
BLOCK_SIZE = 16
QWEN3_MAX_MODEL_LEN = 40_960


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One simulated instance: which model (the predictor catalogue's name), on which shape, with which engine."""

    instance_id: str
    model: str  # catalogue name, e.g. "Qwen3-8B"
    shape_name: str  # reference-model name, e.g. "qwen3-8b"
    tensor_parallel: int
    engine: EngineConfig


def parameter_count(shape: GpuShape, tied_embeddings: bool) -> int:
    """Weights of the whole model (attention, MLP, embeddings; norms are negligible)."""
    m = shape.model
    per_layer = (m.hidden_size * (m.num_attention_heads + 2 * m.num_key_value_heads) * m.head_dim
                 + m.num_attention_heads * m.head_dim * m.hidden_size + 3 * m.hidden_size * m.intermediate_size)
    return m.num_layers * per_layer + m.vocab_size * m.hidden_size * (1 if tied_embeddings else 2)


def kv_blocks(shape: GpuShape, tied_embeddings: bool) -> int:
    """Usable KV blocks on each GPU of the deployment (vLLM sizes the cache per GPU; TP shares the blocks)."""
    weights = parameter_count(shape, tied_embeddings) * BF16_BYTES / shape.tensor_parallel
    free = GPU_MEMORY_UTILIZATION * GPU_MEMORY_BYTES - weights - RUNTIME_RESERVE_BYTES
    block_bytes = 2 * shape.model.num_layers * shape.num_kv_heads * shape.model.head_dim * BF16_BYTES * BLOCK_SIZE
    return int(free // block_bytes)


def h100_engine(shape: GpuShape, tied_embeddings: bool) -> EngineConfig:
    return EngineConfig(
        max_num_batched_tokens=H100_BUDGET_TOKENS,
        max_num_seqs=H100_MAX_NUM_SEQS,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=kv_blocks(shape, tied_embeddings),
        max_model_len=QWEN3_MAX_MODEL_LEN,
        async_scheduling=True,
    )


def paper_pool() -> tuple[InstanceSpec, ...]:
    """Qwen3-0.6B and Qwen3-8B on one H100 each, Qwen3-32B on two with tensor parallelism (paper §5.1)."""
    deployments = (("Qwen3-0.6B", "qwen3-0.6b", 1, True), ("Qwen3-8B", "qwen3-8b", 1, False),
                   ("Qwen3-32B", "qwen3-32b", 2, False))
    specs = []
    for model, shape_name, tp, tied in deployments:
        shape = gpu_shape(shape_name, tp)
        specs.append(InstanceSpec(f"{shape_name}-0", model, shape_name, tp, h100_engine(shape, tied)))
    return tuple(specs)
