"""The reference H100 step model: table fidelity per component, monotonicity, tensor parallelism, noise, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bear.evaluation.h100_model import ReferenceStepModel, StepComposition, StepEntry
from bear.evaluation.hardware import DEFAULT_CONSTANTS, ReferenceConstants
from bear.evaluation.kernel_tables import load_tables
from bear.evaluation.model_shapes import SUPPORTED

TABLES = load_tables()
RAW = TABLES.raw
MODELS = {key: ReferenceStepModel.for_model(*key) for key in SUPPORTED}
QWEN3_8B = MODELS[("qwen3-8b", 1)]
QWEN3_32B = MODELS[("qwen3-32b", 2)]


def _raw_ms(table: str, heads: str, batch: int, length: int) -> float:
    batches, lengths = list(RAW[f"{table}_batch_{heads}"]), list(RAW[f"{table}_length_{heads}"])
    return float(RAW[f"{table}_latency_ms_{heads}"][batches.index(batch), lengths.index(length)])


def decodes(count: int, context: int) -> list[StepEntry]:
    return [StepEntry(0, 1, context)] * count


# --- each component reproduces its table -------------------------------------------------------------------------

@pytest.mark.parametrize(("batch", "kv_length"), [(32, 2047), (256, 1023), (1024, 127), (8, 8191), (128, 63)])
def test_decode_attention_is_the_generation_table_at_its_points(batch: int, kv_length: int) -> None:
    per_layer = QWEN3_8B.breakdown(decodes(batch, kv_length - 1)).attention_s / 36
    assert per_layer == pytest.approx(_raw_ms("generation", "32_8", batch, kv_length) * 1e-3, rel=1e-9)


@pytest.mark.parametrize(("batch", "length"), [(1, 512), (1, 2048), (1, 8192), (1, 16384), (4, 2048), (8, 1024)])
def test_prefill_attention_is_the_context_table_at_its_points(batch: int, length: int) -> None:
    per_layer = QWEN3_8B.breakdown([StepEntry(length, 0, 0)] * batch).attention_s / 36
    # exact for one prompt; b prompts also pay the decode kernel's per-sequence cost of b sequences (stated overlap)
    tolerance = 1e-9 if batch == 1 else 0.01
    assert per_layer == pytest.approx(_raw_ms("context", "32_8", batch, length) * 1e-3, rel=tolerance)


def test_a_chunk_after_context_adds_the_compute_of_its_causal_pairs_to_reading_its_context() -> None:
    # 1024 new tokens after 3584 of context: 1024·3584 + 1024·1025/2 pairs, those of a 2896.4-token prompt
    chunk = QWEN3_8B.breakdown([StepEntry(1024, 0, 3584)]).attention_s
    pairs = 1024 * 3584 + 1024 * 1025 // 2
    context, generation = TABLES.context[(32, 8)], TABLES.generation[(32, 8)]
    expected = generation(1, 3585) + context(1, pairs) - generation(1, 1)
    assert chunk == pytest.approx(36 * expected, rel=1e-12)
    alone, whole = (QWEN3_8B.breakdown([StepEntry(n, 0, 0)]).attention_s for n in (1024, 4608))
    assert alone < chunk < whole
    # a short chunk after a long context costs at least what decoding after that context does
    tail, decode = (QWEN3_8B.breakdown([e]).attention_s for e in (StepEntry(16, 0, 60_000), StepEntry(0, 1, 60_000)))
    assert tail > decode


def test_one_attention_call_reads_every_request_s_keys_and_adds_prefill_compute_once() -> None:
    prefill, decode = [StepEntry(2048, 0, 0)], decodes(64, 1000)
    context, generation = TABLES.context[(32, 8)], TABLES.generation[(32, 8)]
    mixed = QWEN3_8B.breakdown(prefill + decode).attention_s
    expected = generation(65, 64 * 1001 + 1) + context(1, 2048 * 2049 // 2) - generation(1, 1)
    assert mixed == pytest.approx(36 * expected, rel=1e-12)


@pytest.mark.parametrize("tokens", [1024, 2048, 4096, 8192])
def test_linear_layers_are_the_four_gemms_at_the_step_token_count(tokens: int) -> None:
    shapes = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]  # QKV, attention-out, gate+up, down
    expected = sum(TABLES.gemm_curve(n, k)(tokens) for n, k in shapes)
    assert QWEN3_8B.breakdown([StepEntry(tokens, 0, 0)]).linear_s == pytest.approx(36 * expected, rel=1e-12)
    # on-grid GEMMs are the table's isotonic column: at m = 8192 the QKV projection of Qwen3-8B (n 6144, k 4096)
    column = [tuple(nk) for nk in RAW["gemm_nk"].tolist()].index((6144, 4096))
    at_8192 = RAW["gemm_latency_ms"][column][list(RAW["gemm_m"]).index(8192)] * 1e-3
    assert TABLES.gemm_curve(6144, 4096)(8192) == pytest.approx(at_8192, rel=0.05)


def test_lm_head_runs_once_per_scheduled_request_including_partial_prefills() -> None:
    step = decodes(40, 500) + [StepEntry(1500, 0, 0)]
    assert QWEN3_8B.breakdown(step).lm_head_s == pytest.approx(TABLES.gemm_curve(151_936, 4096)(41), rel=1e-12)


def test_memory_bound_kernels_and_overhead_follow_the_stated_constants() -> None:
    c = DEFAULT_CONSTANTS
    b = QWEN3_8B.breakdown([StepEntry(1000, 0, 0)])  # 1000 tokens: past the CUDA-graph range, no padding
    per_token_layer = 2 * (8 * 4096 + 4 * 5120 + 4 * 1024 + 3 * 12288)
    expected = (36 * c.memory_op_s(1000 * per_token_layer, 6) + c.memory_op_s(1000 * 2 * 6 * 4096, 2)
                + c.memory_op_s(3 * 4 * 151_936, 3))
    assert b.memory_ops_s == pytest.approx(expected, rel=1e-12)
    assert b.overhead_s == pytest.approx(c.step_overhead_s + c.request_overhead_s, rel=1e-12)


def test_small_steps_are_padded_to_the_cuda_graph_capture_size() -> None:
    assert [DEFAULT_CONSTANTS.cudagraph_tokens(n) for n in (1, 2, 3, 5, 33, 248, 249, 257, 512, 513)] == [
        1, 2, 4, 8, 40, 248, 256, 272, 512, None]
    padded, exact = (QWEN3_8B.breakdown(decodes(n, 100)) for n in (33, 40))
    assert padded.linear_s == exact.linear_s and padded.memory_ops_s < exact.memory_ops_s + 1e-12
    with pytest.raises(ValueError, match="capture size"):
        ReferenceConstants(cudagraph_max_tokens=500)


# --- tensor parallelism ------------------------------------------------------------------------------------------

def test_tensor_parallelism_halves_heads_and_adds_two_allreduces_per_layer() -> None:
    shape = QWEN3_32B.shape
    assert (shape.num_q_heads, shape.num_kv_heads, shape.ffn_width, shape.vocab_width) == (32, 4, 12800, 75968)
    per_layer = QWEN3_32B.breakdown(decodes(256, 1022)).attention_s / 64
    assert per_layer == pytest.approx(_raw_ms("generation", "32_4", 256, 1023) * 1e-3, rel=1e-9)
    for tokens, graph in ((64, True), (2048, False)):
        step = QWEN3_32B.breakdown(decodes(tokens, 100))
        one = TABLES.allreduce_tp2(tokens * 5120, cuda_graph=graph)
        assert step.allreduce_s == pytest.approx((2 * 64 + 1) * one, rel=1e-12)  # + the embedding's
    assert all(m.breakdown(decodes(64, 100)).allreduce_s == 0 for key, m in MODELS.items() if key[1] == 1)


def test_unsupported_deployments_are_refused_with_the_supported_list() -> None:
    with pytest.raises(ValueError, match=r"qwen3-32b \(tensor_parallel=2\)"):
        ReferenceStepModel.for_model("qwen3-32b")
    with pytest.raises(ValueError, match="no reference H100 model"):
        ReferenceStepModel.for_model("llama-3-8b")
    assert ReferenceStepModel.for_model("Qwen3-8B").shape == QWEN3_8B.shape


# --- monotone: more work is never faster -------------------------------------------------------------------------

entries = st.one_of(
    st.tuples(st.just(0), st.just(1), st.integers(0, 40_000)),
    st.tuples(st.integers(1, 8192), st.just(0), st.integers(0, 30_000)),
)


@settings(max_examples=400, deadline=None)
@given(model=st.sampled_from(sorted(MODELS)), step=st.lists(entries, min_size=1, max_size=80), extra=entries,
       which=st.integers(0, 79), more_context=st.integers(1, 5000), more_tokens=st.integers(1, 3000))
def test_more_requests_tokens_or_context_never_make_a_step_faster(
        model: tuple[str, int], step: list[tuple[int, int, int]], extra: tuple[int, int, int], which: int,
        more_context: int, more_tokens: int) -> None:
    reference = MODELS[model]
    base = reference.noiseless_step_time_s(step)
    assert base > 0
    assert reference.noiseless_step_time_s([*step, extra]) >= base * (1 - 1e-12)
    i = which % len(step)
    prefill, decode, context = step[i]
    longer = [*step[:i], (prefill, decode, context + more_context), *step[i + 1:]]
    assert reference.noiseless_step_time_s(longer) >= base * (1 - 1e-12)
    bigger = [*step[:i], (prefill + decode + more_tokens, 0, context), *step[i + 1:]]  # a decode becomes a chunk
    assert reference.noiseless_step_time_s(bigger) >= base * (1 - 1e-12)


def test_larger_models_are_slower_and_decode_batches_scale() -> None:
    small, medium, large = (MODELS[k] for k in (("qwen3-0.6b", 1), ("qwen3-8b", 1), ("qwen3-32b", 2)))
    for step in (decodes(1, 1000), decodes(64, 1000), [StepEntry(2048, 0, 0)]):
        times = [m.noiseless_step_time_s(step) for m in (small, medium, large)]
        assert times == sorted(times)
    assert 5e-3 < medium.noiseless_step_time_s(decodes(1, 1024)) < 9e-3  # published 8B bf16 H100: ~6-7 ms/token
    assert 10e-3 < medium.noiseless_step_time_s(decodes(64, 1024)) < 30e-3


# --- noise -------------------------------------------------------------------------------------------------------

def test_noise_is_seeded_multiplicative_log_normal_with_the_stated_spread() -> None:
    step_a, step_b = decodes(8, 300), [StepEntry(4000, 0, 0)]
    first, again = (QWEN3_8B.step_time_s(step_a, np.random.default_rng(7)) for _ in range(2))
    assert first == again != QWEN3_8B.noiseless_step_time_s(step_a)  # same seed, same time
    rng_a, rng_b = np.random.default_rng(11), np.random.default_rng(11)
    ratios_a, ratios_b = (
        np.array([QWEN3_8B.step_time_s(step, rng) for _ in range(20_000)]) / QWEN3_8B.noiseless_step_time_s(step)
        for step, rng in ((step_a, rng_a), (step_b, rng_b)))
    assert ratios_a == pytest.approx(ratios_b, rel=1e-12)  # the factor does not depend on the step: multiplicative
    sigma = DEFAULT_CONSTANTS.noise_sigma
    assert np.std(np.log(ratios_a)) == pytest.approx(sigma, rel=0.03)
    assert np.mean(ratios_a) == pytest.approx(1.0, abs=4 * sigma / math.sqrt(20_000))
    quiet = ReferenceStepModel(QWEN3_8B.shape, TABLES, ReferenceConstants(noise_sigma=0.0))
    assert quiet.step_time_s(step_a, np.random.default_rng(0)) == quiet.noiseless_step_time_s(step_a)


# --- bad input ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("step", "message"), [
    ([], "at least one request"),
    ([(0, 2, 10)], "entry 0: num_decode_tokens must be 0 or 1"),
    ([(0, 1, 5), (3, 1, 0)], "entry 1: a request schedules prefill tokens or one decode token, not both"),
    ([(0, 0, 7)], "entry 0: a scheduled request has at least one token"),
    ([(5, 0, -1)], "entry 0: num_context_tokens must be an integer >= 0"),
    ([(2.5, 0, 0)], "entry 0: num_prefill_tokens must be an integer >= 0"),
    ([(True, 0, 0)], "entry 0: num_prefill_tokens must be an integer >= 0"),
    ([(1, 0)], r"entry 0: expected \(prefill tokens, decode tokens, context tokens\)"),
    ([None], "entry 0: expected"),
])
def test_bad_entries_are_refused_naming_the_entry_and_field(step: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QWEN3_8B.noiseless_step_time_s(step)


def test_entries_in_the_batch_features_form_and_numpy_ints_are_accepted() -> None:
    composition = StepComposition.of([(0, 1, 9), (1, 0, 4), (np.int64(300), np.int64(0), np.int64(20)), [2, 0, 0]])
    # a request with exactly one scheduled token is a decode, whichever column holds it (vLLM's attention split)
    assert (composition.num_decodes, composition.cached_keys) == (2, 10 + 5 + 21 + 1)
    assert (composition.num_prefills, composition.prefill_pairs) == (2, 300 * 20 + 300 * 301 // 2 + 3)
    assert composition.num_tokens == 304 and composition.num_requests == 4


def test_constants_are_validated() -> None:
    with pytest.raises(ValueError, match="noise_sigma"):
        ReferenceConstants(noise_sigma=-0.1)
    with pytest.raises(ValueError, match="efficiency"):
        ReferenceConstants(hbm_efficiency=1.5)
