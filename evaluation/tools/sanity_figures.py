"""Prints the reference H100 model's step times for a few canonical batches, to compare with published figures.

    python -m bear.evaluation.tools.sanity_figures

Rows: decode-only steps of 1, 32, 64 and 256 sequences at 1k context; one prompt of 2048 or 8192 tokens prefilled in one
step (the time to its first token on an idle instance, budget permitting), plus the component breakdown of each.
"""

from __future__ import annotations

import sys

from bear.evaluation.h100_model import ReferenceStepModel, StepEntry
from bear.evaluation.model_shapes import SUPPORTED

CONTEXT_TOKENS = 1024
BATCHES = {
    "decode b=1": [StepEntry(0, 1, CONTEXT_TOKENS)],
    "decode b=32": [StepEntry(0, 1, CONTEXT_TOKENS)] * 32,
    "decode b=64": [StepEntry(0, 1, CONTEXT_TOKENS)] * 64,
    "decode b=256": [StepEntry(0, 1, CONTEXT_TOKENS)] * 256,
    "prefill 2048": [StepEntry(2048, 0, 0)],
    "prefill 8192": [StepEntry(8192, 0, 0)],
}


def rows() -> list[tuple[str, str, dict[str, float]]]:
    out = []
    for model, tensor_parallel in SUPPORTED:
        reference = ReferenceStepModel.for_model(model, tensor_parallel)
        label = model if tensor_parallel == 1 else f"{model} (TP{tensor_parallel})"
        for name, entries in BATCHES.items():
            b = reference.breakdown(entries)
            out.append((label, name, {"total": b.total_s, "linear": b.linear_s, "attention": b.attention_s,
                                      "allreduce": b.allreduce_s, "memory": b.memory_ops_s, "lm_head": b.lm_head_s,
                                      "overhead": b.overhead_s}))
    return out


def main() -> int:
    columns = ["total", "linear", "attention", "allreduce", "memory", "lm_head", "overhead"]
    print(f"{'model':<18}{'batch':<15}" + "".join(f"{c + ' ms':>13}" for c in columns))
    for label, name, parts in rows():
        print(f"{label:<18}{name:<15}" + "".join(f"{parts[c] * 1e3:>13.2f}" for c in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
