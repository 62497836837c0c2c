"""Measured H100 kernel latencies turned into monotone, interpolable functions (seconds, one layer, one GPU).

The derived file `data/h100_qwen3.npz` holds raw measurements (see `tools/extract_h100_tables.py`). Measurements are
noisy (the GEMM table dips by up to ~20% between neighbouring m), so every table is first made monotone, and then
interpolated piecewise linearly, so that more work is never predicted faster:

- **Monotone fit**: isotonic regression (pool-adjacent-violators) on log latency along the table's work axis: the
  non-decreasing sequence closest to the measurements in relative terms. Points where the measurements already rise
  are reproduced exactly; a dip is averaged with its neighbours.
- **GEMM** (`gemm_curve`): latency over the table's m grid for each (n, k) grid column; an off-grid n or k is linear
  interpolation between the two neighbouring grid columns (on this grid, leave-one-out checks give a median error of
  2–3% and a 90th percentile of 6–10%), and an n beyond the grid's largest (the LM head, 151,936 or 75,968 wide)
  scales that column by n / n_max (column blocks of one GEMM). Between m grid points: linear in m.
- **Attention over a batch** (`BatchedAttention`): vLLM runs all sequences of a step in one FlashAttention varlen call,
  so the cost is a function of the number of sequences b and their total work W — key/value tokens read for decode
  (the table's `step`), causal (query, key) pairs for prefill (an isl of L has L(L+1)/2). A table point (b, x) is the
  grid point (b, b·work(x)); a batch of unequal sequences is costed at the equal-work batch with the same b and W (the
  "mean context" rule, which keeps memory traffic for decode and FLOPs for prefill). Rows are interpolated linearly in
  work, extended past their measured range with the row below's shape (`b` sequences of x cost what b/2 of them cost,
  scaled by the ratio measured at the longest x both rows share), past the table's longest x in proportion to work,
  and past its largest batch by doubling (2b sequences cost twice b: the GPU is already saturated there). Finally each
  grid value is lowered to the cheapest larger batch at the same total work (`minimum over b' >= b`): a batch can
  always be laid out like a larger one. This removes the table's inversions, the largest being that one 64k-context
  decode is measured slower than 8 sequences of 8k (FlashAttention's split-KV heuristic parallelises it less): table
  points move by a median of 0.4% (decode) and 0% (prefill), at most 17% and 10% (single long sequences).
- **All-reduce** (`AllReduceCurve`): isotonic along message size, linear in between, CUDA-graph variant for steps
  vLLM runs under CUDA graphs and eager variant (never faster than graph) otherwise.
"""

from __future__ import annotations

import functools
import json
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np

DATA_FILE = "h100_qwen3.npz"
MS = 1e-3  # the tables are in milliseconds


def isotonic_log(values: Sequence[float]) -> np.ndarray:
    """The non-decreasing sequence closest to `values` in log space (pool-adjacent-violators, equal weights)."""
    array = np.asarray(values, dtype=float)
    if array.size == 0 or not np.all(np.isfinite(array) & (array > 0)):
        raise ValueError("isotonic fit needs positive finite latencies")
    logs = np.log(array)
    means: list[float] = []
    counts: list[int] = []
    for value in logs:  # invariant: `means` is non-decreasing, each block the mean of `counts` consecutive values
        means.append(float(value))
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            mean, count = means.pop(), counts.pop()
            means[-1] = (means[-1] * counts[-1] + mean * count) / (counts[-1] + count)
            counts[-1] += count
    return np.exp(np.repeat(means, counts))


@dataclass(frozen=True, slots=True)
class PiecewiseLinear:
    """A non-decreasing function through (x_i, y_i), flat below x_0 and proportional to x above the last node."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.xs) != len(self.ys) or not self.xs:
            raise ValueError("a piecewise-linear curve needs as many values as nodes, at least one")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:])) or self.xs[0] <= 0:
            raise ValueError("curve nodes must be positive and strictly increasing")
        if any(b < a for a, b in zip(self.ys, self.ys[1:])) or self.ys[0] < 0:
            raise ValueError("curve values must be non-negative and non-decreasing")

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        i = bisect_right(xs, x)
        if i == len(xs):
            return ys[-1] * x / xs[-1]
        x0, x1 = xs[i - 1], xs[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class BatchedAttention:
    """Latency of one attention call over b sequences with total work W, monotone in both (see the module doc)."""

    batches: tuple[int, ...]  # grid rows, 1 first
    rows: tuple[PiecewiseLinear, ...]  # per row, latency (s) over total work, all on the same work nodes

    def __call__(self, num_sequences: int, total_work: float) -> float:
        if not 1 <= num_sequences <= self.batches[-1]:
            raise ValueError(f"attention over {num_sequences} sequences is outside the model's range "
                             f"(1..{self.batches[-1]} per step)")
        i = bisect_right(self.batches, num_sequences) - 1
        if self.batches[i] == num_sequences:
            return self.rows[i](total_work)
        b0, b1 = self.batches[i], self.batches[i + 1]
        t = (num_sequences - b0) / (b1 - b0)
        return (1 - t) * self.rows[i](total_work) + t * self.rows[i + 1](total_work)

    @staticmethod
    def from_table(batches: Sequence[int], lengths: Sequence[int], latency_ms: np.ndarray,
                   work: Callable[[float], float], max_batch: int) -> BatchedAttention:
        """From a (batch × length) table, NaN where not measured (each row measured from the shortest length on)."""
        works = tuple(float(work(x)) for x in lengths)
        filled = _fill_rows(list(batches), lengths, np.asarray(latency_ms, dtype=float) * MS)
        row_batches = [int(b) for b in batches]
        while row_batches[-1] < max_batch:  # doubling a saturated batch doubles its time
            row_batches.append(2 * row_batches[-1])
            filled.append([2 * t for t in filled[-1]])
        nodes = sorted({b * w for b in row_batches for w in works})
        per_sequence = [PiecewiseLinear(works, tuple(row)) for row in filled]  # linear in work, proportional past it
        grid = np.array([[curve(node / b) for node in nodes]
                         for b, curve in zip(row_batches, per_sequence, strict=True)])
        grid = np.minimum.accumulate(grid[::-1], axis=0)[::-1]  # the cheapest layout among batches >= b
        node_tuple = tuple(float(n) for n in nodes)
        return BatchedAttention(tuple(row_batches),
                                tuple(PiecewiseLinear(node_tuple, tuple(float(v) for v in r)) for r in grid))


def _fill_rows(batches: list[int], lengths: Sequence[int], latency_s: np.ndarray) -> list[list[float]]:
    """Isotonic rows over the full length axis; a row past its measured range follows the previous row's shape."""
    rows: list[list[float]] = []
    for i, b in enumerate(batches):
        measured = ~np.isnan(latency_s[i])
        count = int(measured.sum())
        if count == 0 or not measured[:count].all():
            raise ValueError(f"attention row for batch {b} must be measured from the shortest length on")
        row = list(isotonic_log(latency_s[i, :count]))
        if count < len(lengths):
            if not rows:
                raise ValueError("the batch-1 attention row must cover every length")
            previous = rows[-1]
            ratio = row[-1] / previous[count - 1]
            row += [max(row[-1], previous[j] * ratio) for j in range(count, len(lengths))]
        rows.append(row)
    return rows


@dataclass(frozen=True, slots=True)
class AllReduceCurve:
    """vLLM custom all-reduce between 2 GPUs (s) by message size in bf16 elements."""

    graph: PiecewiseLinear
    eager: PiecewiseLinear

    def __call__(self, num_elements: int, *, cuda_graph: bool) -> float:
        return (self.graph if cuda_graph else self.eager)(num_elements)


@dataclass(frozen=True, slots=True)
class KernelTables:
    """The measured tables the reference model reads, loaded once."""

    gemm_axis: tuple[int, ...]  # grid values of n and k
    gemm_m: tuple[int, ...]
    gemm_columns: dict[tuple[int, int], np.ndarray]  # (n, k) -> isotonic latency (s) over gemm_m
    context: dict[tuple[int, int], BatchedAttention]  # (q heads, kv heads) per GPU -> prefill attention
    generation: dict[tuple[int, int], BatchedAttention]  # (q heads, kv heads) per GPU -> decode attention
    allreduce_tp2: AllReduceCurve
    raw: dict[str, np.ndarray]  # the file's arrays, for tests and provenance
    metadata: dict[str, object]

    def gemm_curve(self, n: int, k: int) -> PiecewiseLinear:
        """Latency (s) of an (m × k) @ (k × n) bf16 GEMM as a function of m."""
        column = sum(wn * wk * self.gemm_columns[(gn, gk)]
                     for gn, wn in _grid_weights(n, self.gemm_axis) for gk, wk in _grid_weights(k, self.gemm_axis))
        return PiecewiseLinear(tuple(map(float, self.gemm_m)), tuple(map(float, column)))


def _grid_weights(value: int, axis: Sequence[int]) -> list[tuple[int, float]]:
    """Grid values and weights of a linear interpolation at `value` (proportional past the largest grid value)."""
    if value < axis[0]:
        raise ValueError(f"GEMM dimension {value} is below the table grid (smallest {axis[0]})")
    i = bisect_right(axis, value) - 1
    if axis[i] == value:
        return [(axis[i], 1.0)]
    if i == len(axis) - 1:
        return [(axis[i], value / axis[i])]
    lo, hi = axis[i], axis[i + 1]
    t = (value - lo) / (hi - lo)
    return [(lo, 1 - t), (hi, t)]


def prefill_work(length: float) -> float:
    """Causal (query, key) pairs of a full prefill of `length` tokens."""
    return length * (length + 1) / 2


def decode_work(kv_length: float) -> float:
    """Key/value tokens one decode reads (the generation table's `step`)."""
    return kv_length


@functools.cache
def load_tables(max_sequences_per_step: int = 16_384) -> KernelTables:
    """Reads the packaged derived file (no I/O happens before the first call)."""
    with resources.files("bear.evaluation").joinpath("data", DATA_FILE).open("rb") as f:
        with np.load(f, allow_pickle=False) as npz:
            raw = {name: npz[name] for name in npz.files}
    gemm_columns = {(int(n), int(k)): isotonic_log(row) * MS
                    for (n, k), row in zip(raw["gemm_nk"], raw["gemm_latency_ms"], strict=True)}
    context, generation = {}, {}
    for key in sorted(name.removeprefix("context_latency_ms_") for name in raw if name.startswith("context_latency")):
        q_heads, kv_heads = (int(v) for v in key.split("_"))
        context[(q_heads, kv_heads)] = BatchedAttention.from_table(
            raw[f"context_batch_{key}"], raw[f"context_length_{key}"], raw[f"context_latency_ms_{key}"],
            prefill_work, max_sequences_per_step)
        generation[(q_heads, kv_heads)] = BatchedAttention.from_table(
            raw[f"generation_batch_{key}"], raw[f"generation_length_{key}"], raw[f"generation_latency_ms_{key}"],
            decode_work, max_sequences_per_step)
    elements = tuple(float(e) for e in raw["allreduce_elements"])
    graph = isotonic_log(raw["allreduce_graph_ms"]) * MS
    eager = np.maximum(isotonic_log(raw["allreduce_eager_ms"]) * MS, graph)
    return KernelTables(
        gemm_axis=tuple(int(v) for v in raw["gemm_axis"]), gemm_m=tuple(int(v) for v in raw["gemm_m"]),
        gemm_columns=gemm_columns, context=context, generation=generation,
        allreduce_tp2=AllReduceCurve(PiecewiseLinear(elements, tuple(graph)), PiecewiseLinear(elements, tuple(eager))),
        raw=raw, metadata=json.loads(str(raw["metadata"])))
