"""The packaged H100 tables and the monotone functions built from them."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bear.evaluation.kernel_tables import (
    DATA_FILE,
    BatchedAttention,
    PiecewiseLinear,
    decode_work,
    isotonic_log,
    load_tables,
    prefill_work,
)
from bear.evaluation.model_shapes import SUPPORTED

TABLES = load_tables()
RAW = TABLES.raw
HEADS = sorted({(s.num_q_heads, s.num_kv_heads) for s in SUPPORTED.values()})


def test_the_derived_file_is_packaged_small_and_attributed() -> None:
    data = resources.files("bear.evaluation").joinpath("data")
    assert data.joinpath(DATA_FILE).is_file() and data.joinpath("NOTICE").is_file()
    with resources.as_file(data.joinpath(DATA_FILE)) as path:
        assert path.stat().st_size < 100_000
    assert "Apache" in data.joinpath("NOTICE").read_text() and "095f58a51c4c" in data.joinpath("NOTICE").read_text()
    assert TABLES.metadata["commit"] == "095f58a51c4ca8e61b66ec108d86f223f8d559ce"


def test_isotonic_fit_keeps_rising_data_and_pools_dips_geometrically() -> None:
    rising = [1.0, 2.0, 2.0, 5.0]
    assert isotonic_log(rising) == pytest.approx(rising, rel=1e-12)
    fitted = isotonic_log([1.0, 4.0, 1.0, 8.0])
    assert fitted == pytest.approx([1.0, 2.0, 2.0, 8.0], rel=1e-12)  # 4 and 1 pooled to their geometric mean
    with pytest.raises(ValueError, match="positive"):
        isotonic_log([1.0, 0.0])


def test_piecewise_linear_is_exact_at_nodes_linear_between_flat_below_and_proportional_above() -> None:
    curve = PiecewiseLinear((1.0, 3.0, 4.0), (2.0, 6.0, 10.0))
    assert [curve(x) for x in (0.5, 1.0, 2.0, 3.0, 3.5, 4.0, 8.0)] == pytest.approx([2, 2, 4, 6, 8, 10, 20])
    with pytest.raises(ValueError, match="non-decreasing"):
        PiecewiseLinear((1.0, 2.0), (2.0, 1.0))
    with pytest.raises(ValueError, match="strictly increasing"):
        PiecewiseLinear((1.0, 1.0), (1.0, 2.0))


@pytest.mark.parametrize("column", range(len(RAW["gemm_nk"])))
def test_gemm_columns_are_the_isotonic_fit_of_the_table_and_stay_close_to_it(column: int) -> None:
    n, k = (int(v) for v in RAW["gemm_nk"][column])
    measured_s = RAW["gemm_latency_ms"][column] * 1e-3
    curve = TABLES.gemm_curve(n, k)
    at_grid = np.array([curve(m) for m in TABLES.gemm_m])
    assert at_grid == pytest.approx(isotonic_log(measured_s), rel=1e-12)
    deviation = np.abs(at_grid / measured_s - 1)
    assert np.median(deviation) < 0.05 and deviation.max() < 0.16  # the table's own m-to-m noise is up to ~25%
    assert np.sum(deviation < 1e-12) >= 10  # rising stretches are reproduced exactly


def test_off_grid_gemm_dimensions_interpolate_between_grid_columns_and_scale_past_the_grid() -> None:
    m = 2048
    low, high, mid = (TABLES.gemm_curve(n, 4096)(m) for n in (16384, 51200, 24576))
    assert mid == pytest.approx(low + (high - low) * (24576 - 16384) / (51200 - 16384), rel=1e-12)
    assert TABLES.gemm_curve(151_936, 4096)(m) == pytest.approx(TABLES.gemm_curve(65536, 4096)(m) * 151_936 / 65536)
    k_mid = TABLES.gemm_curve(5120, 12800)(m)  # Qwen3-32B down projection under TP2
    assert TABLES.gemm_curve(5120, 12288)(m) <= k_mid <= TABLES.gemm_curve(5120, 16384)(m)
    with pytest.raises(ValueError, match="below the table grid"):
        TABLES.gemm_curve(16, 4096)


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize(("table", "work"), [("context", prefill_work), ("generation", decode_work)])
def test_attention_reproduces_table_points_up_to_the_stated_envelope(heads: tuple[int, int], table: str, work) -> None:
    attention: BatchedAttention = getattr(TABLES, table)[heads]
    key = f"{heads[0]}_{heads[1]}"
    batches, lengths = RAW[f"{table}_batch_{key}"], RAW[f"{table}_length_{key}"]
    latency_s = RAW[f"{table}_latency_ms_{key}"] * 1e-3
    deviations = []
    for i, b in enumerate(batches):
        measured = latency_s[i][~np.isnan(latency_s[i])]
        fitted = isotonic_log(measured)
        for j, x in enumerate(lengths[: len(measured)]):
            model = attention(int(b), int(b) * work(int(x)))
            assert model <= fitted[j] * (1 + 1e-12)  # the envelope only ever lowers toward a cheaper larger batch
            deviations.append(model / measured[j] - 1)
    deviations = np.abs(deviations)
    exact_share = np.mean(deviations < 1e-9)
    assert exact_share > (0.85 if table == "context" else 0.35)
    assert np.median(deviations) < 0.01 and deviations.max() < 0.18


@settings(max_examples=300, deadline=None)
@given(b=st.integers(1, 4096), extra_b=st.integers(0, 64), work=st.floats(1, 1e10), extra_work=st.floats(0, 1e9),
       heads=st.sampled_from(HEADS), table=st.sampled_from(["context", "generation"]))
def test_batched_attention_is_monotone_in_sequences_and_work(b: int, extra_b: int, work: float, extra_work: float,
                                                            heads: tuple[int, int], table: str) -> None:
    attention = getattr(TABLES, table)[heads]
    base = attention(b, work)
    assert base > 0
    assert attention(b + extra_b, work) >= base * (1 - 1e-12)
    assert attention(b, work + extra_work) >= base * (1 - 1e-12)


def test_attention_refuses_batches_past_its_range() -> None:
    attention = TABLES.generation[HEADS[0]]
    with pytest.raises(ValueError, match="outside the model's range"):
        attention(attention.batches[-1] + 1, 1e6)
    with pytest.raises(ValueError, match="outside the model's range"):
        attention(0, 10)


def test_allreduce_is_monotone_and_eager_never_beats_graph() -> None:
    sizes = [float(s) for s in np.geomspace(128, 5e8, 200)]
    for cuda_graph in (True, False):
        times = [TABLES.allreduce_tp2(s, cuda_graph=cuda_graph) for s in sizes]
        assert all(b >= a for a, b in zip(times, times[1:]))
    assert all(TABLES.allreduce_tp2(s, cuda_graph=False) >= TABLES.allreduce_tp2(s, cuda_graph=True) for s in sizes)
    node = int(RAW["allreduce_elements"][10])
    assert TABLES.allreduce_tp2(node, cuda_graph=True) == pytest.approx(
        isotonic_log(RAW["allreduce_graph_ms"])[10] * 1e-3, rel=1e-12)
