"""The compiled core (with and without its closed-form shortcuts) and the Python reference agree exactly."""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bear.core.batch_time import BatchTimeCoefficients
from bear.core.replay import ReplayEngine, replay
from bear.core.state import InstanceState, Query
from tests.strategies import coefficients, queries, states, timings

EXAMPLES = int(os.environ.get("BEAR_PARITY_EXAMPLES", "3000"))
# CI replays the same examples every run; BEAR_PARITY_RANDOM=1 explores new ones (long soak runs).
DERANDOMIZE = os.environ.get("BEAR_PARITY_RANDOM") != "1"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data(), states(), queries, coefficients, st.sampled_from([math.inf, math.inf, 0.01, 0.1, 1.0]))
def test_native_and_reference_give_identical_results(
    data: st.DataObject, state: InstanceState, query: Query, coefs: BatchTimeCoefficients, horizon_s: float
) -> None:
    timing = data.draw(st.just({}) | timings(state))
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
