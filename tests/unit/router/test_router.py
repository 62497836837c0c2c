"""The decision pipeline with in-memory neighbours: what reaches the policy, what the decision reports, how each
missing input degrades it, and what is recorded, measured and traced."""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import replace

import pytest

from bear.core.state import EngineConfig
from bear.router.decision import DispatchRecord, Outcome
from bear.router.query import DuplicateRequest, InvalidQuery, RouteQuery
from bear.router.router import DecisionUnreachable, NoInstances
from bear.router.signals import DependencyUnavailable, QueueLengths
from bear.routing.contract import Decision
from bear.routing.observations import MIN_RESIDUALS
from tests.unit.router.builders import (
    INSTANCES,
    candidate_of,
    estimate,
    make_router,
    prediction,
    route,
    word_keys,
)

DOWN = DependencyUnavailable("x", "UNAVAILABLE", "connection refused")


def test_bear_takes_the_best_utility_among_instances_meeting_the_target() -> None:
    harness = make_router(estimates={"small-0": estimate("small-0", 100), "medium-0": estimate("medium-0", 200),
                                     "large-0": estimate("large-0", 900)})
    result = route(harness, slo_ms=500)
    assert (result.instance_id, result.model, result.endpoint) == ("medium-0", "Qwen3-8B", "http://medium-0:8000")
    assert result.policy == "bear" and not result.degraded and result.decision is Decision.ROUTE
    assert [c.instance_id for c in result.candidates] == ["large-0", "medium-0", "small-0"]  # by instance id
    large = candidate_of(result, "large-0")
    assert (large.ttft_known, large.predicted_ttft_ms, large.feasible, large.ttft_method) == (True, 900, False,
                                                                                                "replay")
    assert candidate_of(result, "medium-0").feasible and candidate_of(result, "medium-0").snapshot_age_ms == 5


def test_every_candidate_carries_predictions_cost_utility_and_score() -> None:
    harness = make_router(predictions={"Qwen3-0.6B": prediction("Qwen3-0.6B", 0.5, 100, prompt_tokens=40),
                                       "Qwen3-8B": prediction("Qwen3-8B", 0.7, 200, prompt_tokens=41),
                                       "Qwen3-32B": prediction("Qwen3-32B", 0.9, 300, prompt_tokens=42)})
    result = route(harness, lambda_per_micro_usd=1e-3)
    medium = candidate_of(result, "medium-0")
    cost = 41 * 0.072 + 200 * 0.287  # the instance's prices × the predictor's tokens
    assert (medium.predicted_accuracy, medium.predicted_output_tokens, medium.prompt_tokens) == (0.7, 200, 41)
    assert medium.predicted_cost_micro_usd == pytest.approx(cost)
    assert medium.utility == pytest.approx(0.7 - 1e-3 * cost) and medium.score == pytest.approx(medium.utility)


def test_an_instance_without_prices_takes_the_predictors_cost() -> None:
    from bear.router.pool import Registration

    harness = make_router(instances=(Registration("a", "p", "Qwen3-8B", "http://a"),),
                          predictions={"Qwen3-8B": prediction("Qwen3-8B", 0.7, cost=123.0)})
    assert route(harness).candidates[0].predicted_cost_micro_usd == 123.0


def test_max_tokens_caps_the_output_lengths_costs_estimate_and_dispatch_record() -> None:
    """A request that may write at most 50 tokens: its predicted lengths, its cost and the output length the estimator
    replays it with are at most 50; its dispatch record keeps the predictor's mean and the cap, as a snapshot would
    (the estimator draws remaining lengths about the mean, capped)."""
    from bear.router.pool import Registration

    harness = make_router(predictions={"Qwen3-0.6B": prediction("Qwen3-0.6B", 0.5, 30, prompt_tokens=40),
                                       "Qwen3-8B": prediction("Qwen3-8B", 0.7, 200, prompt_tokens=41),
                                       "Qwen3-32B": prediction("Qwen3-32B", 0.9, 300, prompt_tokens=42)})
    result = route(harness, max_tokens=50, request_id="q")
    assert {c.model: c.predicted_output_tokens for c in result.candidates} == {
        "Qwen3-0.6B": 30, "Qwen3-8B": 50, "Qwen3-32B": 50}
    assert candidate_of(result, "medium-0").predicted_cost_micro_usd == pytest.approx(41 * 0.072 + 50 * 0.287)
    assert harness.estimator.output_tokens[-1] <= 50
    (record,) = harness.store.records
    predicted = {"small-0": 30, "medium-0": 200, "large-0": 300}[record.instance_id]
    assert (record.request_id, record.predicted_output_tokens, record.max_tokens) == ("q", predicted, 50)
    # the predictor's own cost (an instance without prices) loses the tokens cut, at the catalogue's output price
    unpriced = make_router(instances=(Registration("a", "p", "Qwen3-8B", "http://a"),),
                           predictions={"Qwen3-8B": prediction("Qwen3-8B", 0.7, 200, cost=123.0, output_price=0.5)})
    assert route(unpriced, max_tokens=50).candidates[0].predicted_cost_micro_usd == pytest.approx(123.0 - 150 * 0.5)
    with pytest.raises(InvalidQuery, match="max_tokens: must be at least 1"):
        route(make_router(), max_tokens=0)


def test_hugging_face_model_names_meet_the_catalogues_short_names() -> None:
    from bear.router.pool import Registration

    harness = make_router(instances=(Registration("a", "p", "Qwen/Qwen3-8B", "http://a"),),
                          predictions={"Qwen3-8B": prediction("Qwen3-8B", 0.7)})
    result = route(harness, allowed_models=("Qwen3-8B",))
    assert result.instance_id == "a" and result.candidates[0].predicted_accuracy == 0.7 and not result.degraded


def test_the_estimator_gets_the_routers_token_count_the_instances_and_a_horizon() -> None:
    harness = make_router()
    route(harness, "one two three four", slo_ms=500, request_id="q7")
    assert harness.estimator.calls == [("q7", 4, ("large-0", "medium-0", "small-0"), (4 * 0.5 + 1) * 1000)]
    assert harness.predictor.prompts == ["one two three four"]


def test_the_prompts_prefix_blocks_go_to_the_estimator_and_into_the_dispatch_record() -> None:
    # The estimator finds what each instance's prefix cache likely holds from the prefixes of the prompts routed there.
    from bear.common.prefix_blocks import prefix_block_hashes

    harness = make_router()
    text = " ".join(f"w{n}" for n in range(40))  # 40 tokens (one per word here): two whole blocks of 16
    route(harness, text, request_id="long")
    hashes = prefix_block_hashes(word_keys(text))
    assert len(hashes) == 16 and harness.estimator.prefix_hashes == [hashes]
    (record,) = harness.store.records
    assert record.prompt_prefix_hashes == hashes
    from bear.router import wire

    assert wire.dispatch_from_bytes(wire.dispatch_to_bytes(record)) == record
    # the estimator's view of the prefix cache reaches the Route reply
    harness.estimator.estimates["small-0"] = replace(estimate("small-0"), cached_prompt_tokens=32)
    assert candidate_of(route(harness, text, request_id="again"), "small-0").cached_prompt_tokens == 32
    harness.store.records.pop()
    route(harness, None, prompt_tokens=400, request_id="length-only")  # no text: no prefixes
    route(harness, "a short prompt", request_id="short")  # under one block
    assert harness.estimator.prefix_hashes[2:] == [b"", b""]
    assert [r.prompt_prefix_hashes for r in harness.store.records[1:]] == [b"", b""]


def test_the_routers_latest_dispatches_go_along_with_the_next_estimate_calls() -> None:
    # The estimator hears of dispatches through Redis only tens of milliseconds later; meanwhile the router tells it.
    harness = make_router(recent_dispatches_s=0.25)
    route(harness, request_id="a")
    harness.clock[0] += 0.1
    route(harness, request_id="b")
    harness.clock[0] += 0.2
    route(harness, request_id="c")  # "a" is 0.3 s old by now
    assert harness.estimator.recent == [(), ("a",), ("b",)]
    for n in range(40):
        route(harness, request_id=f"n{n}")
    assert harness.estimator.recent[-1] == tuple(f"n{n}" for n in range(7, 39))  # at most 32, the newest, in order
    off = make_router(recent_dispatches_s=0.0)
    route(off, request_id="a")
    route(off, request_id="b")
    assert off.estimator.recent == [(), ()]


def test_a_length_only_query_skips_the_predictor_and_compares_cost() -> None:
    harness = make_router()
    result = route(harness, None, prompt_tokens=500, policy="latency-agnostic")
    assert harness.predictor.prompts == [] and not result.degraded
    assert {c.predicted_accuracy for c in result.candidates} == {0.0}
    assert {c.prompt_tokens for c in result.candidates} == {500}
    assert result.instance_id == "small-0"  # cheapest


def test_the_request_id_is_generated_when_empty_and_kept_otherwise() -> None:
    harness = make_router()
    assert route(harness, request_id="mine").request_id == "mine"
    generated = route(harness, request_id="").request_id
    assert len(generated) == 32 and generated != route(harness, request_id="").request_id


def test_the_default_policy_applies_when_the_request_names_none() -> None:
    harness = make_router(default_policy="round-robin")
    assert route(harness).policy == "round-robin"
    assert route(harness, policy="shortest-queue").policy == "shortest-queue"


def test_policies_keep_their_state_across_requests() -> None:
    harness = make_router()
    chosen = [route(harness, policy="round-robin").instance_id for _ in range(4)]
    assert chosen == ["large-0", "medium-0", "small-0", "large-0"]


def test_baselines_read_queue_lengths_and_observed_latencies() -> None:
    harness = make_router(estimates={"small-0": estimate("small-0", running=5, waiting=2),
                                     "medium-0": estimate("medium-0", running=1, waiting=0),
                                     "large-0": estimate("large-0", running=3, waiting=3)})
    assert route(harness, policy="shortest-queue").instance_id == "medium-0"
    for request_id, instance_id, ttft_ms in (("a", "small-0", 50), ("b", "medium-0", 900), ("c", "large-0", 400)):
        harness.store.stored[request_id] = DispatchRecord(request_id, instance_id, "m", 999.0, 10, 10, 0, 500)
        asyncio.run(harness.router.report_outcome(Outcome(request_id, ttft_ms, 11, ttft_ms + 100)))
    assert route(harness, policy="vllm-sr").instance_id == "small-0"


@pytest.mark.parametrize(("broken", "reason"), [
    ("predictor", "predictor-unavailable"),
    ("estimator", "estimator-unavailable"),
    ("both", "predictor-and-estimator-unavailable"),
])
def test_a_missing_dependency_hands_the_decision_to_the_fallback(broken: str, reason: str) -> None:
    harness = make_router(estimates={"small-0": estimate("small-0", running=4), "medium-0": estimate("medium-0",
                                                                                                    running=1),
                                     "large-0": estimate("large-0", running=2)})
    harness.store.queues = {"small-0": QueueLengths(0, 0, 10.0), "medium-0": QueueLengths(3, 3, 10.0),
                            "large-0": QueueLengths(1, 0, 10.0)}
    if broken in ("predictor", "both"):
        harness.predictor.error = DependencyUnavailable("predictor", "DEADLINE_EXCEEDED", "")
    if broken in ("estimator", "both"):
        harness.estimator.error = DependencyUnavailable("estimator", "UNAVAILABLE", "connection refused")
    result = route(harness)
    assert result.degraded and result.policy == "shortest-queue" and result.decision is Decision.ROUTE
    # Queue lengths from the estimator while it answers, else from the snapshots in Redis.
    expected = "medium-0" if broken == "predictor" else "small-0"
    assert result.instance_id == expected
    source = "from the estimator" if broken == "predictor" else "from the latest snapshots in Redis"
    assert source in result.degraded_reason and "shortest-queue" in result.degraded_reason
    assert (broken in ("predictor", "both")) == ("predictor unavailable (DEADLINE_EXCEEDED)" in
                                                 result.degraded_reason)
    assert harness.metric("bear_router_fallbacks_total", reason=reason, policy="shortest-queue") == 1


def test_a_policy_that_reads_no_ttft_estimate_decides_without_the_estimator() -> None:
    """Asked for by name, it is not replaced by the fallback for a dependency it does not read: it decides over the
    latest snapshots' queue lengths in Redis, as the fallback would."""
    harness = make_router()
    harness.estimator.error = DependencyUnavailable("estimator", "UNAVAILABLE", "connection refused")
    harness.store.queues = {"small-0": QueueLengths(2, 1, 10.0), "medium-0": QueueLengths(0, 0, 10.0),
                            "large-0": QueueLengths(1, 0, 10.0)}
    queue = route(harness, policy="shortest-queue")
    assert (queue.policy, queue.degraded, queue.degraded_reason, queue.instance_id) == (
        "shortest-queue", False, "", "medium-0")
    assert route(harness, policy="round-robin").policy == "round-robin"
    assert route(harness, policy="bear").degraded  # it reads the estimates: the fallback decides
    assert harness.metric("bear_router_fallbacks_total", reason="estimator-unavailable", policy="shortest-queue") == 1
    harness.predictor.error = DependencyUnavailable("predictor", "DEADLINE_EXCEEDED", "")
    alone = route(harness, policy="round-robin")  # every policy reads the predictions (utility, at least for ties)
    assert alone.degraded and alone.degraded_reason.startswith("predictor unavailable (DEADLINE_EXCEEDED); "
                                                               "estimator unavailable")
    assert harness.metric("bear_router_fallbacks_total", reason="predictor-and-estimator-unavailable",
                          policy="shortest-queue") == 1


def test_without_queue_lengths_the_last_resort_is_round_robin() -> None:
    harness = make_router()
    harness.estimator.error = DOWN
    harness.store.down = True  # no snapshots either
    chosen = [route(harness) for _ in range(3)]
    assert {r.policy for r in chosen} == {"round-robin"} and all(r.degraded for r in chosen)
    assert [r.instance_id for r in chosen] == ["large-0", "medium-0", "small-0"]
    assert "no queue lengths" in chosen[0].degraded_reason


def test_stale_snapshots_give_the_fallback_no_queue_lengths() -> None:
    harness = make_router()
    harness.estimator.error = DOWN
    harness.store.queues = {i.instance_id: QueueLengths(1, 1, 60_000.0) for i in INSTANCES}  # a minute old
    result = route(harness)
    assert result.policy == "round-robin" and "no queue lengths" in result.degraded_reason


def test_a_policy_that_raises_is_replaced_by_the_fallback() -> None:
    harness = make_router()

    class Broken:
        name, estimator = "broken", None

        def choose(self, request, candidates):  # noqa: ANN001, ANN202
            raise ZeroDivisionError("bug")

    harness.router._policies["bear"] = Broken()  # noqa: SLF001 - inject a faulty policy
    result = route(harness)
    assert result.degraded and "policy broken failed (ZeroDivisionError: bug)" in result.degraded_reason
    assert harness.metric("bear_router_fallbacks_total", reason="policy-error", policy="shortest-queue") == 1
    # one choose stage, as for any decision (it was counted twice: the policy's try, then the fallback's)
    assert harness.metric("bear_router_stage_seconds_count", stage="choose") == 1
    [choose] = [s for s in harness.spans.get_finished_spans() if s.name == "bear.choose"]
    assert choose.attributes["bear.error"] == "policy broken failed (ZeroDivisionError: bug)"


def test_a_predictor_without_the_pools_models_counts_as_unavailable() -> None:
    harness = make_router(predictions={"other-model": prediction("other-model", 0.9)})
    result = route(harness)
    assert result.degraded and "NO_PREDICTION" in result.degraded_reason
    assert harness.metric("bear_router_unpredicted_instances_total", model="Qwen3-8B") == 1


def test_instances_whose_model_is_not_predicted_are_left_out(caplog: pytest.LogCaptureFixture) -> None:
    harness = make_router(predictions={"Qwen3-8B": prediction("Qwen3-8B", 0.7)})
    with caplog.at_level(logging.WARNING, logger="bear.router"):
        result = route(harness)
        route(harness)
    assert [c.instance_id for c in result.candidates] == ["medium-0"] and not result.degraded
    # said once per model, with what the predictor knows (QA: only a metric told a misspelt pools file's model)
    warnings = [r.getMessage() for r in caplog.records if "left out of routing" in r.getMessage()]
    assert sorted(w.split("'")[1] for w in warnings) == ["Qwen3-0.6B", "Qwen3-32B"]
    assert "instances of model 'Qwen3-32B' (large-0) are left out" in " ".join(warnings)
    assert all("(its models: Qwen3-8B)" in w for w in warnings)


def test_infeasible_and_unknown_estimates_reach_the_policy_as_such() -> None:
    harness = make_router(estimates={"small-0": estimate("small-0", 100, feasible=False),
                                     "medium-0": estimate("medium-0", None, method="none", running=None,
                                                          age_ms=None),
                                     "large-0": estimate("large-0", 300, method="lps")})
    result = route(harness, slo_ms=500)
    assert result.instance_id == "large-0"
    small, medium = candidate_of(result, "small-0"), candidate_of(result, "medium-0")
    assert math.isinf(small.predicted_ttft_ms) and not small.feasible
    assert (medium.ttft_known, medium.ttft_method, medium.snapshot_age_ms) == (False, "none", -1.0)
    assert candidate_of(result, "large-0").ttft_method == "lps"


def test_prefill_throughput_policy_shows_the_estimate_it_used() -> None:
    harness = make_router(estimates={r.instance_id: estimate(r.instance_id, 100, prefill_tps_ms=700)
                                     for r in INSTANCES})
    result = route(harness, policy="bear-prefill-tps", slo_ms=500)
    assert {(c.ttft_method, c.predicted_ttft_ms, c.feasible) for c in result.candidates} == {
        ("prefill-tps", 700, False)}


def test_a_shed_query_goes_nowhere_and_is_not_recorded() -> None:
    harness = make_router(estimates={r.instance_id: estimate(r.instance_id, 5000) for r in INSTANCES})
    harness.router._policies["bear"] = __import__("bear.routing.registry", fromlist=["x"]).build_policy(  # noqa: SLF001
        "bear", {"fallback": "shed"})
    result = route(harness, slo_ms=500)
    assert result.decision is Decision.SHED and result.instance_id == "" and result.endpoint == ""
    assert harness.store.records == []
    assert harness.metric("bear_router_sheds_total", policy="bear") == 1


def test_the_dispatch_is_recorded_with_the_chosen_candidates_predictions() -> None:
    harness = make_router(predictions={"Qwen3-0.6B": prediction("Qwen3-0.6B", 0.9, 321, prompt_tokens=12),
                                       "Qwen3-8B": prediction("Qwen3-8B", 0.1),
                                       "Qwen3-32B": prediction("Qwen3-32B", 0.1)},
                          estimates={r.instance_id: estimate(r.instance_id, 150) for r in INSTANCES})
    route(harness, request_id="q9", slo_ms=400)
    assert harness.store.records == [DispatchRecord("q9", "small-0", "Qwen3-0.6B", 1000.0, 12, 321, 150.0, 400, 0.0, True)]


def test_redis_down_delays_the_record_but_not_the_decision() -> None:
    """A record Redis did not take is kept and written once Redis answers again (QA: under load, a missed deadline
    lost every record of the next half second, and the estimator never saw those queries queued)."""
    harness = make_router()
    harness.store.down = True

    async def scenario() -> None:
        result = await harness.router.route(RouteQuery("q1", "Summarize.", None, 500.0))
        assert result.decision is Decision.ROUTE and not result.degraded
        await harness.router.flush()  # tried once, and failed
        assert harness.store.records == []
        assert not [s for s in harness.spans.get_finished_spans() if s.name == "bear.record"]  # still pending
        harness.store.down = False
        async with asyncio.timeout(5):
            while not harness.store.records:
                await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert [r.request_id for r in harness.store.records] == ["q1"]
    assert harness.metric("bear_router_dependency_errors_total", service="redis", code="UNAVAILABLE") >= 1
    assert harness.metric("bear_router_unrecorded_dispatches_total", reason="redis-unavailable") == 0
    record = next(s for s in harness.spans.get_finished_spans() if s.name == "bear.record")
    assert record.status.is_ok and record.end_time - record.start_time >= 0.4e9  # the retry came 0.5 s later


def test_records_redis_never_took_are_counted_lost_when_the_router_closes() -> None:
    harness = make_router()
    harness.store.down = True

    async def scenario() -> None:
        await harness.router.route(RouteQuery("q1", "Summarize.", None, 500.0))
        await harness.router.flush()
        await harness.router.close()

    asyncio.run(scenario())
    assert harness.store.records == []
    assert harness.metric("bear_router_unrecorded_dispatches_total", reason="redis-unavailable") == 1
    record = next(s for s in harness.spans.get_finished_spans() if s.name == "bear.record")
    assert not record.status.is_ok and "not written before the router stopped" in record.status.description
    assert record.attributes["bear.error"] == record.status.description  # as every failed stage says it


def test_a_failing_redis_is_logged_when_it_starts_failing_and_when_it_answers_again(
        caplog: pytest.LogCaptureFixture) -> None:
    harness = make_router()
    harness.store.down = True
    with caplog.at_level(logging.INFO, logger="bear.router"):
        for _ in range(3):
            asyncio.run(harness.router.refresh_instances())
        harness.store.down = False
        asyncio.run(harness.router.refresh_instances())
    failed = [r for r in caplog.records if "reading the instance registrations from Redis failed" in r.message]
    assert len(failed) == 1 and "(1 in a row" in failed[0].message and "ConnectionError: down" in failed[0].message
    assert any("Redis answered again" in r.message and "after 3 failed refreshes" in r.message
               for r in caplog.records)


def test_an_estimator_that_answers_with_an_error_failed_and_was_not_unavailable() -> None:
    harness = make_router()
    harness.estimator.error = DependencyUnavailable("estimator", "INVALID_ARGUMENT", "horizon_ms must be finite")
    result = route(harness)
    assert result.degraded and result.degraded_reason.startswith(
        "estimator failed (INVALID_ARGUMENT: horizon_ms must be finite)")


def test_no_ready_instance_is_no_instances() -> None:
    harness = make_router(instances=())
    with pytest.raises(NoInstances, match="no ready instance"):
        route(harness)


@pytest.mark.parametrize(("fields", "field"), [
    ({"prompt": ""}, "prompt"),
    ({"prompt": " \n"}, "prompt"),
    ({"prompt": None, "prompt_tokens": 0}, "prompt_tokens"),
    ({"prompt": None, "prompt_tokens": 5000}, "prompt_tokens"),
    ({"prompt": "word " * 2000}, "prompt"),  # more tokens than the limit
    ({"prompt": "x" * 20_000}, "prompt"),  # more bytes than the limit
    ({"slo_ms": -1}, "ttft_slo_ms"),
    ({"slo_ms": math.nan}, "ttft_slo_ms"),
    ({"slo_ms": math.inf}, "ttft_slo_ms"),
    ({"slo_ms": 1e12}, "ttft_slo_ms"),
    ({"slo_ms": 0}, "ttft_slo_ms"),
    ({"policy": "fastest"}, "policy"),
    ({"allowed_models": ("gpt-9",)}, "allowed_models"),
    ({"lambda_per_micro_usd": -1.0}, "lambda_per_micro_usd"),
    ({"delta_per_s": math.nan}, "delta_per_s"),
    ({"request_id": "r" * 200}, "request_id"),
    ({"request_id": "a b"}, "request_id"),  # sent to the engine as X-Request-Id: visible ASCII only
    ({"request_id": "a\nb"}, "request_id"),
    ({"request_id": "caf\u00e9"}, "request_id"),
    ({"lambda_per_micro_usd": 1e308}, "lambda_per_micro_usd"),  # λ·cost would overflow: every utility -inf
    ({"delta_per_s": 1e10}, "delta_per_s"),
])
def test_bad_input_is_refused_naming_the_field(fields: dict[str, object], field: str) -> None:
    harness = make_router()
    prompt = fields.pop("prompt", "Summarize the report.")
    with pytest.raises(InvalidQuery) as caught:
        route(harness, prompt, **fields)  # type: ignore[arg-type]
    assert caught.value.field == field and str(caught.value).startswith(f"{field}: ")
    assert harness.metric("bear_router_invalid_requests_total", field=field) == 1
    assert harness.metric("bear_router_refusals_total", method="Route", code="INVALID_ARGUMENT") == 1
    assert harness.estimator.calls == []


def test_a_long_value_is_quoted_shortly_in_the_message() -> None:
    # A status message travels in a trailer: echoing 20 kB would make the caller see RESOURCE_EXHAUSTED instead.
    harness = make_router()
    for fields in ({"policy": "p" * 20_000}, {"allowed_models": ("m" * 20_000,)}):
        with pytest.raises(InvalidQuery) as caught:
            route(harness, **fields)  # type: ignore[arg-type]
        assert len(str(caught.value)) < 500 and "(20000 characters)" in str(caught.value)


def test_a_request_id_is_routed_once() -> None:
    harness = make_router()
    first = route(harness, request_id="dup-1", allowed_models=("Qwen3-8B",))
    with pytest.raises(DuplicateRequest, match="dup-1"):
        route(harness, request_id="dup-1", allowed_models=("Qwen3-0.6B",))
    assert [r.instance_id for r in harness.store.records if r.request_id == "dup-1"] == [first.instance_id]
    # refused as a duplicate, not as an invalid id
    assert harness.metric("bear_router_refusals_total", method="Route", code="ALREADY_EXISTS") == 1
    assert harness.metric("bear_router_invalid_requests_total", field="request_id") == 0


def test_a_request_id_is_refused_while_its_first_route_call_is_still_deciding() -> None:
    harness = make_router()
    harness.estimator.delay_s = 0.05

    async def twice() -> list[object]:
        return await asyncio.gather(*(harness.router.route(RouteQuery("same", "Summarize.", None, 500.0))
                                      for _ in range(2)), return_exceptions=True)

    results = asyncio.run(twice())
    assert sum(isinstance(r, DuplicateRequest) for r in results) == 1
    assert sum(getattr(r, "decision", None) is Decision.ROUTE for r in results) == 1


def test_instances_that_can_never_serve_the_query_are_left_out_and_with_none_left_it_is_shed() -> None:
    never = replace(estimate("large-0", math.inf, feasible=False), reason="the query's prompt is too long")
    harness = make_router(estimates={"small-0": estimate("small-0", 900), "medium-0": estimate("medium-0", 950),
                                     "large-0": never})
    for policy in ("bear", "round-robin", "score"):  # a policy may not choose where the query is never served
        for _ in range(3):
            assert route(harness, policy=policy).instance_id != "large-0"
    nowhere = make_router(estimates={i.instance_id: replace(never, instance_id=i.instance_id) for i in INSTANCES})
    result = route(nowhere, policy="round-robin")
    assert result.decision is Decision.SHED and result.instance_id == "" and not result.degraded
    assert result.reason.startswith("no instance can ever serve this query") and "too long" in result.reason
    assert all(not c.feasible for c in result.candidates) and len(result.candidates) == 3
    assert nowhere.store.records == []


def test_without_the_estimator_the_snapshots_engine_settings_still_leave_out_instances_a_prompt_is_too_long_for(
        ) -> None:
    """(QA: with the estimator down, a prompt longer than every max_model_len was routed, by the fallback and by
    round-robin, to an engine that refuses it at once.)"""
    harness = make_router()
    harness.estimator.error = DependencyUnavailable("estimator", "UNAVAILABLE", "connection refused")
    short, small_cache = EngineConfig(8192, 256, 16, 4096, 512), EngineConfig(8192, 256, 16, 55, 2048)
    harness.store.queues = {"small-0": QueueLengths(0, 0, 10.0, small_cache),
                            "medium-0": QueueLengths(0, 0, 10.0, short), "large-0": QueueLengths(5, 5, 10.0, short)}
    for policy in ("bear", "round-robin", "shortest-queue"):
        for _ in range(3):
            assert route(harness, None, prompt_tokens=800, policy=policy).instance_id == "small-0"
    assert {route(harness, None, prompt_tokens=100, policy="round-robin").instance_id for _ in range(3)} == {
        "small-0", "medium-0", "large-0"}  # a prompt that fits anywhere goes anywhere
    nowhere = route(harness, None, prompt_tokens=950, policy="round-robin")
    assert nowhere.decision is Decision.SHED and nowhere.instance_id == "" and harness.store.records[-1].request_id
    assert nowhere.reason.startswith("no instance can ever serve this query")
    assert "medium-0: the query's prompt (950 tokens) is not shorter than max_model_len (512)" in nowhere.reason
    assert "small-0: the query's prompt needs 60 KV blocks, more than the cache's 55" in nowhere.reason
    assert not any(c.feasible for c in nowhere.candidates)
    harness.store.queues = {i.instance_id: QueueLengths(0, 0, 10.0) for i in INSTANCES}  # no engine settings
    assert route(harness, None, prompt_tokens=950).decision is Decision.ROUTE  # unknown: the engine will say


def test_report_outcome_measures_the_prediction_error_of_its_instance() -> None:
    harness = make_router(estimates={r.instance_id: estimate(r.instance_id, 150) for r in INSTANCES})
    result = route(harness, request_id="q1")
    known, predicted = asyncio.run(harness.router.report_outcome(Outcome("q1", 100.0, 50, 600.0)))
    assert (known, predicted) == (True, 150.0)
    instance = result.instance_id
    assert harness.metric("bear_router_ttft_error_seconds_bucket", instance=instance, le="0.025") == 0
    assert harness.metric("bear_router_ttft_error_seconds_bucket", instance=instance, le="0.05") == 1
    assert harness.metric("bear_router_ttft_abs_error_seconds_sum", instance=instance) == pytest.approx(0.05)
    assert harness.metric("bear_router_outcomes_total", known="true") == 1


def test_outcomes_teach_the_router_what_the_estimates_leave_out_at_each_instance() -> None:
    # The estimator says 100 ms everywhere; at large-0 clients see 130-ish ms (the API server's time, say).
    harness = make_router(estimates={r.instance_id: estimate(r.instance_id, 100) for r in INSTANCES})
    observed = [128.0, 131.0, 129.0, 135.0, 130.0, 400.0, 127.0, 130.0, 130.0]  # one stall: the median ignores it
    for n, ttft_ms in enumerate(observed):
        result = route(harness, request_id=f"q{n}", allowed_models=("Qwen3-32B",))
        assert result.instance_id == "large-0"
        expected = 100.0 if n < MIN_RESIDUALS else 130.0  # the offset needs MIN_RESIDUALS outcomes
        assert candidate_of(result, "large-0").predicted_ttft_ms == pytest.approx(expected)
        known, predicted = asyncio.run(harness.router.report_outcome(Outcome(f"q{n}", ttft_ms, 50, 900.0)))
        assert known and predicted == pytest.approx(expected)
    # Residuals are taken against the estimator's own TTFT, so the offset does not feed on itself.
    assert harness.metric("bear_router_ttft_offset_seconds", instance="large-0", engine="busy") == pytest.approx(0.030)
    other = route(harness, request_id="other", allowed_models=("Qwen3-8B",))
    assert candidate_of(other, "medium-0").predicted_ttft_ms == pytest.approx(100.0)  # per instance
    record = next(r for r in harness.store.records if r.request_id == "q8")
    assert (record.predicted_ttft_ms, record.ttft_offset_ms) == (pytest.approx(130.0), pytest.approx(30.0))


def test_queries_that_find_the_engine_idle_teach_and_take_an_offset_of_their_own() -> None:
    """An idle engine starts its first step later than a busy one reaches its next: clients see 20 ms more than the
    estimate when the estimator found large-0 idle, 5 ms when busy, and the router learns the two apart."""
    busy, idle = estimate("large-0", 100), replace(estimate("large-0", 100), idle_ms=500.0)
    harness = make_router(estimates={r.instance_id: estimate(r.instance_id, 100) for r in INSTANCES})
    for n in range(2 * MIN_RESIDUALS):
        harness.estimator.estimates["large-0"] = idle if n % 2 == 0 else busy
        route(harness, request_id=f"q{n}", allowed_models=("Qwen3-32B",))
        asyncio.run(harness.router.report_outcome(Outcome(f"q{n}", 120.0 if n % 2 == 0 else 105.0)))
    records = {r.request_id: r for r in harness.store.records}
    assert [records[f"q{n}"].engine_idle for n in range(4)] == [True, False, True, False]
    for name, given, expected in (("idle", idle, 120.0), ("busy", busy, 105.0)):
        harness.estimator.estimates["large-0"] = given
        candidate = candidate_of(route(harness, request_id=name, allowed_models=("Qwen3-32B",)), "large-0")
        assert candidate.predicted_ttft_ms == pytest.approx(expected)
        assert candidate.idle_ms == given.idle_ms
        assert harness.metric("bear_router_ttft_offset_seconds", instance="large-0",
                              engine=name) == pytest.approx((expected - 100) / 1000)


def test_only_the_replays_own_estimates_teach_the_offset() -> None:
    # A replay that stopped at its horizon gives a lower bound, LPS a closed form: what clients then see says
    # nothing about what the replay leaves out.
    bound = replace(estimate("large-0", 100), lower_bound=True)
    for taught_by in (bound, estimate("large-0", 100, method="lps")):
        harness = make_router(estimates={**{r.instance_id: estimate(r.instance_id, 100) for r in INSTANCES},
                                         "large-0": taught_by})
        for n in range(2 * MIN_RESIDUALS):
            route(harness, request_id=f"w{n}", allowed_models=("Qwen3-32B",))
            asyncio.run(harness.router.report_outcome(Outcome(f"w{n}", 900.0)))
        assert not any(r.ttft_exact for r in harness.store.records)
        assert candidate_of(route(harness, request_id="q"), "large-0").predicted_ttft_ms == pytest.approx(100.0)


def test_the_offset_decides_feasibility_and_can_be_turned_off() -> None:
    for window, routed_to in ((64, "medium-0"), (0, "large-0")):
        harness = make_router(estimates={r.instance_id: estimate(r.instance_id, 100) for r in INSTANCES},
                              ttft_feedback_window=window)
        for n in range(MIN_RESIDUALS):
            route(harness, request_id=f"w{n}", allowed_models=("Qwen3-32B",))
            asyncio.run(harness.router.report_outcome(Outcome(f"w{n}", 400.0)))
        result = route(harness, request_id="q", slo_ms=300)  # 32B is the most accurate, but 100 + 300 ms > 300 ms
        assert result.instance_id == routed_to


def test_the_routers_own_time_counts_against_the_target() -> None:
    """The target counts from the Route call: an instance whose estimate (from the dispatch on) fits the target but
    not what is left of it once the router has spent its time is not feasible, and the decision says what was left."""
    estimates = {"small-0": estimate("small-0", 20), "medium-0": estimate("medium-0", 40),
                 "large-0": estimate("large-0", 120)}
    quick = route(make_router(estimates=estimates), slo_ms=150)
    assert quick.instance_id == "large-0" and candidate_of(quick, "large-0").feasible  # 120 ms fits 150 ms
    assert 140 < quick.ttft_budget_ms <= 150 and quick.ttft_budget_ms >= 150 - quick.decision_ms
    slow = make_router(estimates=estimates)
    slow.estimator.delay_s = 0.06  # the estimator answers 60 ms into the call
    result = route(slow, slo_ms=150)
    large = candidate_of(result, "large-0")
    assert result.instance_id == "medium-0" and not large.feasible and large.predicted_ttft_ms == 120
    assert 150 - result.decision_ms <= result.ttft_budget_ms <= 90


def test_report_outcome_of_an_unknown_request_is_not_known() -> None:
    harness = make_router()
    assert asyncio.run(harness.router.report_outcome(Outcome("nobody", 100.0))) == (False, 0.0)
    harness.store.down = True  # then not known to be unknown: see the next test
    with pytest.raises(DecisionUnreachable):
        asyncio.run(harness.router.report_outcome(Outcome("nobody", 100.0)))
    with pytest.raises(InvalidQuery, match="observed_ttft_ms"):
        asyncio.run(harness.router.report_outcome(Outcome("q", -5.0)))
    with pytest.raises(InvalidQuery, match="request_id"):
        asyncio.run(harness.router.report_outcome(Outcome("", 5.0)))


def test_a_repeated_report_is_answered_but_counted_once_and_an_unknown_ttft_is_not_observed() -> None:
    harness = make_router(estimates={r.instance_id: estimate(r.instance_id, 100) for r in INSTANCES})
    for n in range(MIN_RESIDUALS):
        route(harness, request_id=f"w{n}", allowed_models=("Qwen3-32B",))
        for _ in range(3):  # a client's retries
            assert asyncio.run(harness.router.report_outcome(Outcome(f"w{n}", 400.0))) == (True, 100.0)
    assert harness.metric("bear_router_outcomes_total", known="true") == MIN_RESIDUALS
    route(harness, request_id="failed", allowed_models=("Qwen3-32B",))
    asyncio.run(harness.router.report_outcome(Outcome("failed", 0.0)))  # no first token: TTFT unknown
    assert harness.metric("bear_router_ttft_error_seconds_count", instance="large-0") == MIN_RESIDUALS
    assert harness.metric("bear_router_ttft_offset_seconds", instance="large-0", engine="busy") == pytest.approx(0.3)


@pytest.mark.parametrize(("outcome", "field"), [
    (Outcome("q", 1e308), "observed_ttft_ms"),
    (Outcome("q", 100.0, 5, math.inf), "observed_e2e_ms"),
    (Outcome("q", 100.0, 5, 99.0), "observed_e2e_ms"),  # the last token before the first
    (Outcome("q" * 1000, 100.0), "request_id"),
    (Outcome("a b", 100.0), "request_id"),
])
def test_absurd_outcomes_are_refused_naming_the_field(outcome: Outcome, field: str) -> None:
    with pytest.raises(InvalidQuery) as caught:
        asyncio.run(make_router().router.report_outcome(outcome))
    assert caught.value.field == field


def test_every_report_has_a_span_naming_its_request_and_whether_its_dispatch_was_found() -> None:
    harness = make_router()
    route(harness, request_id="reported")
    for request_id in ("reported", "reported", "nobody"):
        asyncio.run(harness.router.report_outcome(Outcome(request_id, 100.0)))
    spans = [s.attributes for s in harness.spans.get_finished_spans() if s.name == "bear.outcome"]
    assert [(s["bear.request_id"], s["bear.dispatch_found"], s.get("bear.repeated_report")) for s in spans] == [
        ("reported", True, None), ("reported", True, True), ("nobody", False, None)]


def test_an_outcome_without_its_ttft_gives_no_time_per_output_token() -> None:
    assert Outcome("q", 100.0, 11, 600.0).tpot_s == pytest.approx(0.05)
    assert Outcome("q", 0.0, 11, 600.0).tpot_s is None  # the end-to-end time holds the unknown TTFT too


def test_a_target_over_the_limit_is_shown_as_sent() -> None:
    with pytest.raises(InvalidQuery, match=r"600000\.1 ms exceeds the limit of 600000 ms"):
        route(make_router(), slo_ms=600_000.1)


def test_report_outcome_finds_decisions_other_replicas_recorded() -> None:
    harness = make_router()
    harness.store.stored["elsewhere"] = DispatchRecord("elsewhere", "large-0", "Qwen3-32B", 999.0, 10, 10, 80.0, 500)
    assert asyncio.run(harness.router.report_outcome(Outcome("elsewhere", 100.0))) == (True, 80.0)


def test_report_outcome_of_a_decision_not_in_memory_while_redis_is_down_is_unavailable_not_unknown() -> None:
    """(QA: answered `known: false`, and the observation was lost, though the decision was in Redis all along.)"""
    harness = make_router()
    harness.store.stored["elsewhere"] = DispatchRecord("elsewhere", "large-0", "Qwen3-32B", 999.0, 10, 10, 80.0, 500)
    harness.store.down = True
    with pytest.raises(DecisionUnreachable, match="'elsewhere'.*Redis.*did not answer.*report it again later"):
        asyncio.run(harness.router.report_outcome(Outcome("elsewhere", 100.0)))
    assert harness.metric("bear_router_outcomes_total", known="false") == 0
    route(harness, request_id="here")  # a decision this replica remembers needs no Redis
    assert asyncio.run(harness.router.report_outcome(Outcome("here", 100.0)))[0] is True
    harness.store.down = False
    assert asyncio.run(harness.router.report_outcome(Outcome("elsewhere", 100.0))) == (True, 80.0)


def test_each_stage_has_a_span_and_a_histogram_under_the_route_span() -> None:
    harness = make_router()
    route(harness, request_id="traced", slo_ms=300)
    spans = {s.name: s for s in harness.spans.get_finished_spans()}
    assert {"bear.route", "bear.predict", "bear.estimate", "bear.choose", "bear.record"} <= set(spans)
    root = spans["bear.route"]
    for stage in ("bear.predict", "bear.estimate", "bear.choose", "bear.record"):
        assert spans[stage].parent.span_id == root.context.span_id
        assert harness.metric("bear_router_stage_seconds_count", stage=stage.removeprefix("bear.")) == 1
    attributes = root.attributes
    assert (attributes["bear.request_id"], attributes["bear.ttft_slo_ms"], attributes["bear.policy"]) == (
        "traced", 300, "bear")
    assert attributes["bear.prompt_tokens"] == 3 and attributes["bear.num_candidates"] == 3
    assert 0 < attributes["bear.ttft_budget_ms"] < 300  # the target less the router's time on the call
    events = [e for e in root.events if e.name == "bear.candidate"]
    assert {e.attributes["bear.instance_id"] for e in events} == {"small-0", "medium-0", "large-0"}
    chosen = [e for e in events if e.attributes["bear.chosen"]]
    assert len(chosen) == 1 and chosen[0].attributes["bear.instance_id"] == attributes["bear.instance_id"]
    assert set(chosen[0].attributes) >= {"bear.predicted_accuracy", "bear.predicted_cost_micro_usd", "bear.utility",
                                         "bear.predicted_ttft_ms", "bear.feasible", "bear.ttft_method",
                                         "bear.cached_prompt_tokens"}
    assert harness.metric("bear_router_decision_seconds_count", policy="bear") == 1
    assert harness.metric("bear_router_routes_total", instance=attributes["bear.instance_id"],
                          model=attributes["bear.model"], policy="bear") == 1
    assert harness.metric("bear_router_snapshot_age_seconds", instance="small-0") == pytest.approx(0.005)


def test_the_log_says_which_instances_join_and_leave_the_routable_set(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bear.router")
    harness = make_router()  # its first refresh: the three instances join
    assert [r.getMessage() for r in caplog.records] == [
        "routing to 3 more instance(s): large-0, medium-0, small-0"]
    caplog.clear()
    asyncio.run(harness.router.refresh_instances())
    assert not caplog.records  # nothing changed: nothing said
    harness.store.registrations_.pop("medium-0")
    asyncio.run(harness.router.refresh_instances())
    assert [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records] == [
        ("WARNING", "no longer routing to 1 instance(s): medium-0")]
    caplog.clear()
    harness.store.registrations_.clear()
    asyncio.run(harness.router.refresh_instances())
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "no longer routing to 2 instance(s): large-0, small-0",
        "no instance left to route to: Route calls are refused"]
    caplog.clear()
    harness.store.registrations_.update({f"extra-{k:02d}": replace(INSTANCES[0], instance_id=f"extra-{k:02d}")
                                         for k in range(12)})
    asyncio.run(harness.router.refresh_instances())
    assert [r.getMessage() for r in caplog.records] == [
        "routing to 12 more instance(s): " + ", ".join(f"extra-{k:02d}" for k in range(10)) + " and 2 more"]


def test_registrations_are_refreshed_and_kept_when_redis_fails() -> None:
    harness = make_router()
    asyncio.run(harness.router.refresh_instances())
    assert harness.metric("bear_router_instances") == 3
    harness.store.registrations_.pop("large-0")
    harness.store.redis_new = True  # Redis came back empty: large-0's sidecar will register it again
    asyncio.run(harness.router.refresh_instances())
    assert len(route(harness).candidates) == 3  # kept a while
    harness.clock[0] += 20
    asyncio.run(harness.router.refresh_instances())
    assert [c.instance_id for c in route(harness).candidates] == ["medium-0", "small-0"]
    harness.store.registrations_.pop("medium-0")  # withdrawn by its sidecar: Redis kept the others
    asyncio.run(harness.router.refresh_instances())
    assert [c.instance_id for c in route(harness).candidates] == ["small-0"]
    harness.store.down = True
    asyncio.run(harness.router.refresh_instances())
    assert len(route(harness).candidates) == 1


def test_a_decision_that_ends_after_the_router_closed_records_nothing() -> None:
    """Closing flushes what was decided; a Route call still deciding then (its client gone, the server stopping)
    would otherwise start a new writer on a Redis client being closed, and leave its connection open."""
    harness = make_router()

    async def scenario() -> None:
        await harness.router.route(RouteQuery("before", "Summarize.", None, 500.0))
        await harness.router.close()
        await harness.router.route(RouteQuery("after", "Summarize.", None, 500.0))
        await harness.router.flush()

    asyncio.run(scenario())
    assert [r.request_id for r in harness.store.records] == ["before"]
    assert harness.metric("bear_router_unrecorded_dispatches_total", reason="closed") == 1


def test_closing_ends_the_first_read_of_the_registrations() -> None:
    """The first Route calls wait for a read of the registrations in a task of its own: a client that gives up
    leaves it running, and closing ends it (else it would go on with the Redis client closed under it)."""
    harness = make_router(refreshed=False)
    harness.store.delay_s = 10.0

    async def scenario() -> list[asyncio.Task]:
        call = asyncio.create_task(harness.router.route(RouteQuery("first", "Summarize.", None, 500.0)))
        await asyncio.sleep(0.05)
        call.cancel()  # the client gave up
        await asyncio.gather(call, return_exceptions=True)
        await harness.router.close()
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(scenario()) == []
