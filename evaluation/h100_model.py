"""The reference H100 step-time model of the simulated pool: one vLLM engine step's duration from its composition.

Independent of eq. 12 (which BEAR fits and must not be graded against itself): it is assembled, op by op, from NVIDIA
AIConfigurator's measured H100 SXM kernel tables under vLLM (`kernel_tables.py`), for the exact per-GPU shapes of
Qwen3-0.6B and Qwen3-8B (one H100 each) and Qwen3-32B (tensor parallelism 2). A step schedules m tokens over r
requests; a request with exactly one scheduled token is a decode, any other a prefill chunk (vLLM's attention split,
`bear.core.batch_time.is_decode`). m is padded to vLLM's CUDA-graph capture size when m <= 512.

    per layer:  GEMMs QKV, attention-out, gate+up, down at m tokens
              + attention, one FlashAttention call as in vLLM: every request reads its cached keys (context + 1,
                decode table at r sequences and their total), and the prefill chunks add their causal compute
                (context table at their count and total pairs q·c + q(q+1)/2, minus the kernel's one-sequence
                floor already paid). A chunk thus costs a full prompt with as many causal pairs — AIConfigurator's
                own prefix correction where attention is compute-bound — plus reading its context. The rule is
                monotone by construction: more requests, tokens or context never cost less, even when a decode
                becomes a chunk. Mixed contexts are costed at their mean (same sequence count, same total keys).
              + memory-bound kernels: 2 fused add+RMSNorm, q/k RMSNorm, RoPE, KV-cache write, SiLU-and-mul
              + under tensor parallelism 2: two vLLM custom all-reduces of m × hidden bf16 elements
    per step:   LM head GEMM for r rows (vLLM 0.32 computes logits for every scheduled request — partial prefill
                chunks too, their sample is discarded: `logits_indices = query_start_loc[1:] - 1` in
                gpu_model_runner.py), sampler, embedding and final norm, one more all-reduce under TP (embedding)
              + CPU overhead: step_overhead_s + request_overhead_s · r
    noisy time = noiseless time × exp(sigma·Z − sigma²/2), Z ~ N(0, 1) from the caller's generator.

Known simplifications: the TP logits gather is omitted; ops never overlap; a chunk with long context pays for
reading it although compute-bound attention hides part of that read (a few % of its attention); b new prompts pay the
decode kernel's per-sequence cost too (~0.2 us each per layer). Constants are in `hardware.py`.

Sanity figures (noiseless, ms; `python -m bear.evaluation.tools.sanity_figures` adds the breakdown): decode-only
steps at 1k context, and one prompt prefilled in one step (its TTFT on an idle instance):

    model             decode b=1   b=32   b=64   b=256   prefill 2048   prefill 8192
    qwen3-0.6b              2.2     3.7    5.0    13.0            6.9           31.1
    qwen3-8b                7.1     9.5   11.8    23.0           45.4          208.8
    qwen3-32b (TP2)        14.4    17.4   19.5    32.7          110.6          499.9

Against figures commonly reported for vLLM on H100 (recalled from public benchmarks, for similar but not identical
models, so order-of-magnitude checks): an 8B bf16 model decodes one stream at ~6–7 ms per token and takes ~10–30 ms
per step at batch 64; a 2k-token prompt reaches its first token in ~40–70 ms on an idle GPU; 32B-class bf16 models
on 2×H100 (TP2) decode one stream at ~13–16 ms per token; sub-1B models are launch-bound at ~2–3 ms per token.
Rooflines agree: the 8B batch-1 decode reads 16.4 GB of weights in 7.1 ms (69% of the 3.35 TB/s peak, with launch
and CPU overhead), its 8192-token prefill runs the linear layers at ~745 TFLOPS (75% of the 989 TFLOPS bf16 peak).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from bear.core.batch_time import is_decode
from bear.evaluation.hardware import DEFAULT_CONSTANTS, ReferenceConstants
from bear.evaluation.kernel_tables import KernelTables, PiecewiseLinear, load_tables
from bear.evaluation.model_shapes import GpuShape, gpu_shape


class StepEntry(NamedTuple):
    """One scheduled request of a step, as `BatchFeatures.of_batch` takes it (a plain 3-tuple works too)."""

    num_prefill_tokens: int  # prompt (or recomputed) tokens scheduled this step
    num_decode_tokens: int  # 0 or 1
    num_context_tokens: int  # tokens already in the KV cache before this step


@dataclass(frozen=True, slots=True)
class StepComposition:
    """What the cost of a step depends on, summed over its entries."""

    num_requests: int
    num_tokens: int
    num_prefills: int  # requests with more than one scheduled token (vLLM's attention split)
    prefill_pairs: int  # Σ q·c + q(q+1)/2 over prefill chunks
    num_decodes: int  # requests with exactly one scheduled token
    cached_keys: int  # Σ (context + 1) over all requests: the cached keys attention reads, as a decode would

    @staticmethod
    def of(entries: Iterable[tuple[int, int, int]]) -> StepComposition:
        requests = tokens = prefills = pairs = decodes = keys = 0
        for index, entry in enumerate(entries):
            try:
                prefill, decode, context = entry
            except (TypeError, ValueError):
                prefill, decode, context = _checked(index, entry)
            # fast path for plain non-negative ints with a valid prefill/decode split; anything else is checked in full
            if not (type(prefill) is int and type(decode) is int and type(context) is int and context >= 0
                    and ((decode == 0 and prefill > 0) or (decode == 1 and prefill == 0))):
                prefill, decode, context = _checked(index, entry)
            scheduled = prefill + decode
            requests += 1
            tokens += scheduled
            keys += context + 1
            if is_decode(scheduled):
                decodes += 1
            else:
                prefills += 1
                pairs += scheduled * context + scheduled * (scheduled + 1) // 2
        if requests == 0:
            raise ValueError("a step schedules at least one request; got no entries")
        return StepComposition(requests, tokens, prefills, pairs, decodes, keys)


def _checked(index: int, entry: object) -> tuple[int, int, int]:
    """The entry as three ints, or a ValueError naming the entry and the field."""
    values = tuple(entry) if isinstance(entry, (tuple, list)) else ()
    if len(values) != 3:
        raise ValueError(f"step entry {index}: expected (prefill tokens, decode tokens, context tokens), got {entry!r}")
    for name, value in zip(StepEntry._fields, values, strict=True):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"step entry {index}: {name} must be an integer >= 0, got {value!r}")
    prefill, decode, context = (int(v) for v in values)
    if decode not in (0, 1):
        raise ValueError(f"step entry {index}: num_decode_tokens must be 0 or 1, got {decode}")
    if prefill and decode:
        raise ValueError(f"step entry {index}: a request schedules prefill tokens or one decode token, not both")
    if prefill + decode == 0:
        raise ValueError(f"step entry {index}: a scheduled request has at least one token")
    return prefill, decode, context


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """A step's noiseless time by component, in seconds (summed over layers)."""

    linear_s: float  # the four per-layer GEMMs
    attention_s: float  # prefill and decode attention
    allreduce_s: float  # tensor-parallel all-reduces (0 without tensor parallelism)
    memory_ops_s: float  # norms, RoPE, KV-cache writes, activation, embedding, sampler
    lm_head_s: float  # LM head GEMM
    overhead_s: float  # engine CPU work on the critical path

    @property
    def total_s(self) -> float:
        return (self.linear_s + self.attention_s + self.allreduce_s + self.memory_ops_s + self.lm_head_s
                + self.overhead_s)


class ReferenceStepModel:
    """Step time of one simulated vLLM instance on H100s. Pure: no state beyond its tables and constants."""

    def __init__(self, shape: GpuShape, tables: KernelTables,
                 constants: ReferenceConstants = DEFAULT_CONSTANTS) -> None:
        heads = (shape.num_q_heads, shape.num_kv_heads)
        if heads not in tables.context:
            raise ValueError(f"no attention tables for {heads[0]} query / {heads[1]} KV heads per GPU")
        if shape.tensor_parallel not in (1, 2):
            raise ValueError(f"the all-reduce table covers tensor parallelism 2 only, got {shape.tensor_parallel}")
        self.shape = shape
        self.constants = constants
        gemms = {name: tables.gemm_curve(n, k) for name, (n, k) in shape.gemms().items()}
        layer_curves = [gemms[name] for name in ("qkv", "attention_out", "gate_up", "down")]
        self._layer_gemm = PiecewiseLinear(layer_curves[0].xs, tuple(map(sum, zip(*(c.ys for c in layer_curves)))))
        self._lm_head = gemms["lm_head"]
        self._context = tables.context[heads]
        self._generation = tables.generation[heads]
        self._allreduce = tables.allreduce_tp2 if shape.tensor_parallel == 2 else None
        self._launch_s = self._generation(1, 1)  # the attention kernel's floor: one sequence, one key
        model, c = shape.model, constants
        qk_width = (shape.num_q_heads + shape.num_kv_heads) * model.head_dim
        kv_width = shape.num_kv_heads * model.head_dim
        # bytes per token of one layer's memory-bound kernels, and how many kernels that is
        self._layer_bytes_per_token = c.activation_bytes * (
            2 * 4 * model.hidden_size  # two fused add+RMSNorm: read x and residual, write both
            + 2 * qk_width  # q/k RMSNorm: read and write q and k
            + 2 * qk_width  # RoPE on q and k
            + 4 * kv_width  # KV-cache write: read k and v, write them into the cache
            + 3 * shape.ffn_width)  # SiLU-and-mul: read gate and up, write the product
        self._layer_kernels = 6
        self._step_bytes_per_token = c.activation_bytes * (2 + 4) * model.hidden_size  # embedding gather, final norm
        self._sampler_bytes_per_request = c.sampler_passes * c.logits_bytes * model.vocab_size

    @classmethod
    def for_model(cls, model: str, tensor_parallel: int = 1,
                  constants: ReferenceConstants = DEFAULT_CONSTANTS) -> ReferenceStepModel:
        """`for_model("qwen3-8b")`, `for_model("qwen3-32b", tensor_parallel=2)`; tables load on first use."""
        return cls(gpu_shape(model, tensor_parallel), load_tables(), constants)

    def breakdown(self, entries: Iterable[tuple[int, int, int]]) -> StepBreakdown:
        step = StepComposition.of(entries)
        c, layers = self.constants, self.shape.model.num_layers
        padded = c.cudagraph_tokens(step.num_tokens)
        m = padded if padded is not None else step.num_tokens
        allreduce_s = 0.0
        if self._allreduce is not None:
            one = self._allreduce(m * self.shape.model.hidden_size, cuda_graph=padded is not None)
            allreduce_s = (2 * layers + 1) * one
        memory_s = (layers * c.memory_op_s(m * self._layer_bytes_per_token, self._layer_kernels)
                    + c.memory_op_s(m * self._step_bytes_per_token, 2)
                    + c.memory_op_s(step.num_requests * self._sampler_bytes_per_request, c.sampler_passes))
        return StepBreakdown(
            linear_s=layers * self._layer_gemm(m),
            attention_s=layers * self._attention_s(step),
            allreduce_s=allreduce_s,
            memory_ops_s=memory_s,
            lm_head_s=self._lm_head(step.num_requests),
            overhead_s=c.step_overhead_s + c.request_overhead_s * step.num_requests,
        )

    def noiseless_step_time_s(self, entries: Iterable[tuple[int, int, int]]) -> float:
        return self.breakdown(entries).total_s

    def step_time_s(self, entries: Iterable[tuple[int, int, int]], rng: np.random.Generator) -> float:
        """Noisy step time: the noiseless time times a mean-one log-normal factor drawn from `rng`."""
        sigma = self.constants.noise_sigma
        return self.noiseless_step_time_s(entries) * math.exp(sigma * float(rng.standard_normal()) - sigma * sigma / 2)

    def _attention_s(self, step: StepComposition) -> float:
        """One layer's attention call: every sequence reads its cached keys; prefill chunks add their causal compute."""
        read_s = self._generation(step.num_requests, step.cached_keys)
        if not step.num_prefills:
            return read_s
        return read_s + max(0.0, self._context(step.num_prefills, step.prefill_pairs) - self._launch_s)
