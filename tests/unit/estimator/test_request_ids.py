"""Engine request ids map back to the router's request id, so that dispatch records match residents."""

from __future__ import annotations

import pytest

from bear.estimator.request_ids import router_request_id


@pytest.mark.parametrize(("engine_id", "router_id"), [
    ("cmpl-r42-0-1a2b3c4d", "r42"),  # /v1/completions: prompt index, then vLLM's random suffix
    ("cmpl-r42-3-1a2b3c4d", "r42"),
    ("chatcmpl-r42-1a2b3c4d", "r42"),  # /v1/chat/completions: the suffix only
    ("cmpl-req-7-0-12345678", "req-7"),  # dashes and digits in the router's id
    ("cmpl-3f2a9c1e-aaaa-bbbb-cccc-0123456789ab-0-1a2b3c4d", "3f2a9c1e-aaaa-bbbb-cccc-0123456789ab"),
    ("chatcmpl-3f2a9c1e-aaaa-bbbb-cccc-0123456789ab-1a2b3c4d", "3f2a9c1e-aaaa-bbbb-cccc-0123456789ab"),
    ("cmpl-r42-0", "r42"),  # VLLM_DISABLE_REQUEST_ID_RANDOMIZATION
    ("chatcmpl-r42", "r42"),
    ("r42", "r42"),  # a simulated instance uses the router's ids as they are
    ("embd-r42-1a2b3c4d", "embd-r42-1a2b3c4d"),  # other endpoints are their own key
    ("cmpl-", "cmpl-"),
])
def test_engine_ids_map_to_the_router_id(engine_id: str, router_id: str) -> None:
    assert router_request_id(engine_id) == router_id
