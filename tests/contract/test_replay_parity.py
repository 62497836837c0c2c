"""The compiled core (with and without its closed-form shortcuts) and the Python reference agree exactly."""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bear.core.batch_time import BatchTimeCoefficients
from bear.core.replay import ReplayEngine, replay
from bear.core.result import ReplayStatus
from bear.core.state import EngineConfig, InstanceState, Query
from tests.strategies import coefficients, queries, query_cached_tokens, states, timings

EXAMPLES = int(os.environ.get("BEAR_PARITY_EXAMPLES", "3000"))
# CI replays the same examples every run; BEAR_PARITY_RANDOM=1 explores new ones (long soak runs).
DERANDOMIZE = os.environ.get("BEAR_PARITY_RANDOM") != "1"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data(), states(), queries, coefficients, st.sampled_from([math.inf, math.inf, 0.01, 0.1, 1.0]))
def test_native_and_reference_give_identical_results(
    data: st.DataObject, state: InstanceState, query: Query, coefs: BatchTimeCoefficients, horizon_s: float
) -> None:
    timing = {**data.draw(st.just({}) | timings(state)),
              "query_cached_tokens": data.draw(query_cached_tokens(state, query))}
    reference = replay(state, query, coefs, horizon_s=horizon_s, record_batches=True, engine=ReplayEngine.REFERENCE,
                       **timing)
    for shortcuts in (True, False):
        native = replay(state, query, coefs, horizon_s=horizon_s, record_batches=True, shortcuts=shortcuts, **timing)
        assert native.status == reference.status
        assert native.reason == reference.reason
        assert native.first_token_batch == reference.first_token_batch
        assert native.ttft_s == reference.ttft_s  # bit for bit
        assert native.elapsed_s == reference.elapsed_s
        assert native.num_batches == reference.num_batches
        assert native.num_preemptions == reference.num_preemptions
        assert native.batches == reference.batches


def test_a_replay_that_gives_up_at_its_step_limit_says_so_and_gives_a_lower_bound() -> None:
    # Not a verdict that the query can never be served (the estimator and router act on `infeasible`).
    engine = EngineConfig(max_num_batched_tokens=256, max_num_seqs=8, block_size=16, num_gpu_blocks=1000,
                          max_model_len=8192)
    state = InstanceState(engine, free_blocks=1000)
    query = Query("q", num_prompt_tokens=4000, output_tokens=10)  # 16 chunks
    coefs = BatchTimeCoefficients(b0=1e-3, b1=1e-5, b2=0.0, b3=0.0)
    for engine_kind in (ReplayEngine.REFERENCE, ReplayEngine.NATIVE):
        result = replay(state, query, coefs, max_steps=5, engine=engine_kind, shortcuts=False)
        assert (result.status, result.feasible, result.ttft_s) == (ReplayStatus.EXCEEDS_HORIZON, True, None)
        assert "step limit" in result.reason and result.elapsed_s > 0
