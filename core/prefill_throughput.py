"""The prefill-throughput TTFT estimator (paper eq. 8): remaining prefill work divided by the instance's throughput.

θ = prefill tokens processed in all profiled batches that contain prefill, divided by those batches' total time. The
estimate ignores decode interference (it is the baseline BEA improves on, and the `bear-prefill-tps` ablation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from bear.core.batch_time import BatchFeatures
from bear.core.state import InstanceState, Query


def fit_prefill_throughput(samples: Sequence[tuple[BatchFeatures, float]]) -> float:
    """θ in prefill tokens per second from (features, measured duration) of profiled batches."""
    with_prefill = [(f, t) for f, t in samples if f.num_prefill_tokens > 0 and math.isfinite(t) and t > 0]
    if not with_prefill:
        raise ValueError("prefill throughput needs at least one batch with prefill tokens and a positive duration")
    return sum(f.num_prefill_tokens for f, _ in with_prefill) / sum(t for _, t in with_prefill)


def prefill_throughput_ttft_s(state: InstanceState, query: Query, tokens_per_s: float) -> float:
    """Eq. 8: (Σ residents' remaining prefill tokens + the query's prompt) / θ."""
    return backlog_ttft_s(remaining_prefill_tokens(state), query.num_prompt_tokens, tokens_per_s)


def remaining_prefill_tokens(state: InstanceState) -> int:
    """Σ residents' remaining prefill tokens, running and waiting: eq. 8's backlog, one sum per state (a service that
    estimates many queries against one state computes it once, not once per query: O(residents))."""
    return sum(r.remaining_prefill_tokens for r in (*state.running, *state.waiting))


def backlog_ttft_s(backlog_tokens: int, prompt_tokens: int, tokens_per_s: float) -> float:
    """Eq. 8 from the residents' remaining prefill tokens (`remaining_prefill_tokens`) and the query's prompt."""
    if not (math.isfinite(tokens_per_s) and tokens_per_s > 0):
        raise ValueError(f"prefill throughput must be a positive number, got {tokens_per_s!r}")
    return (backlog_tokens + prompt_tokens) / tokens_per_s
