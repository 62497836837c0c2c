"""The ready set: diffs per pool, immutable snapshots, listeners called in order, contained, or on an event loop."""

from __future__ import annotations

import asyncio
import logging
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
