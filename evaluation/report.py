"""Writing results: CSV tables, PNG plots (matplotlib, headless) and a Markdown summary."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def line_plot(path: Path, x: Sequence[float], series: Mapping[str, Sequence[float]], *, xlabel: str, ylabel: str,
              title: str, highlight: str | None = None, vline: float | None = None) -> None:
    """One line per series; `highlight` drawn thicker; `vline` marks e.g. the saturation rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    for name, values in series.items():
        axes.plot(x, values, marker="o", markersize=3, linewidth=2.5 if name == highlight else 1.2, label=name)
    if vline is not None:
        axes.axvline(vline, color="grey", linestyle="--", linewidth=1, label="saturation")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def scatter_plot(path: Path, points: Mapping[str, Sequence[tuple[float, float]]], *, xlabel: str, ylabel: str,
                 title: str, log: bool = True) -> None:
    """Estimate-vs-actual style scatter with the y = x diagonal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5.5, 5))
    low, high = float("inf"), 0.0
    for name, pairs in points.items():
        if not pairs:
            continue
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        axes.scatter(xs, ys, s=4, alpha=0.5, label=name)
        low, high = min(low, *xs, *ys), max(high, *xs, *ys)
    if high > 0:
        axes.plot([low, high], [low, high], color="black", linewidth=0.8)
    if log and low > 0:
        axes.set_xscale("log")
        axes.set_yscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.legend(fontsize=7, markerscale=3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3f}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
