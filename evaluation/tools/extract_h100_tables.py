"""Extracts the slices of NVIDIA AIConfigurator's H100 kernel tables that the reference step model needs.

    python -m bear.evaluation.tools.extract_h100_tables \
        ../shared/data/aiconfigurator_h100 evaluation/data/h100_qwen3.npz

Reads the vLLM 0.24.0 Parquet tables (pyarrow) and writes one small `.npz` of raw measured latencies, unchanged
(milliseconds for one op of one layer on one GPU):

- `gemm_*`: bf16 `torch.nn.functional.linear` latency over the table's whole m grid, for every (n, k) grid column that
  brackets a GEMM of a supported model (the runtime interpolates between them);
- `context_*` / `generation_*`: FlashAttention-3 prefill and decode attention, bf16 KV cache, full attention, head_dim
  128, as a (batch_size × isl) or (batch_size × step) matrix per (query heads, KV heads) pair; NaN where not measured;
- `allreduce_*`: vLLM custom all-reduce on 2 GPUs, CUDA-graph and eager variants, by message size in bf16 elements
  (the collector allocates `message_size` elements, and AIConfigurator queries it with tokens × hidden size);
- `metadata`: provenance as JSON.

The runtime never needs the source data or pyarrow; a test re-runs this script and checks the committed file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from bear.evaluation.model_shapes import HF_CONFIG_FILES, SUPPORTED

SOURCE_REPOSITORY = "https://github.com/ai-dynamo/aiconfigurator"
SOURCE_COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"
VLLM_VERSION = "0.24.0"
HEAD_DIM = 128
GEMM_KERNEL = "torch.nn.functional.linear"
ATTENTION_KERNEL = "vllm_flash_attn_fa3"
TABLES = {
    "gemm": f"h100_sxm/gemm/vllm/{VLLM_VERSION}/gemm_perf.parquet",
    "context": f"h100_sxm/attention/vllm/{VLLM_VERSION}/context_attention_perf.parquet",
    "generation": f"h100_sxm/attention/vllm/{VLLM_VERSION}/generation_attention_perf.parquet",
    "allreduce": f"h100_sxm/comm/vllm/{VLLM_VERSION}/custom_allreduce_perf.parquet",
}


def head_key(num_q_heads: int, num_kv_heads: int) -> str:
    return f"{num_q_heads}_{num_kv_heads}"


def bracket(value: int, axis: Iterable[int]) -> list[int]:
    """The grid values an interpolation at `value` reads: value itself, or its neighbours, or the largest below it."""
    grid = sorted(axis)
    if value in grid:
        return [value]
    below = [g for g in grid if g < value]
    above = [g for g in grid if g > value]
    if not below:
        raise ValueError(f"{value} lies below the table grid (smallest {grid[0]})")
    return [below[-1], above[0]] if above else [below[-1]]


def _read(source: Path, table: str) -> dict[str, list]:
    import pyarrow.parquet as pq  # only the extraction needs pyarrow

    return pq.read_table(source / TABLES[table]).to_pydict()


def _rows(columns: dict[str, list]) -> list[dict]:
    names = list(columns)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def _extract_gemm(source: Path) -> dict[str, np.ndarray]:
    rows = [r for r in _rows(_read(source, "gemm"))
            if r["gemm_dtype"] == "bfloat16" and r["kernel_source"] == GEMM_KERNEL]
    latency = {(r["m"], r["n"], r["k"]): r["latency"] for r in rows}
    axis = sorted({r["n"] for r in rows} | {r["k"] for r in rows})
    m_grid = sorted({r["m"] for r in rows})
    needed = sorted({(n, k) for shape in SUPPORTED.values() for n_op, k_op in shape.gemms().values()
                     for n in bracket(n_op, axis) for k in bracket(k_op, axis)})
    matrix = np.array([[latency[(m, n, k)] for m in m_grid] for n, k in needed])
    return {"gemm_axis": np.array(axis), "gemm_m": np.array(m_grid), "gemm_nk": np.array(needed),
            "gemm_latency_ms": matrix}


def _attention_matrix(rows: list[dict], column: str, heads: tuple[int, int]) -> tuple[list[int], list[int], np.ndarray]:
    selected = [r for r in rows if (r["num_heads"], r["num_key_value_heads"]) == heads]
    batches, lengths = sorted({r["batch_size"] for r in selected}), sorted({r[column] for r in selected})
    matrix = np.full((len(batches), len(lengths)), np.nan)
    for r in selected:
        i, j = batches.index(r["batch_size"]), lengths.index(r[column])
        if not np.isnan(matrix[i, j]):
            raise ValueError(f"duplicate attention row: heads {heads}, batch {r['batch_size']}, {column} {r[column]}")
        matrix[i, j] = r["latency"]
    return batches, lengths, matrix


def _extract_attention(source: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    heads = sorted({(shape.num_q_heads, shape.num_kv_heads) for shape in SUPPORTED.values()})
    for table, column in (("context", "isl"), ("generation", "step")):
        rows = [r for r in _rows(_read(source, table))
                if r["kernel_source"] == ATTENTION_KERNEL and r["head_dim"] == HEAD_DIM and r["window_size"] == 0
                and r["kv_cache_dtype"] == "bfloat16" and r["attn_dtype"] == "bfloat16"]
        for pair in heads:
            batches, lengths, matrix = _attention_matrix(rows, column, pair)
            key = head_key(*pair)
            out[f"{table}_batch_{key}"] = np.array(batches)
            out[f"{table}_length_{key}"] = np.array(lengths)
            out[f"{table}_latency_ms_{key}"] = matrix
    return out


def _extract_allreduce(source: Path) -> dict[str, np.ndarray]:
    rows = [r for r in _rows(_read(source, "allreduce")) if r["num_gpus"] == 2 and r["allreduce_dtype"] == "bfloat16"]
    sizes = sorted({r["message_size"] for r in rows})
    by_backend = {(r["backend"], r["message_size"]): r["latency"] for r in rows}
    return {"allreduce_elements": np.array(sizes),
            "allreduce_graph_ms": np.array([by_backend[("vllm_graph", s)] for s in sizes]),
            "allreduce_eager_ms": np.array([by_backend[("vllm_eager", s)] for s in sizes])}


def _check_model_configs(source: Path) -> None:
    """Refuses to extract if the shapes in `model_shapes.py` disagree with the copied Hugging Face configs."""
    for shape in {s.model for s in SUPPORTED.values()}:
        config = json.loads((source / "model_configs" / HF_CONFIG_FILES[shape.name]).read_text())
        expected = {"num_hidden_layers": shape.num_layers, "hidden_size": shape.hidden_size,
                    "intermediate_size": shape.intermediate_size, "num_attention_heads": shape.num_attention_heads,
                    "num_key_value_heads": shape.num_key_value_heads, "head_dim": shape.head_dim,
                    "vocab_size": shape.vocab_size}
        wrong = {k: (v, config[k]) for k, v in expected.items() if config[k] != v}
        if wrong:
            raise ValueError(f"{shape.name}: model_shapes.py disagrees with {HF_CONFIG_FILES[shape.name]}: {wrong}")


def extract(source: Path) -> dict[str, np.ndarray]:
    """All arrays of the derived file, from the AIConfigurator copy at `source`."""
    _check_model_configs(source)
    metadata = {
        "source": SOURCE_REPOSITORY, "commit": SOURCE_COMMIT, "license": "Apache-2.0",
        "tables": TABLES, "device": "NVIDIA H100 80GB HBM3", "framework": f"vLLM {VLLM_VERSION}",
        "latency_unit": "ms, one op of one layer on one GPU", "gemm": f"bfloat16, {GEMM_KERNEL}",
        "attention": f"{ATTENTION_KERNEL}, head_dim {HEAD_DIM}, bf16 KV cache, window 0",
        "allreduce": "vLLM custom all-reduce, 2 GPUs, bf16, message size in elements",
    }
    return {**_extract_gemm(source), **_extract_attention(source), **_extract_allreduce(source),
            "metadata": np.array(json.dumps(metadata, sort_keys=True))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="the aiconfigurator_h100 folder (with h100_sxm/ and model_configs/)")
    parser.add_argument("output", type=Path, help="the .npz to write")
    args = parser.parse_args(argv)
    arrays = extract(args.source)
    with args.output.open("wb") as f:  # a file object: numpy appends no suffix
        np.savez_compressed(f, **arrays)
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes, {len(arrays)} arrays)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
