"""The demo's client: a Poisson workload sent through the Router gRPC API, each query then served by the simulated
instance the router chose, measured as a user would measure it.

A query's TTFT runs from the moment the client calls Route to its first token at the instance (routing time
included). Its realised utility is eq. 4 with the truth: the judge's score of the chosen model's answer minus λ times
its true cost (prompt and true output tokens at the model's prices). It is on time when its TTFT meets its target;
OnTimeUtility (eq. 6) averages the realised utility of on-time queries, 0 for the others (late, shed or failed).
Each query's outcome is reported to the router (`ReportOutcome`) when it completes, as a client would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bear.demo.assets import DemoPrompt
from bear.demo.live_instance import FIRST_TOKEN, RequestEvent
from bear.evaluation.workload import poisson_arrivals_s, ttft_targets_s
from bear.predictor.catalog import Catalog
from bear.predictor.tokenizers import get_tokenizer
from bear.router.client import AsyncRouterClient, RouterError
from bear.routing.contract import DEFAULT_LAMBDA_PER_MICRO_USD
from bear.v1 import router_pb2

ROUTING, ROUTED, SHED, FAILED = "routing", "routed", "shed", "failed"  # ROUTING: its Route call not answered yet


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    offset_s: float  # arrival, from the start of the policy's turn
    prompt: DemoPrompt
    ttft_slo_s: float


@dataclass(slots=True)
class QueryResult:
    request_id: str
    policy: str
    status: str  # ROUTING, ROUTED, SHED or FAILED
    route_ms: float
    slo_s: float
    model: str = ""
    instance_id: str = ""
    ttft_s: float | None = None  # from the Route call; None: no first token (shed, failed, or not in the turn)
    instance_ttft_s: float | None = None  # from the arrival at the instance (what the TTFT estimate predicts)
    utility: float = 0.0  # realised (0 unless routed)
    predicted_ttft_ms: float | None = None
    error: str = ""

    @property
    def on_time(self) -> bool:
        return self.ttft_s is not None and self.ttft_s <= self.slo_s

    @property
    def on_time_utility(self) -> float:
        return self.utility if self.on_time else 0.0


def plan(prompts: Sequence[DemoPrompt], rate_qps: float, window_s: float, seed: int, catalog: Catalog,
         looseness: float = 1.0) -> list[PlannedQuery]:
    """Poisson arrivals at `rate_qps` over `window_s` seconds, prompts drawn uniformly, Appendix A.2's targets (from
    the prompt's length in tokens of the pool's tokenizer)."""
    rng = np.random.default_rng([seed, 21])
    expected = int(rate_qps * window_s * 1.5) + 10
    arrivals = poisson_arrivals_s(rate_qps, expected, rng)
    arrivals = arrivals[arrivals < window_s]
    chosen = rng.integers(0, len(prompts), size=len(arrivals))
    tokenizer = get_tokenizer(catalog.spec(catalog.names[0]).tokenizer)
    # each distinct prompt tokenised once (QA: per query, a day's workload took minutes, deaf to Ctrl-C)
    drawn = np.unique(chosen)
    by_prompt = np.zeros(len(prompts), dtype=np.int64)
    by_prompt[drawn] = [max(1, len(tokenizer.token_keys(prompts[i].text))) for i in drawn]
    lengths = by_prompt[chosen]
    targets = ttft_targets_s(lengths, rng, looseness=looseness)
    return [PlannedQuery(float(at), prompts[i], float(slo)) for at, i, slo in zip(arrivals, chosen, targets, strict=True)]


@dataclass
class _Pending:
    result: QueryResult
    dispatched_at_s: float  # when the Route call answered
    prompt_tokens: int
    output_tokens: int
    first_token: asyncio.Future[RequestEvent]
    done: asyncio.Future[RequestEvent]


@dataclass
class PolicyTurn:
    """One policy's share of the demo, as it goes (read by the progress display)."""

    policy: str
    duration_s: float
    results: list[QueryResult] = field(default_factory=list)
    started_at_s: float = 0.0


class WorkloadClient:
    """Sends planned queries through the router and follows them at the pool. Runs in one event loop; pool events
    arrive from another thread through `event_from_pool`."""

    def __init__(self, router: AsyncRouterClient, submit: Callable[[str, str, int, int], None], catalog: Catalog,
                 loop: asyncio.AbstractEventLoop, lambda_per_micro_usd: float = DEFAULT_LAMBDA_PER_MICRO_USD,
                 route_timeout_s: float = 2.0):
        self._router = router
        self._submit = submit
        self._catalog = catalog
        self._loop = loop
        self._lambda = lambda_per_micro_usd
        self._route_timeout_s = route_timeout_s
        self._pending: dict[str, _Pending] = {}
        self._reports: set[asyncio.Task[None]] = set()
        self._queued: set[str] = set()  # request ids sent to the pool, without their first token yet

    def event_from_pool(self, event: RequestEvent) -> None:
        """Any thread. Once the run's loop is closed (the run was interrupted), events are dropped."""
        try:
            self._loop.call_soon_threadsafe(self._on_event, event)
        except RuntimeError:  # the event loop is closed
            pass

    def _on_event(self, event: RequestEvent) -> None:
        self._queued.discard(event.request_id)
        pending = self._pending.get(event.request_id)
        if pending is None:
            return
        future = pending.first_token if event.kind == FIRST_TOKEN else pending.done
        if not future.done():
            future.set_result(event)

    @property
    def num_in_flight(self) -> int:
        return len(self._pending)

    @property
    def num_queued(self) -> int:
        """Queries sent to the pool without their first token yet, those of finished turns included."""
        return len(self._queued)

    async def run_turn(self, turn: PolicyTurn, queries: Sequence[PlannedQuery], tag: str) -> None:
        """Sends `queries` at their offsets with `turn.policy`; returns when each has a first token, or has been
        waiting past its TTFT target and the turn's time is up (it is late then). A query whose target ends after the
        turn is waited for until its target (at most one turn longer): counted late at the turn's end, it would be
        late only for want of time to watch it."""
        turn.started_at_s = start = time.time()
        deadline = start + turn.duration_s
        tasks, waits_until = [], deadline
        for n, query in enumerate(queries):
            delay = start + query.offset_s - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.time()
            if now >= deadline:
                break
            watched_until = min(max(deadline, now + query.ttft_slo_s), deadline + turn.duration_s)
            waits_until = max(waits_until, watched_until)
            tasks.append(asyncio.create_task(self._one(turn, query, f"{tag}-{turn.policy}-{n}", watched_until)))
        if tasks:
            await asyncio.wait(tasks, timeout=max(waits_until - time.time(), 0.0))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, turn: PolicyTurn, query: PlannedQuery, request_id: str, deadline_s: float) -> None:
        sent_at = time.time()
        started = time.perf_counter()
        result = QueryResult(request_id, turn.policy, ROUTING, 0.0, query.ttft_slo_s)
        turn.results.append(result)
        decision = None
        try:
            decision = await self._router.route(query.prompt.text, ttft_slo_ms=query.ttft_slo_s * 1000,
                                                policy=turn.policy, request_id=request_id,
                                                lambda_per_micro_usd=self._lambda, timeout_s=self._route_timeout_s)
        except RouterError as error:
            result.error = str(error)
        finally:  # a call in flight is no error yet (the progress line counts it as neither); unanswered, it is one
            result.route_ms = (time.perf_counter() - started) * 1000
            if decision is None:
                result.status, result.error = FAILED, result.error or "the Route call was not answered"
        if decision is None:
            return
        if decision.decision != router_pb2.DECISION_ROUTE:
            result.status = SHED
            return
        chosen = next((c for c in decision.candidates if c.instance_id == decision.instance_id), None)
        model = decision.model
        if model not in query.prompt.true_output_tokens or chosen is None:
            result.status = FAILED
            result.error = f"routed to {decision.instance_id!r} ({model!r}), which this demo does not serve"
            return
        result.status, result.model, result.instance_id = ROUTED, model, decision.instance_id
        result.predicted_ttft_ms = chosen.predicted_ttft_ms if chosen.ttft_known else None
        prompt_tokens = max(1, chosen.prompt_tokens)
        output_tokens = query.prompt.true_output_tokens[model]
        price = self._catalog.spec(model)
        result.utility = (query.prompt.true_score[model]
                          - self._lambda * price.cost_microusd(prompt_tokens, output_tokens))
        pending = _Pending(result, time.time(), prompt_tokens, output_tokens, self._loop.create_future(),
                           self._loop.create_future())
        self._pending[request_id] = pending
        try:
            self._submit(decision.instance_id, request_id, prompt_tokens, output_tokens)
        except (KeyError, OSError) as error:  # no such simulated instance, or the pool's process is gone
            result.status, result.error = FAILED, f"not served: {error}"
            self._pending.pop(request_id, None)
            return
        self._queued.add(request_id)
        try:
            first = await asyncio.wait_for(pending.first_token, timeout=max(deadline_s - time.time(), 0.0))
            result.ttft_s = first.at_s - sent_at
            result.instance_ttft_s = first.at_s - first.arrival_s
        except TimeoutError:
            self._pending.pop(request_id, None)
            return
        report = asyncio.create_task(self._report_when_done(pending))
        self._reports.add(report)
        report.add_done_callback(self._reports.discard)

    async def _report_when_done(self, pending: _Pending) -> None:
        """ReportOutcome once the query completes (or after a minute: TTFT only), its times from the dispatch as the
        router predicts them (the query's TTFT against its target counts from the Route call)."""
        result = pending.result
        ttft_ms = (pending.first_token.result().at_s - pending.dispatched_at_s) * 1000
        e2e_ms = 0.0
        try:
            e2e_ms = ((await asyncio.wait_for(pending.done, timeout=60.0)).at_s - pending.dispatched_at_s) * 1000
        except TimeoutError:
            pass
        finally:
            self._pending.pop(result.request_id, None)
        try:
            await self._router.report_outcome(result.request_id, observed_ttft_ms=ttft_ms,
                                              output_tokens=pending.output_tokens if e2e_ms else 0,
                                              observed_e2e_ms=e2e_ms)
        except RouterError:
            pass  # an outcome report is best effort

    async def drain(self, timeout_s: float) -> None:
        """Waits (up to `timeout_s`) until every routed query has completed and been reported."""
        deadline = time.time() + timeout_s
        while (self._pending or self._reports) and time.time() < deadline:
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        for task in list(self._reports):
            task.cancel()
        await asyncio.gather(*self._reports, return_exceptions=True)


def summarise(results: Sequence[QueryResult]) -> dict[str, object]:
    """One policy's figures (the `--json` schema, plus the routing mix and the TTFT estimates' error)."""
    routed = [r for r in results if r.status == ROUTED]
    route_ms = [r.route_ms for r in results if r.status in (ROUTED, SHED)]  # answered calls only
    mix: dict[str, int] = {}
    for r in routed:
        mix[r.model] = mix.get(r.model, 0) + 1
    pairs = [(r.predicted_ttft_ms / 1000, r.instance_ttft_s) for r in routed
             if r.predicted_ttft_ms is not None and r.instance_ttft_s is not None and r.instance_ttft_s > 0]
    errors = [abs(p - a) / a for p, a in pairs]
    count = len(results)
    return {
        # over no query (a turn too short for its rate to send one) there is nothing to score: null, not 0
        "on_time_utility": float(np.mean([r.on_time_utility for r in results])) if count else None,
        "slo_attainment": float(np.mean([r.on_time for r in results])) if count else None,
        "routes": len(routed),
        "errors": sum(r.status == FAILED for r in results),
        "route_p50_ms": float(np.percentile(route_ms, 50)) if route_ms else None,
        "route_p99_ms": float(np.percentile(route_ms, 99)) if route_ms else None,
        "queries": count,
        "shed": sum(r.status == SHED for r in results),
        "mix": dict(sorted(mix.items())),
        "ttft_error_p50": float(np.median(errors)) if errors else None,  # what the table shows: robust to a few
        "ttft_mape": float(np.mean(errors)) if errors else None,  # the mean, which a few wild estimates dominate
    }


def gains(summaries: Mapping[str, Mapping[str, object]], reference: str) -> dict[str, float]:
    """OnTimeUtility of `reference` relative to each other policy (+0.25: 25% higher)."""
    ours = summaries.get(reference, {}).get("on_time_utility")
    out = {}
    for name, summary in summaries.items():
        theirs = summary.get("on_time_utility")
        if name != reference and isinstance(ours, float) and isinstance(theirs, float) and theirs > 0:
            out[name] = ours / theirs - 1
    return out
