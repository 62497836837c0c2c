"""The estimator's Redis feed (fakeredis): instances, snapshots, calibrations, dispatch records, forgetting, outages."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

import fakeredis
import numpy as np
import pytest

from bear.common import redis_keys
from bear.core.lps import lps_ttft_s
from bear.core.state import Query
from bear.estimator.admission import MAX_WAITING_ROWS
from bear.estimator.estimation import MAX_CLOCK_AHEAD_S, Estimator, Method
from bear.estimator.remaining import RemainingLengths
from bear.estimator.snapshot_feed import FeedSettings, SnapshotFeed
from tests.estimator_builders import (
    PREFILL_TOKENS_PER_S,
    FakeClock,
    decoding,
    dispatch_record,
    engine,
    queued,
    record_dispatch,
    registration,
    snapshot,
)

SETTINGS = FeedSettings(resync_interval_s=0.02, dispatch_poll_interval_s=0.01, redis_deadline_s=0.5,
                        forget_after_s=30.0, lps_window_s=60.0)


class World:
    """A fake Redis, an estimator and its feed on one fake clock."""

    def __init__(self, listed: dict[str, str] | None = None) -> None:
        self.server = fakeredis.FakeServer()
        self.redis = fakeredis.FakeAsyncRedis(server=self.server)
        self.clock = FakeClock()
        self.remaining = RemainingLengths(None)
        self.estimator = Estimator(self.remaining.lookup, {}, max_snapshot_age_s=2.0, default_output_tokens=100.0,
                                   request_key=lambda engine_id: engine_id.removeprefix("cmpl-").removesuffix("-0"))
        self.feed = SnapshotFeed(self.estimator, self.redis, self.remaining, SETTINGS,
                                 request_key=lambda engine_id: engine_id.removeprefix("cmpl-").removesuffix("-0"),
                                 listed_instances=lambda: listed or {}, clock=self.clock)

    async def publish(self, message, *, register: bool = True) -> None:  # noqa: ANN001 - InstanceSnapshot
        """As the snapshotter does: the latest snapshot, the registration, the set of instances, the channel."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(redis_keys.snapshot_key(message.instance_id), message.SerializeToString())
        if register:
            pipe.set(redis_keys.instance_key(message.instance_id),
                     registration(message.instance_id, message.model).SerializeToString())
            pipe.zadd(redis_keys.INSTANCES, {message.instance_id: self.clock()})
        pipe.publish(redis_keys.SNAPSHOTS_CHANNEL, message.SerializeToString())
        await pipe.execute()

    def estimate(self, instance_id: str = "a", prompt: int = 100):  # noqa: ANN201 - TtftEstimate
        return self.estimator.estimate(Query("q", prompt, 10), [instance_id], self.clock())[0]


def run(test: Callable[[World], Awaitable[None]], **options: object) -> None:
    async def main() -> None:
        world = World(**options)  # type: ignore[arg-type]
        try:
            await test(world)
        finally:
            await world.redis.aclose()

    asyncio.run(main())


def test_a_resync_finds_registered_instances_and_their_snapshots() -> None:
    async def test(world: World) -> None:
        await world.publish(snapshot("a", world.clock() - 0.1, [decoding("r1")], model="small"))
        await world.publish(snapshot("b", world.clock() - 0.1, model="large", calibrated=False))
        await world.feed.resync_once()
        await world.feed.adopt_pending()
        assert world.estimator.instance_ids() == ["a", "b"] and world.estimator.model("b") == "large"
        a, b = world.estimate("a"), world.estimate("b")
        assert a.method is Method.REPLAY and a.snapshot_age_s == pytest.approx(0.1)
        assert b.method is Method.NONE and b.reason == "not calibrated, no LPS parameters"
        calibration = world.estimator.calibration("a")
        assert calibration is not None and calibration.prefill_tokens_per_s == PREFILL_TOKENS_PER_S
        assert world.feed.stats.snapshots_adopted == 2

    run(test)



@pytest.mark.parametrize("ratio", [0.8, 1.5, 2.0])
def test_the_engine_speed_of_the_snapshot_scales_the_replay(ratio: float) -> None:
    async def adopt(world: World, step_time_ratio: float) -> None:
        """A new snapshot of the same state, 1 ms old, with this speed."""
        world.clock.advance(1.0)
        message = snapshot("a", world.clock() - 0.001, [decoding("r1")])
        message.step_time_ratio = step_time_ratio
        await world.publish(message)
        await world.feed.resync_once()
        await world.feed.adopt_pending()

    async def test(world: World) -> None:
        await adopt(world, 0.0)
        plain = world.estimate("a", prompt=300)
        calibration = world.estimator.calibration("a")
        assert calibration is not None
        fitted = calibration.coefficients
        await adopt(world, ratio)
        scaled = world.estimate("a", prompt=300)
        calibration = world.estimator.calibration("a")
        assert calibration is not None and calibration.coefficients == fitted.at_speed(ratio) != fitted
        assert plain.method is scaled.method is Method.REPLAY and scaled.num_batches == plain.num_batches
        assert plain.ttft_s is not None and scaled.ttft_s is not None  # the replay runs from the snapshot:
        from_snapshot = plain.ttft_s + plain.snapshot_age_s, scaled.ttft_s + scaled.snapshot_age_s
        # slower (faster) by less than the ratio: the query's prefill tokens cost what the fit says
        assert min(1.0, ratio) * from_snapshot[0] < from_snapshot[1] < max(1.0, ratio) * from_snapshot[0]
        for unknown in (0.0, -1.0, math.nan, math.inf):  # not a speed: the fit as it is
            await adopt(world, unknown)
            calibration = world.estimator.calibration("a")
            assert calibration is not None and calibration.coefficients == fitted
        assert world.feed.stats.snapshots_adopted == 6

    run(test)

def test_residents_take_their_length_from_the_dispatch_record_of_their_router_id() -> None:
    async def test(world: World) -> None:
        await record_dispatch(world.redis, dispatch_record("r1", "a", world.clock() - 5, predicted_output_tokens=300))
        await world.publish(snapshot("a", world.clock(), [decoding("cmpl-r1-0", output=20), decoding("cmpl-r2-0")]))
        await world.feed.resync_once()
        await world.feed.adopt_pending()
        assert world.estimator.pending_decode_tokens("a") == (300 - 20) + (100 - 1)  # r2: no record, default length
        assert world.feed.stats.dispatches_recorded == 1
        # r2's record appears later: it is looked for again after a while, not on every snapshot
        await record_dispatch(world.redis, dispatch_record("r2", "a", world.clock() - 1, predicted_output_tokens=50))
        world.clock.advance(0.5)
        world.feed.offer(snapshot("a", world.clock(), [decoding("cmpl-r1-0", output=21),
                                                       decoding("cmpl-r2-0", 100, 2)]))
        await world.feed.adopt_pending()
        assert world.estimator.pending_decode_tokens("a") == (300 - 21) + (100 - 2)
        world.clock.advance(5.0)
        world.feed.offer(snapshot("a", world.clock(), [decoding("cmpl-r1-0", output=22),
                                                       decoding("cmpl-r2-0", 100, 3)]))
        await world.feed.adopt_pending()
        assert world.estimator.pending_decode_tokens("a") == (300 - 22) + (50 - 3)

    run(test)


def test_residents_looked_for_in_vain_are_forgotten_once_they_leave() -> None:
    """Requests that BEAR did not route (no dispatch record) come and go for as long as an instance lives: the
    feed remembers looking for the records of its residents of now only, and still looks for each at most once per
    retry interval."""
    async def test(world: World) -> None:
        asked: list[int] = []
        mget = world.redis.mget

        async def counting_mget(keys, *args):  # noqa: ANN001, ANN202
            asked.append(len(keys))
            return await mget(keys, *args)

        world.redis.mget = counting_mget  # type: ignore[method-assign]
        await world.publish(snapshot("a", world.clock(), []))
        await world.feed.resync_once()
        await world.feed.adopt_pending()
        for step in range(300):  # 4 residents at a time, each resident for 4 steps, 10 ms apart
            world.clock.advance(0.01)
            world.feed.offer(snapshot("a", world.clock(), [decoding(f"direct-{step - age}", output=age + 1)
                                                           for age in range(4) if step - age >= 0]))
            await world.feed.adopt_pending()
            assert len(world.feed._tracked["a"].missing_dispatches) <= 4  # noqa: SLF001 - the bound itself
        assert sum(asked) == 300  # each of the 300 requests looked for once, when it first appeared
        world.clock.advance(0.01)
        still = [decoding(f"direct-{299 - age}", output=5 + age) for age in range(3)]
        world.feed.offer(snapshot("a", world.clock(), still))
        await world.feed.adopt_pending()
        assert sum(asked) == 300  # residents looked for less than MISSING_DISPATCH_RETRY_S ago are not asked again
        world.clock.advance(5.0)
        world.feed.offer(snapshot("a", world.clock(), still))
        await world.feed.adopt_pending()
        assert asked[-1] == 3  # ... and are after it

    run(test)


def test_dispatches_since_the_snapshot_join_the_replay() -> None:
    async def test(world: World) -> None:
        await world.publish(snapshot("a", world.clock(), [decoding("r1")]))
        await world.feed.resync_once()
        await world.feed.adopt_pending()
        world.clock.advance(0.05)
        before = world.estimate()
        await record_dispatch(world.redis, dispatch_record("d1", "a", world.clock() - 0.04, prompt_tokens=4000))
        await record_dispatch(world.redis, dispatch_record("old", "a", world.clock() - 60))  # before the snapshot
        await world.feed.poll_dispatches_once()
        after = world.estimate()
        assert world.estimator.has_dispatch("a", "d1") and not world.estimator.has_dispatch("a", "old")
        assert after.ttft_s > 5 * before.ttft_s  # type: ignore[operator] - the query waits behind its prefill

    run(test)


def test_an_instance_gone_from_redis_is_forgotten_unless_discovery_lists_it() -> None:
    async def test(world: World) -> None:
        await world.publish(snapshot("a", world.clock()))
        await world.publish(snapshot("b", world.clock()))
        await world.feed.resync_once()
        await world.redis.flushall()
        world.clock.advance(SETTINGS.forget_after_s - 1)
        await world.feed.resync_once()
        assert world.estimator.instance_ids() == ["a", "b"]
        world.clock.advance(2)
        await world.feed.resync_once()
        assert world.estimator.instance_ids() == ["b"] and world.feed.instance_ids() == ["b"]

    run(test, listed={"b": "m"})


def test_a_stale_snapshot_falls_back_to_lps_measured_from_the_stream() -> None:
    async def test(world: World) -> None:
        start = world.clock()
        for t in range(11):  # two requests running; every second one completes and another starts
            world.clock.now_s = start + t
            world.feed.offer(snapshot("a", start + t, [decoding(f"r{t}"), decoding(f"r{t + 1}")]))
            await world.feed.adopt_pending()
            if t in (2, 4, 6, 8):  # a router dispatches a query to it
                await record_dispatch(world.redis, dispatch_record(f"d{t}", "a", start + t + 0.5))
                await world.feed.poll_dispatches_once()
        world.clock.advance(3.0)  # the snapshot is now 3 s old
        await world.feed.resync_once()
        got = world.estimate(prompt=2000)
        calibration = world.estimator.calibration("a")
        assert calibration is not None and calibration.lps is not None
        lps = calibration.lps
        assert (lps.service_rate_qps, lps.concurrency) == (pytest.approx(1.0), pytest.approx(2.0))
        assert lps.arrival_rate_qps == pytest.approx(4 / 13)
        assert got.method is Method.LPS and got.ttft_s == pytest.approx(lps_ttft_s(lps, 2000))
        assert got.reason == "snapshot 3.000 s old: LPS closed form" and got.snapshot_age_s == pytest.approx(3.0)

    run(test)


def test_a_snapshot_the_replay_cannot_use_is_counted_and_the_previous_one_kept() -> None:
    async def test(world: World) -> None:
        world.feed.offer(snapshot("a", world.clock(), [decoding("r1")]))
        await world.feed.adopt_pending()
        broken = snapshot("a", world.clock() + 0.01, [decoding("r1")])
        broken.engine.max_num_seqs = 0
        world.feed.offer(broken)
        await world.feed.adopt_pending()
        assert world.feed.stats.snapshots_rejected == 1
        assert world.estimator.snapshot("a").taken_at_s == world.clock()  # type: ignore[union-attr]

    run(test)


def test_only_the_newest_offer_of_an_instance_is_adopted() -> None:
    async def test(world: World) -> None:
        now = world.clock()
        world.feed.offer(snapshot("a", now - 0.2, [decoding("r1")]))
        world.feed.offer(snapshot("a", now - 0.1, [decoding("r1"), decoding("r2")]))
        world.feed.offer(snapshot("a", now - 0.3, []))
        await world.feed.adopt_pending()
        assert world.feed.stats.snapshots_adopted == 1
        assert len(world.estimator.snapshot("a").running) == 2  # type: ignore[union-attr]
        same = snapshot("a", now - 0.1, [decoding("r1"), decoding("r2")], read_at_s=now)  # found current later
        world.feed.offer(same)
        await world.feed.adopt_pending()
        assert world.estimate().snapshot_age_s == 0.0

    run(test)


def test_the_feed_rides_out_a_redis_outage() -> None:
    async def test(world: World) -> None:
        task = asyncio.create_task(world.feed.run())
        await world.publish(snapshot("a", world.clock(), [decoding("r1")]))
        await _until(lambda: world.estimator.knows("a") and world.estimator.snapshot("a") is not None)
        world.server.connected = False
        await _until(lambda: world.feed.stats.redis_failures >= 3)
        assert world.estimate().method is Method.REPLAY  # still answering from what it holds
        world.server.connected = True
        world.clock.advance(0.5)
        await _until(lambda: world.feed.stats.subscribed)
        await world.publish(snapshot("a", world.clock(), [decoding("r1"), decoding("r2")]))
        await _until(lambda: len(world.estimator.snapshot("a").running) == 2)  # type: ignore[union-attr]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(test)


def test_a_subscription_failing_with_no_redis_error_is_logged_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    # QA: a password that could not be encoded raised UnicodeEncodeError, which ended the whole feed for good while
    # the estimator's health still said SERVING.
    async def test(world: World) -> None:
        real_pubsub, failures = world.redis.pubsub, [2]

        def pubsub() -> object:
            channel = real_pubsub()
            if failures[0] > 0:
                failures[0] -= 1

                async def subscribe(*channels: object) -> None:
                    raise UnicodeEncodeError("utf-8", "p\udcff", 1, 2, "surrogates not allowed")
                channel.subscribe = subscribe  # type: ignore[method-assign]
            return channel

        world.redis.pubsub = pubsub  # type: ignore[method-assign]
        task = asyncio.create_task(world.feed.run())
        await _until(lambda: world.feed.stats.subscribed, timeout_s=10.0)
        await world.publish(snapshot("a", world.clock(), [decoding("r1")]))
        await _until(lambda: world.estimator.knows("a") and world.estimator.snapshot("a") is not None)
        assert not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level(logging.ERROR, logger="bear.estimator"):
        run(test)
    assert sum("the subscription failed" in r.message for r in caplog.records) == 2


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_resident_rows_of_several_snapshots_are_asked_together() -> None:
    asked: list[tuple[str, list[float]]] = []

    async def source(model: str, predicted: np.ndarray, generated: np.ndarray, max_tokens: np.ndarray) -> np.ndarray:
        asked.append((model, generated.tolist()))
        return predicted - generated

    async def test(world: World) -> None:
        world.remaining = RemainingLengths(source)
        world.estimator = Estimator(world.remaining.lookup, {}, default_output_tokens=100.0)
        world.feed = SnapshotFeed(world.estimator, world.redis, world.remaining, SETTINGS, clock=world.clock)
        world.feed.offer(snapshot("a", world.clock(), [decoding("r1", output=3)]))
        world.feed.offer(snapshot("b", world.clock(), [decoding("r2", output=5)]))
        await world.feed.adopt_pending()
        assert asked == [("m", [3.0, 5.0])]
        assert world.estimator.pending_decode_tokens("b") == 95

    run(test)


# What the feed skips or refuses ---------------------------------------------------------------------------------

def test_values_in_redis_that_do_not_decode_are_skipped_once_logged_and_the_others_used(
        caplog: pytest.LogCaptureFixture) -> None:
    async def test(world: World) -> None:
        await world.publish(snapshot("a", world.clock(), [decoding("r1")]))
        await world.publish(snapshot("b", world.clock()))
        await world.redis.set(redis_keys.snapshot_key("b"), b"\xff\xff\xff\xff garbage")  # b's registration is fine
        await world.redis.set(redis_keys.instance_key("bad"), b"\xff\xff\xff\xff garbage")
        await world.redis.zadd(redis_keys.INSTANCES, {"bad": world.clock(), b"\xff\xfe": world.clock()})
        for _ in range(3):
            await world.feed.resync_once()
        await world.feed.adopt_pending()
        assert world.feed.stats.resyncs == 3 and world.feed.stats.undecodable_values == 3 * 3
        assert world.estimator.instance_ids() == ["a", "b"] and world.estimate("a").method is Method.REPLAY
        assert world.estimator.snapshot("b") is None
        skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
        assert len(skipped) == 3  # once per key, not at every resync
        assert any("bear:instances is not UTF-8" in message for message in skipped)

    with caplog.at_level("WARNING", logger="bear.estimator"):
        run(test)


def test_a_value_under_one_instances_key_naming_another_instance_is_skipped() -> None:
    async def test(world: World) -> None:
        await world.publish(snapshot("a", world.clock(), [decoding("r1")]))
        await world.publish(snapshot("b", world.clock()))
        # b's snapshot key holds a's snapshot; a's registration key holds a registration of "phantom"
        await world.redis.set(redis_keys.snapshot_key("b"), snapshot("a", world.clock() + 1).SerializeToString())
        await world.redis.set(redis_keys.instance_key("a"), registration("phantom").SerializeToString())
        await world.feed.resync_once()
        await world.feed.adopt_pending()
        assert world.estimator.instance_ids() == ["a", "b"] and world.feed.stats.undecodable_values == 2
        held = world.estimator.snapshot("a")
        assert world.estimator.snapshot("b") is None and held is not None and held.taken_at_s == world.clock()

    run(test)


def test_a_prefill_throughput_that_is_not_a_finite_number_is_not_taken() -> None:
    async def test(world: World) -> None:
        for prefill_tokens_per_s in (PREFILL_TOKENS_PER_S, math.inf, 0.0):  # 0: not measured yet
            world.clock.advance(1.0)
            message = snapshot("a", world.clock(), [decoding("r1")])
            message.batch_time.prefill_tokens_per_s = prefill_tokens_per_s
            await world.publish(message)
            await world.feed.resync_once()
            await world.feed.adopt_pending()
            calibration = world.estimator.calibration("a")
            assert calibration is not None and calibration.prefill_tokens_per_s == PREFILL_TOKENS_PER_S
            estimate = world.estimate("a")
            assert estimate.method is Method.REPLAY and estimate.prefill_tps_ttft_s is not None

    run(test)


def test_a_dispatch_member_that_is_not_utf8_is_skipped() -> None:
    async def test(world: World) -> None:
        await world.publish(snapshot("a", world.clock()))
        await world.publish(snapshot("b", world.clock()))
        await world.feed.resync_once()
        await world.feed.adopt_pending()
        await world.redis.zadd(redis_keys.dispatches_key("a"), {b"\xff\xfe": world.clock() + 0.01})
        await record_dispatch(world.redis, dispatch_record("d1", "b", world.clock() + 0.01))
        await world.feed.poll_dispatches_once()
        assert world.estimator.has_dispatch("b", "d1") and world.feed.stats.undecodable_values == 1

    run(test)


def test_dispatch_records_that_cannot_be_dispatches_are_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A record from Redis or from a caller with no prompt tokens or a time that is not a number, and a value that is
    no record: skipped (the rest recorded) and counted, not dropped unseen (QA: a router's bad records went nowhere)."""
    async def test(world: World) -> None:
        await world.publish(snapshot("a", world.clock()))
        await world.feed.resync_once()
        await world.feed.adopt_pending()
        now = world.clock()
        await record_dispatch(world.redis, dispatch_record("bad-tokens", "a", now + 0.01, prompt_tokens=0))
        await record_dispatch(world.redis, dispatch_record("good", "a", now + 0.01))
        await world.redis.set(redis_keys.dispatch_key("foreign"), b"\xff\x00\x01")
        await world.redis.zadd(redis_keys.dispatches_key("a"), {"foreign": now + 0.01})
        await world.feed.poll_dispatches_once()
        assert world.estimator.has_dispatch("a", "good") and not world.estimator.has_dispatch("a", "bad-tokens")
        assert world.feed.record_dispatch(dispatch_record("bad-time", "a", math.nan)) is False
        # A time far ahead never leaves the windows (QA: 1e300 overflowed the LPS arrival statistics, and stopped
        # the adoption of the snapshots after it).
        assert world.feed.record_dispatch(dispatch_record("far-ahead", "a", now + 1e300)) is False
        assert world.feed.record_dispatch(dispatch_record("skewed", "a", now + 4.0)) is True
        assert world.feed.record_dispatch(dispatch_record("fine", "a", now)) is True
        assert world.feed.stats.dispatches_unusable == 3 and world.feed.stats.undecodable_values == 1

    with caplog.at_level("WARNING", logger="bear.estimator"):
        run(test)
    assert [m for m in caplog.messages if "unusable" in m] == [
        "dispatch record of 'bad-tokens' to instance a unusable (1 times): no request id, no prompt tokens, a length "
        "that is not a number, or a time that is not one or is more than 5 s ahead of this clock (the replay goes on "
        "without it)"]


@pytest.mark.parametrize("taken_at_s, read_at_s", [(math.nan, None), (math.inf, None), (-math.inf, None),
                                                   (0.0, math.nan), (0.0, math.inf)])
def test_a_snapshot_whose_times_are_not_numbers_is_refused_and_the_dispatch_poll_goes_on(
        taken_at_s: float, read_at_s: float | None) -> None:
    async def test(world: World) -> None:
        now = world.clock()
        world.feed.offer(snapshot("a", now, [decoding("r1")]))
        await world.feed.adopt_pending()
        bad = snapshot("a", now + taken_at_s, sequence_number=2 ** 40, read_at_s=read_at_s)
        world.feed.offer(bad)
        await world.feed.adopt_pending()
        assert world.feed.stats.snapshots_rejected == 1
        assert world.estimator.snapshot("a").taken_at_s == now  # type: ignore[union-attr]
        await record_dispatch(world.redis, dispatch_record("d1", "a", now + 0.01))
        await world.feed.poll_dispatches_once()  # no ZRANGEBYSCORE from a bound that is not a number
        assert world.estimator.has_dispatch("a", "d1")

    run(test)


@pytest.mark.parametrize("taken_ahead_s, read_ahead_s", [(365 * 86400.0, None), (MAX_CLOCK_AHEAD_S + 0.5, None),
                                                          (0.01, 365 * 86400.0)])
def test_a_snapshot_from_the_future_is_refused_and_later_ones_still_adopted(taken_ahead_s: float,
                                                                           read_ahead_s: float | None) -> None:
    async def test(world: World) -> None:
        now = world.clock()
        world.feed.offer(snapshot("a", now, [decoding("r1")]))
        await world.feed.adopt_pending()
        future = snapshot("a", now + taken_ahead_s, [decoding("bogus")],
                          read_at_s=None if read_ahead_s is None else now + read_ahead_s)
        world.feed.offer(future)
        await world.feed.adopt_pending()
        assert world.feed.stats.snapshots_rejected == 1
        assert world.estimator.snapshot("a").running[0].request_id == "r1"  # type: ignore[union-attr]
        world.clock.advance(3.0)
        # past the age limit, the estimate says why no newer snapshot was taken (a clock ahead, here)
        stale = world.estimate()
        assert stale.method is not Method.REPLAY and "its latest snapshot was refused: " in stale.reason
        assert "ahead of the estimator's clock" in stale.reason
        world.feed.offer(snapshot("a", world.clock(), [decoding("r2")]))
        await world.feed.adopt_pending()
        assert world.estimator.snapshot("a").running[0].request_id == "r2"  # type: ignore[union-attr]
        assert world.estimate().snapshot_age_s == 0.0 and world.estimate().method is Method.REPLAY

    run(test)


def test_a_snapshot_held_ahead_of_the_clock_gives_way_to_a_greater_sequence_number_or_a_clock_gone_back() -> None:
    async def test(world: World) -> None:
        now = world.clock()
        world.feed.offer(snapshot("a", now + 4.0, [decoding("skewed")], sequence_number=100))  # within the tolerance
        await world.feed.adopt_pending()
        world.feed.offer(snapshot("a", now + 0.1, [decoding("older")], sequence_number=99))  # taken before it
        await world.feed.adopt_pending()
        assert world.estimator.snapshot("a").running[0].request_id == "skewed"  # type: ignore[union-attr]
        world.feed.offer(snapshot("a", now + 0.2, [decoding("next")], sequence_number=101))
        await world.feed.adopt_pending()
        assert world.estimator.snapshot("a").running[0].request_id == "next"  # type: ignore[union-attr]
        world.feed.offer(snapshot("a", now + 4.0, [decoding("skewed")], sequence_number=102))
        await world.feed.adopt_pending()
        world.clock.advance(-10.0)  # the estimator's clock goes back: what it holds is now far ahead
        world.feed.offer(snapshot("a", world.clock(), [decoding("restarted")], sequence_number=1))
        await world.feed.adopt_pending()
        assert world.estimator.snapshot("a").running[0].request_id == "restarted"  # type: ignore[union-attr]

    run(test)


def test_a_snapshot_with_more_rows_than_the_snapshotter_writes_is_refused_before_any_work_on_its_rows() -> None:
    keys_asked: list[str] = []

    async def test(world: World) -> None:
        world.feed = SnapshotFeed(world.estimator, world.redis, world.remaining, SETTINGS, clock=world.clock,
                                  request_key=lambda engine_id: keys_asked.append(engine_id) or engine_id)
        small = engine(max_num_seqs=4)
        running = [decoding(f"r{k}") for k in range(4)]
        world.feed.offer(snapshot("a", world.clock(), running[:1], engine_config=small))
        await world.feed.adopt_pending()
        keys_asked.clear()
        too_many_running = snapshot("a", world.clock() + 0.1, [*running, decoding("r4")], engine_config=small)
        waiting = [queued(f"w{k}") for k in range(MAX_WAITING_ROWS + 1)]
        too_many_rows = snapshot("a", world.clock() + 0.2, running, waiting, engine_config=small)
        for message in (too_many_running, too_many_rows):
            world.feed.offer(message)
            await world.feed.adopt_pending()
        assert world.feed.stats.snapshots_rejected == 2 and keys_asked == []
        assert len(world.estimator.snapshot("a").running) == 1  # type: ignore[union-attr]
        world.feed.offer(snapshot("a", world.clock() + 0.3, running, waiting[:-1], engine_config=small))  # at the cap
        await world.feed.adopt_pending()
        assert len(world.estimator.snapshot("a").waiting) == MAX_WAITING_ROWS  # type: ignore[union-attr]

    run(test)
