"""Per-GPU shapes of the pool's models, as the reference H100 model and the table extraction need them.

Values are those of the Hugging Face `config.json` of Qwen3-0.6B, Qwen3-8B and Qwen3-32B (copied, with their source
commit, under `../shared/data/aiconfigurator_h100/model_configs/`; a test checks them against those files when present).
Tensor parallelism splits attention heads, the FFN width and the vocabulary across GPUs, as vLLM's column/row-parallel
linear layers and vocab-parallel LM head do.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelShape:
    """One model's architecture (whole model, before tensor parallelism)."""

    name: str  # BEAR's model name (kebab case, as in pool configs)
    num_layers: int
    hidden_size: int
    intermediate_size: int  # FFN width (gate and up projections each have this many outputs)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int


@dataclass(frozen=True, slots=True)
class GpuShape:
    """What one GPU of a tensor-parallel group computes per layer."""

    model: ModelShape
    tensor_parallel: int

    @property
    def num_q_heads(self) -> int:
        return self.model.num_attention_heads // self.tensor_parallel

    @property
    def num_kv_heads(self) -> int:
        return self.model.num_key_value_heads // self.tensor_parallel

    @property
    def ffn_width(self) -> int:
        return self.model.intermediate_size // self.tensor_parallel

    @property
    def vocab_width(self) -> int:
        return self.model.vocab_size // self.tensor_parallel

    def gemms(self) -> dict[str, tuple[int, int]]:
        """(n, k) of every GEMM one GPU runs: out = x[m, k] @ W[k, n]. The four per-layer ones, then the LM head."""
        h, d = self.model.hidden_size, self.model.head_dim
        return {
            "qkv": ((self.num_q_heads + 2 * self.num_kv_heads) * d, h),  # QKVParallelLinear, one GEMM
            "attention_out": (h, self.num_q_heads * d),  # RowParallelLinear (followed by an all-reduce under TP)
            "gate_up": (2 * self.ffn_width, h),  # MergedColumnParallelLinear, one GEMM
            "down": (h, self.ffn_width),  # RowParallelLinear (followed by an all-reduce under TP)
            "lm_head": (self.vocab_width, h),  # ParallelLMHead (vocab-parallel)
        }


QWEN3_0_6B = ModelShape("qwen3-0.6b", num_layers=28, hidden_size=1024, intermediate_size=3072,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151_936)
QWEN3_8B = ModelShape("qwen3-8b", num_layers=36, hidden_size=4096, intermediate_size=12_288,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151_936)
QWEN3_32B = ModelShape("qwen3-32b", num_layers=64, hidden_size=5120, intermediate_size=25_600,
                       num_attention_heads=64, num_key_value_heads=8, head_dim=128, vocab_size=151_936)

# The deployments the reference model covers: (model, tensor parallelism) as in the paper's pool (§5.1).
SUPPORTED: dict[tuple[str, int], GpuShape] = {
    (QWEN3_0_6B.name, 1): GpuShape(QWEN3_0_6B, 1),
    (QWEN3_8B.name, 1): GpuShape(QWEN3_8B, 1),
    (QWEN3_32B.name, 2): GpuShape(QWEN3_32B, 2),
}

# Hugging Face config file of each model in the AIConfigurator copy (used by the extraction script and a test).
HF_CONFIG_FILES = {
    QWEN3_0_6B.name: "Qwen--Qwen3-0.6B_config.json",
    QWEN3_8B.name: "Qwen--Qwen3-8B_config.json",
    QWEN3_32B.name: "Qwen--Qwen3-32B_config.json",
}


def gpu_shape(model: str, tensor_parallel: int) -> GpuShape:
    key = (model.lower(), tensor_parallel)
    if key not in SUPPORTED:
        supported = ", ".join(f"{name} (tensor_parallel={tp})" for name, tp in SUPPORTED)
        raise ValueError(f"no reference H100 model for {model!r} with tensor_parallel={tensor_parallel}; "
                         f"supported: {supported}")
    return SUPPORTED[key]
