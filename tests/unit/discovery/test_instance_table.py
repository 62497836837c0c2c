"""The ready set: diffs per pool, immutable snapshots, listeners called in order, contained, or on an event loop."""

from __future__ import annotations

import asyncio
import logging
import random
import threading

import pytest

from bear.discovery.instances import Change, Instance, InstanceTable


def _instance(name: str, pool: str = "small", ip: str = "10.0.0.1") -> Instance:
    return Instance(name, pool, "m", f"http://{ip}:8000", f"{ip}:50071")


def test_changes_are_diffs_of_one_pool_against_its_previous_set() -> None:
    table, changes = InstanceTable(), []
    table.add_listener(changes.append)
    a, b = _instance("a"), _instance("b")
    first = table.set_pool("small", {"a": a, "b": b})
    assert first == Change(added=(a, b), removed=(), updated=(), instances={"a": a, "b": b})
    moved = _instance("b", ip="10.0.0.9")
    second = table.set_pool("small", {"b": moved})
    assert second is not None and (second.added, second.removed, second.updated) == ((), (a,), (moved,))
    assert table.set_pool("small", {"b": moved}) is None  # nothing changed: nobody is told
    assert changes == [first, second]


def test_pools_are_replaced_independently_and_merged() -> None:
    table = InstanceTable()
    table.set_pool("small", {"a": _instance("a")})
    table.set_pool("large", {"x": _instance("x", "large")})
    table.set_pool("small", {})
    assert list(table.instances()) == ["x"]


def test_snapshots_are_immutable_and_unaffected_by_later_changes() -> None:
    table = InstanceTable()
    ready = {"a": _instance("a")}
    table.set_pool("small", ready)
    snapshot = table.instances()
    ready["b"] = _instance("b")  # the caller's dict is copied, not kept
    table.set_pool("large", {"x": _instance("x", "large")})
    assert list(snapshot) == ["a"] and sorted(table.instances()) == ["a", "x"]
    with pytest.raises(TypeError):
        snapshot["c"] = _instance("c")  # type: ignore[index]


def test_a_failing_listener_is_logged_and_the_others_still_hear(caplog: pytest.LogCaptureFixture) -> None:
    table, heard = InstanceTable(), []

    def broken(change: Change) -> None:
        raise RuntimeError("listener bug")

    table.add_listener(broken)
    table.add_listener(heard.append)
    with caplog.at_level(logging.ERROR, logger="bear.discovery"):
        table.set_pool("small", {"a": _instance("a")})
    assert len(heard) == 1 and "listener" in caplog.text and "listener bug" in caplog.text


def test_listeners_are_never_called_concurrently() -> None:
    table, active, overlaps, calls = InstanceTable(), [0], [0], [0]
    guard = threading.Lock()

    def slow(change: Change) -> None:
        with guard:
            active[0] += 1
            overlaps[0] += active[0] > 1
            calls[0] += 1
        threading.Event().wait(0.001)
        with guard:
            active[0] -= 1

    table.add_listener(slow)
    threads = [threading.Thread(target=lambda p=p: [table.set_pool(p, {f"{p}-{i}": _instance(f"{p}-{i}", p)})
                                                   for i in range(20)]) for p in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls[0] == 60 and overlaps[0] == 0


def test_an_asyncio_listener_is_called_on_its_loop() -> None:
    async def scenario() -> tuple[Change, threading.Thread]:
        table, loop = InstanceTable(), asyncio.get_running_loop()
        heard: asyncio.Queue[tuple[Change, threading.Thread]] = asyncio.Queue()
        table.add_listener(lambda change: heard.put_nowait((change, threading.current_thread())), loop=loop)
        writer = threading.Thread(target=table.set_pool, args=("small", {"a": _instance("a")}))
        writer.start()
        writer.join()
        return await asyncio.wait_for(heard.get(), 5)

    change, thread = asyncio.run(scenario())
    assert [i.instance_id for i in change.added] == ["a"] and thread is threading.main_thread()


def test_an_id_claimed_by_two_pools_stays_with_the_first_and_the_other_is_told_once(
        caplog: pytest.LogCaptureFixture) -> None:
    table, changes = InstanceTable(), []
    table.add_listener(changes.append)
    small, large = _instance("large-0", "small"), _instance("large-0", "large")
    with caplog.at_level(logging.WARNING, logger="bear.discovery"):
        table.set_pool("small", {"large-0": small})
        assert table.set_pool("large", {"large-0": large}) is None  # both selectors match the pod: first claim wins
        assert table.set_pool("large", {"large-0": _instance("large-0", "large", ip="10.0.0.2")}) is None
        assert table.set_pool("small", {"large-0": small}) is None
    assert table.instances() == {"large-0": small}
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "large-0" in warnings[0] and "pools small and large" in warnings[0]

    handed_over = table.set_pool("small", {})  # the holder lets go: the other claim takes the id, an update
    assert handed_over is not None and (handed_over.added, handed_over.removed) == ((), ())
    assert [i.pool for i in handed_over.updated] == ["large"] and table.instances()["large-0"].pool == "large"
    gone = table.set_pool("large", {})
    assert gone is not None and [i.pool for i in gone.removed] == ["large"] and not table.instances()
    assert [len(change.added) for change in changes] == [1, 0, 0]


def test_a_static_instance_keeps_its_id_against_a_pod_named_like_it(caplog: pytest.LogCaptureFixture) -> None:
    table = InstanceTable()
    external = Instance("ext-0", "external", "Qwen3-8B", "http://192.0.2.10:8000", "192.0.2.10:50071")
    table.set_pool("external", {"ext-0": external})
    with caplog.at_level(logging.WARNING, logger="bear.discovery"):
        assert table.set_pool("small", {"ext-0": _instance("ext-0", "small")}) is None
    assert table.instances() == {"ext-0": external} and "pools external and small" in caplog.text


def test_every_change_is_the_diff_of_two_snapshots_whatever_the_pools_claim() -> None:
    """Three pools claiming overlapping ids in a random order: a replica built from the changes alone always equals
    the table, an added id was absent before, an updated or removed one present, and a removed one is gone."""
    table, rng = InstanceTable(), random.Random(7)
    replica: dict[str, Instance] = {}

    def apply(change: Change) -> None:
        assert all(i.instance_id not in replica for i in change.added)
        assert all(i.instance_id in replica for i in change.updated + change.removed)
        assert all(i.instance_id not in change.instances for i in change.removed)
        replica.update({i.instance_id: i for i in change.added + change.updated})
        for gone in change.removed:
            del replica[gone.instance_id]

    table.add_listener(apply)
    for _ in range(500):
        pool = rng.choice(["small", "medium", "large"])
        ids = rng.sample(["a", "b", "c", "d", "e"], rng.randint(0, 4))
        table.set_pool(pool, {i: _instance(i, pool, ip=f"10.0.0.{rng.randint(1, 3)}") for i in ids})
        assert replica == dict(table.instances())
