"""The pod watcher against a fake pod API: the answered watch may stay silent as long as it lasts, and stopping is
prompt whether the watch is open or the server has not answered it yet, and applies nothing afterwards."""

from __future__ import annotations

import random
import threading
import time

import pytest
from kubernetes import client

from bear.discovery import kubernetes_discovery
from bear.discovery.instances import InstanceTable
from bear.discovery.kubernetes_discovery import KubernetesDiscovery
from bear.discovery.pod_watcher import ANSWER_TIMEOUT_S, CONNECT_TIMEOUT_S, WATCH_READ_MARGIN_S, PodWatcher
from bear.discovery.pools import PoolSpec
from bear.snapshotter.backoff import Backoff
from tests.unit.discovery.builders import FakePodApi, FakeWatchResponse, make_pod, watch_line

SMALL = PoolSpec("small", "Qwen3-0.6B", 0.044, 0.173, {"bear.dev/pool": "small"})
LARGE = PoolSpec("large", "Qwen3-32B", 0.287, 0.640, {"bear.dev/pool": "large"})


def small_pod(name: str, ip: str = "10.0.0.7") -> client.V1Pod:
    return make_pod(name, ip=ip, labels=dict(SMALL.selector))


def watching(api: FakePodApi, table: InstanceTable) -> PodWatcher:
    watcher = PodWatcher(api, "bear", SMALL, table, watch_timeout_s=300.0,  # type: ignore[arg-type]
                         backoff=Backoff(0.01, 0.05, rng=random.Random(0)))
    watcher.start()
    assert watcher.synced.wait(5) and api.watch_requested.wait(5)
    return watcher


def test_the_answer_is_awaited_briefly_then_the_watch_may_stay_silent_as_long_as_it_lasts() -> None:
    response = FakeWatchResponse(watch_line("ADDED", small_pod("small-1", ip="10.0.0.8")))
    api, table = FakePodApi(small_pod("small-0"), watches=[response]), InstanceTable()
    watcher = watching(api, table)
    deadline_s = time.monotonic() + 5
    while "small-1" not in table.instances():
        assert time.monotonic() < deadline_s, "the watch's event was not applied"
        time.sleep(0.005)
    assert api.watch_calls[0]["_request_timeout"] == (CONNECT_TIMEOUT_S, ANSWER_TIMEOUT_S)
    assert response.connection.sock.timeout_s == 300.0 + WATCH_READ_MARGIN_S
    assert watcher.stop() and response.connection.sock.shut_down.is_set()


def test_stop_shuts_the_open_watch_down_and_returns_at_once() -> None:
    api, table = FakePodApi(small_pod("small-0")), InstanceTable()
    watcher = watching(api, table)
    time.sleep(0.05)  # the watch is open and silent
    stopping_s = time.monotonic()
    assert watcher.stop()
    assert time.monotonic() - stopping_s < 0.5 and sorted(table.instances()) == ["small-0"]


def test_a_stop_that_comes_while_the_server_answers_still_ends_the_watch() -> None:
    api, table = FakePodApi(small_pod("small-0")), InstanceTable()
    api.answer.clear()
    watcher = watching(api, table)
    stopper = threading.Thread(target=watcher.request_stop)  # before the watcher has the response in hand
    stopper.start()
    stopper.join()
    api.answer.set()
    assert watcher.join(2), "the watch answered after stop() was read until it ended"


def test_stopping_does_not_wait_for_watches_the_server_has_not_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    late = [FakeWatchResponse(watch_line("ADDED", make_pod(f"{pool.name}-late", labels=dict(pool.selector))))
            for pool in (SMALL, LARGE)]
    api = FakePodApi(small_pod("small-0"), watches=late)
    monkeypatch.setattr(kubernetes_discovery.client, "CoreV1Api", lambda api_client: api)
    api.answer.clear()  # every watch request is accepted, and not answered
    with client.ApiClient() as api_client:
        discovery = KubernetesDiscovery((SMALL, LARGE), "bear", api_client, backoff_base_s=0.01, backoff_cap_s=0.05)
        discovery.start()
        assert discovery.wait_until_synced(5)
        deadline_s = time.monotonic() + 5
        while len(api.watch_calls) < 2:
            assert time.monotonic() < deadline_s, "both pools should be watching"
            time.sleep(0.005)
        watchers = [t for t in threading.enumerate() if t.name.startswith("bear-discovery-")]
        before = dict(discovery.instances())

        stopping_s = time.monotonic()
        discovery.stop()
        assert time.monotonic() - stopping_s < 2.5, "stop() waits STOP_WAIT_S at most in all, not 5 s per pool"

        api.answer.set()  # the server answers at last: the stopped watchers apply nothing and end
        for thread in watchers:
            thread.join(2)
            assert not thread.is_alive()
        assert discovery.instances() == before and set(before) == {"small-0"}
