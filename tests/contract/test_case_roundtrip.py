"""Every replayable state written in the case format reads back as a state that replays identically."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bear.core.batch_time import BatchTimeCoefficients
from bear.core.case import Case, case_to_json, parse_case
from bear.core.replay import replay
from bear.core.state import InstanceState, Query
from tests.strategies import coefficients, queries, query_cached_tokens, states


@settings(max_examples=500, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data(), states(), queries, coefficients, st.sampled_from([math.inf, 0.05]))
def test_case_format_round_trip(data: st.DataObject, state: InstanceState, query: Query,
                                coefs: BatchTimeCoefficients, horizon_s: float) -> None:
    cached = data.draw(query_cached_tokens(state, query))
    document = json.loads(json.dumps(case_to_json(Case(state, query, coefs, horizon_s, cached))))
    case = parse_case(document)
    assert case.state.engine == state.engine and case.coefficients == coefs and case.horizon_s == horizon_s
    assert case.query_cached_tokens == cached
    original = replay(state, query, coefs, horizon_s=horizon_s, query_cached_tokens=cached, record_batches=True)
    again = replay(case.state, case.query, case.coefficients, horizon_s=case.horizon_s,
                   query_cached_tokens=case.query_cached_tokens, record_batches=True)
    assert again == original
