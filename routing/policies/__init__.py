"""The built-in policies, one module each; importing this package registers them all."""

from bear.routing.policies import (  # noqa: F401
    bear_constrained,
    bear_lagrangian,
    bear_prefill_tps,
    latency_agnostic,
    lmdeploy,
    round_robin,
    routebalance,
    score,
    shortest_queue,
    vllm_sr,
)
