"""Every constant of the reference H100 step model that does not come from a measured kernel table, in one place.

The kernel tables (GEMMs, attention, all-reduce) are NVIDIA AIConfigurator's H100 SXM measurements under vLLM 0.24.0
(`data/NOTICE`). What they do not cover — memory-bound elementwise kernels, CUDA-graph padding, the engine's CPU work
per step, and run-to-run noise — is set here, each value with its origin. "Assumption" marks a value chosen by
judgement, not taken from a measurement; change it here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReferenceConstants:
    # --- memory-bound kernels (RMSNorm, RoPE, KV-cache write, SiLU-and-mul, embedding, sampler) -------------------
    # AIConfigurator's own model of these kernels (`query_mem_op`): bytes / (mem_bw × scaling) + constant latency.
    hbm_bytes_per_s: float = 3.35e12  # H100 SXM HBM3 peak; systems/h100_sxm.yaml `mem_bw`
    hbm_efficiency: float = 0.8  # achieved share of peak; h100_sxm.yaml `mem_bw_empirical_scaling_factor`
    memory_kernel_s: float = 3e-6  # fixed cost per memory-bound kernel; h100_sxm.yaml `mem_empirical_constant_latency`
    activation_bytes: int = 2  # bf16 activations and KV cache (the models' torch_dtype, vLLM's default kv dtype)
    logits_bytes: int = 4  # vLLM's sampler works on fp32 logits
    sampler_passes: int = 3  # assumption: logits written by the LM head, read by softmax, read again by sampling

    # --- CUDA graphs (vLLM 0.32 defaults on H100, `vllm/config/compilation.py`) ------------------------------------
    # Steps of at most this many tokens replay a captured graph: their token count is padded up to the next capture
    # size ([1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)) and all-reduces run in graph mode; larger steps
    # run eagerly (piecewise). `max_cudagraph_capture_size` is capped at 512 by default on non-Blackwell GPUs.
    cudagraph_max_tokens: int = 512

    # --- engine CPU work per step (assumptions) ----------------------------------------------------------------------
    # vLLM V1 with async scheduling (the default on GPUs) prepares step N+1 while step N runs, so what remains on the
    # critical path is the sampled-token hand-off and the next launch. Assumption: 0.5 ms per step plus 2 us per
    # scheduled request (input preparation, block tables, sampler bookkeeping). With these, a batch-1 decode of
    # Qwen3-8B takes 7.1 ms, close to the 6–7 ms per output token commonly reported for 8B bf16 models under vLLM on
    # one H100 (see `h100_model` for the sanity table); such end-to-end figures do not separate the CPU part from
    # kernel time, hence "assumption".
    step_overhead_s: float = 0.5e-3
    request_overhead_s: float = 2e-6

    # --- noise ------------------------------------------------------------------------------------------------------
    # Each step's time is multiplied by exp(sigma·Z − sigma²/2), Z standard normal: log-normal, mean 1, coefficient
    # of variation ≈ sigma. Assumption: 2% step-to-step jitter for steps of identical composition (clock, memory and
    # launch variability); alone it gives ≈1.6% mean absolute percentage error to a perfect batch-time model, below
    # the ~4% the paper reports for eq. 12 on real H100s, which also contains model misfit.
    noise_sigma: float = 0.02

    def __post_init__(self) -> None:
        for name in ("hbm_bytes_per_s", "hbm_efficiency", "memory_kernel_s", "step_overhead_s", "request_overhead_s",
                     "noise_sigma"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"reference constant {name} must be >= 0, got {value!r}")
        if not 0 < self.hbm_efficiency <= 1 or self.hbm_bytes_per_s <= 0:
            raise ValueError("HBM bandwidth must be positive and its efficiency in (0, 1]")
        largest = self.cudagraph_max_tokens
        if largest < 0 or (largest > 0 and self.cudagraph_tokens(largest) != largest):
            raise ValueError(f"cudagraph_max_tokens must be 0 (no CUDA graphs) or a capture size, got {largest}")

    def memory_op_s(self, num_bytes: float, num_kernels: int = 1) -> float:
        """Time of `num_kernels` memory-bound kernels moving `num_bytes` in total."""
        return num_kernels * self.memory_kernel_s + num_bytes / (self.hbm_bytes_per_s * self.hbm_efficiency)

    def cudagraph_tokens(self, num_tokens: int) -> int | None:
        """The capture size a step of `num_tokens` is padded to, or None if it runs without a CUDA graph."""
        if num_tokens > self.cudagraph_max_tokens:
            return None
        if num_tokens <= 2:
            return num_tokens
        if num_tokens <= 4:
            return 4
        if num_tokens <= 256:
            return -(-num_tokens // 8) * 8
        return -(-num_tokens // 16) * 16


DEFAULT_CONSTANTS = ReferenceConstants()
