"""Small builders of routing inputs, so that a test states only what it is about."""

from __future__ import annotations

from collections.abc import Sequence

from bear.routing.contract import Candidate, Choice, InstanceSignals, RouteRequest
from bear.routing.registry import build_policy


def candidate(instance_id: str, accuracy: float = 0.5, *, cost: float = 0.0, output: float = 100.0,
              prompt: int = 100, ttft: float | None = None, prefill_tps_ttft: float | None = None,
              running: int | None = None, waiting: int | None = None, rps: float | None = None,
              recent_ttft: Sequence[float] = (), recent_tpot: Sequence[float] = (),
              pending: float | None = None) -> Candidate:
    """An instance with the given predictions and signals; `ttft` is its BEA estimate."""
    estimates = {key: value for key, value in (("bea", ttft), ("prefill-tps", prefill_tps_ttft)) if value is not None}
    signals = InstanceSignals(num_running=running, num_waiting=waiting, request_throughput_rps=rps,
                              ttft_estimates_s=estimates, recent_ttft_s=tuple(recent_ttft),
                              recent_tpot_s=tuple(recent_tpot), pending_decode_tokens=pending)
    return Candidate(instance_id, f"model-{instance_id}", accuracy, prompt, output, cost, signals)


def request(slo_s: float = 1.0, *, lam: float = 5e-4, delta: float | None = None) -> RouteRequest:
    return RouteRequest("q", slo_s, lam, delta)


def choose(name: str, candidates: Sequence[Candidate], req: RouteRequest | None = None, **params: object) -> Choice:
    """A fresh policy's choice."""
    return build_policy(name, params).choose(req or request(), candidates)


def scores_by_id(choice: Choice) -> dict[str, float]:
    return {s.instance_id: s.score for s in choice.scores}
