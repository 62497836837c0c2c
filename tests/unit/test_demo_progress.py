"""The demo's progress line and results table (bear.demo.runner): what they show before any call is answered, and
for a turn that sent no query."""

from __future__ import annotations

import io
import json
import time

from bear.demo.runner import DemoConfig, _print_results, _progress_line
from bear.demo.workload import PolicyTurn, gains, summarise


def test_a_turn_without_answers_shows_no_route_latency_and_its_length_unrounded() -> None:
    turn = PolicyTurn("bear", 4 / 3)
    turn.started_at_s = time.time()
    line = _progress_line(turn, summarise(turn.results))
    assert "route p50 –" in line and "None" not in line
    assert "/1.33 s" in line


def test_a_turn_with_no_query_scores_nothing_rather_than_zero() -> None:
    """A turn too short for its rate to send a query: null figures in --json, '-' in the table, no gain computed."""
    summary = summarise([])
    assert summary["on_time_utility"] is None and summary["slo_attainment"] is None and summary["queries"] == 0
    turn = PolicyTurn("score", 2.0)
    line = _progress_line(turn, summary)
    assert "on time –" in line and "OnTimeUtility –" in line and "None" not in line
    report = {"policies": {"bear": {**summary, "on_time_utility": 0.5, "slo_attainment": 0.9, "queries": 10},
                           "score": summary}}
    out = io.StringIO()
    _print_results(report, DemoConfig(duration_s=10, rate_qps=0.1, policies=("bear", "score")), out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("score "))
    assert row.split()[:4] == ["score", "0", "-", "-"] and "0.0%" not in row
    assert "bear OnTimeUtility vs score: n/a (it scored nothing)" in out.getvalue()  # no gain over nothing
    assert "No query was sent in the turn of score: at 0.1 queries/s, queries arrive over" in out.getvalue()
    assert gains(report["policies"], "bear") == {}
    json.dumps(summary, allow_nan=False)


def test_the_table_fits_long_policy_names_and_a_baseline_at_zero_is_named() -> None:
    def figures(utility: float) -> dict[str, object]:
        return {**summarise([]), "queries": 10, "on_time_utility": utility, "slo_attainment": 0.5}

    report = {"policies": {"bear": figures(0.5), "latency-agnostic": figures(0.25), "round-robin": figures(0.0)}}
    out = io.StringIO()
    _print_results(report, DemoConfig(duration_s=10, policies=("bear", "latency-agnostic", "round-robin")), out)
    lines = out.getvalue().splitlines()
    header = next(line for line in lines if line.startswith("policy"))
    row = next(line for line in lines if line.startswith("latency-agnostic "))
    assert row.index("0.2500") + len("0.2500") == header.index("OnTimeUtility") + len("OnTimeUtility")
    assert "bear OnTimeUtility vs latency-agnostic: +100%, round-robin: n/a (it scored 0)" in out.getvalue()


def test_the_estimate_error_is_the_median_and_a_few_queries_are_no_zero_share() -> None:
    """One wild estimate (300 s for a 60 ms TTFT) made the table's mean error 11,078% in a QA run: the table shows the
    median, --json both; a model given 2 of 400 queries showed as "0%"."""
    from bear.demo.workload import ROUTED, QueryResult

    def routed(model: str, predicted_ms: float, measured_s: float) -> QueryResult:
        return QueryResult("q", "bear", ROUTED, 1.0, 1.0, model, "i", measured_s, measured_s, 1.0, predicted_ms)

    results = [routed("Qwen3-8B", 110, 0.1) for _ in range(398)] + [routed("Qwen3-0.6B", 300_000, 0.06),
                                                                      routed("Qwen3-0.6B", 60, 0.06)]
    summary = summarise(results)
    assert abs(summary["ttft_error_p50"] - 0.1) < 1e-9 and summary["ttft_mape"] > 10
    out = io.StringIO()
    _print_results({"policies": {"bear": summary}}, DemoConfig(duration_s=10, policies=("bear",)), out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("bear "))
    assert "10.0%  Qwen3-0.6B <1%, Qwen3-8B 100%" in row
    assert "median absolute error" in out.getvalue()


def test_a_query_whose_route_call_is_in_flight_is_not_an_error_until_it_goes_unanswered() -> None:
    """The progress line counted every query whose Route call had not returned yet as an error (it showed 'errors 1'
    mid-turn, then 'errors 0' at the end); a call in flight is neither an error nor a route latency until it ends."""
    import asyncio

    import grpc

    from bear.demo.assets import DemoPrompt
    from bear.demo.workload import FAILED, ROUTING, PlannedQuery, WorkloadClient
    from bear.router.client import RouterError

    class Router:
        def __init__(self) -> None:
            self.answers: asyncio.Queue[Exception] = asyncio.Queue()

        async def route(self, *args: object, **kwargs: object) -> object:
            raise await self.answers.get()  # each call ends when the test says how

    async def scenario() -> None:
        router = Router()
        client = WorkloadClient(router, lambda *args: None, None, asyncio.get_running_loop())  # type: ignore[arg-type]
        turn = PolicyTurn("bear", 0.3)
        prompt = DemoPrompt("hello there", "chat", {}, {})
        queries = [PlannedQuery(0.0, prompt, 1.0), PlannedQuery(0.0, prompt, 1.0)]
        running = asyncio.create_task(client.run_turn(turn, queries, "t"))
        await asyncio.sleep(0.05)
        summary = summarise(turn.results)
        assert [r.status for r in turn.results] == [ROUTING, ROUTING]
        assert summary["errors"] == 0 and summary["route_p50_ms"] is None and summary["queries"] == 2
        assert "errors 0" in _progress_line(turn, summary)
        await router.answers.put(RouterError(grpc.StatusCode.UNAVAILABLE, "no ready instance"))
        await asyncio.sleep(0.05)
        assert sorted(r.status for r in turn.results) == [FAILED, ROUTING]
        assert summarise(turn.results)["errors"] == 1
        await running  # the turn ends with the other call unanswered: an error, with why
        failed = [r for r in turn.results if r.status == FAILED]
        assert len(failed) == 2 and summarise(turn.results)["errors"] == 2
        assert sorted(r.error for r in failed) == ["UNAVAILABLE: no ready instance", "the Route call was not answered"]

    asyncio.run(scenario())


def test_a_query_the_pool_does_not_serve_is_an_error_not_a_route() -> None:
    """(QA: with the user's BEAR_POOLS_FILE, the router chose instances the simulated pool does not have, and with
    the pool's process killed its pipe was gone; either way the queries counted as routed and late, errors 0.)"""
    import asyncio

    from bear.demo.assets import DemoPrompt
    from bear.demo.workload import FAILED, PlannedQuery, WorkloadClient
    from bear.predictor.catalog import PAPER_POOL
    from bear.v1 import router_pb2

    class Router:
        async def route(self, *args: object, request_id: str, **kwargs: object) -> router_pb2.RouteDecision:
            instance = "large-0" if request_id.endswith("-0") else "qwen3-8b-0"
            return router_pb2.RouteDecision(
                request_id=request_id, decision=router_pb2.DECISION_ROUTE, instance_id=instance, model="Qwen3-8B",
                candidates=[router_pb2.CandidateDecision(instance_id=instance, model="Qwen3-8B", prompt_tokens=3)])

    def submit(instance_id: str, request_id: str, prompt_tokens: int, output_tokens: int) -> None:
        if instance_id == "large-0":
            raise KeyError(f"no simulated instance {instance_id!r}")
        raise BrokenPipeError(32, "Broken pipe")

    async def scenario() -> PolicyTurn:
        client = WorkloadClient(Router(), submit, PAPER_POOL, asyncio.get_running_loop())  # type: ignore[arg-type]
        turn = PolicyTurn("bear", 0.2)
        prompt = DemoPrompt("hello there", "chat", {"Qwen3-8B": 0.9}, {"Qwen3-8B": 20})
        await client.run_turn(turn, [PlannedQuery(0.0, prompt, 1.0), PlannedQuery(0.0, prompt, 1.0)], "t")
        assert client.num_in_flight == 0 and client.num_queued == 0
        return turn

    turn = asyncio.run(scenario())
    assert [r.status for r in turn.results] == [FAILED, FAILED]
    assert turn.results[0].error == "not served: \"no simulated instance 'large-0'\""
    assert turn.results[1].error.startswith("not served: ") and "Broken pipe" in turn.results[1].error
    summary = summarise(turn.results)
    assert (summary["routes"], summary["errors"], summary["mix"]) == (0, 2, {})


def test_a_run_ends_with_an_error_when_the_pool_process_ends() -> None:
    """(QA: with the pool's process killed, the demo went on and printed figures as if the policy had done badly.)"""
    import asyncio

    import pytest

    from bear.demo import runner

    class Pool:
        exit_code: int | None = None

    pool = Pool()

    async def drive() -> str:
        await asyncio.sleep(0.05)
        return "figures"

    async def killed_meanwhile() -> str:
        pool.exit_code = -9
        await asyncio.sleep(60)
        return "figures"

    assert asyncio.run(runner._watched(drive(), pool)) == "figures"  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the simulated pool's process ended \(exit code -9\) during the run"):
        asyncio.run(runner._watched(killed_meanwhile(), pool))  # type: ignore[arg-type]
    assert time.monotonic() - started < 5  # within a check or two, the run cancelled


def test_a_long_turn_is_shown_in_seconds_not_in_scientific_notation() -> None:
    turn = PolicyTurn("bear", 2990.0)
    assert "/2990 s" in _progress_line(turn, summarise([])) and "e+03" not in _progress_line(turn, summarise([]))
