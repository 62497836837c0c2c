"""Kubernetes discovery with the real `kubernetes` client against a local server speaking the pod list/watch protocol
(tests/integration/kube_api_server.py): pods appear, turn ready, turn unready, move, drain and disappear; expired
resource versions (410 Gone) and API errors are survived."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.config import kube_config

from bear.discovery.config import DiscoveryConfig
from bear.discovery.factory import open_discovery
from bear.discovery.instances import Change, Instance
from bear.discovery.kubernetes_discovery import KubernetesDiscovery
from bear.discovery.pools import PoolSpec, StaticInstance
from tests.integration.kube_api_server import FakeKubeApi

SMALL = {"app.kubernetes.io/instance": "bear", "bear.dev/pool": "small"}
LARGE = {"app.kubernetes.io/instance": "bear", "bear.dev/pool": "large"}
POOLS = (PoolSpec("small", "Qwen3-0.6B", 0.044, 0.173, SMALL), PoolSpec("large", "Qwen3-32B", 0.287, 0.640, LARGE))


def eventually(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline_s, "condition not reached in time"
        time.sleep(0.01)


@contextmanager
def discovering(api: FakeKubeApi, pools: tuple[PoolSpec, ...] = POOLS,
                watch_timeout_s: float = 30.0) -> Iterator[tuple[KubernetesDiscovery, list[Change]]]:
    with client.ApiClient(client.Configuration(host=api.url)) as api_client:
        discovery = KubernetesDiscovery(pools, api.namespace, api_client, watch_timeout_s=watch_timeout_s,
                                        backoff_base_s=0.02, backoff_cap_s=0.2)
        changes: list[Change] = []
        discovery.add_listener(changes.append)
        discovery.start()
        try:
            assert discovery.wait_until_synced(5)
            eventually(lambda: api.open_watches == sum(1 for pool in pools if pool.selector))  # every pool watching
            yield discovery, changes
        finally:
            stopping_s = time.monotonic()
            discovery.stop()
            assert time.monotonic() - stopping_s < 1, "stop() must end the open watches at once"
            assert not [t for t in threading.enumerate() if t.name.startswith("bear-discovery-")]


def ready_ids(discovery: KubernetesDiscovery) -> list[str]:
    return sorted(discovery.instances())


def test_pods_appear_turn_ready_turn_unready_and_disappear() -> None:
    with FakeKubeApi() as api:
        api.add_pod("small-a", SMALL, phase="Running", ready=True, ip="10.0.0.1")
        api.add_pod("other", {"app": "unrelated"}, phase="Running", ready=True, ip="10.0.0.99")
        with discovering(api) as (discovery, changes):
            assert discovery.instances() == {
                "small-a": Instance("small-a", "small", "Qwen3-0.6B", "http://10.0.0.1:8000", "10.0.0.1:50071")}

            api.add_pod("large-a", LARGE)  # scheduled, not running: not routable yet
            api.set_pod("large-a", phase="Running", ip="10.0.0.2")  # running, readiness probes not passing yet
            time.sleep(0.2)
            assert ready_ids(discovery) == ["small-a"]

            api.set_pod("large-a", ready=True)
            eventually(lambda: ready_ids(discovery) == ["large-a", "small-a"])
            assert discovery.instances()["large-a"].model == "Qwen3-32B"

            api.set_pod("small-a", ready=False)  # vLLM's /health or the sidecar stopped answering
            eventually(lambda: ready_ids(discovery) == ["large-a"])

            api.set_pod("small-a", ready=True, ip="10.0.0.3")  # back, on a new address
            eventually(lambda: ready_ids(discovery) == ["large-a", "small-a"])
            assert discovery.instances()["small-a"].endpoint == "http://10.0.0.3:8000"

            api.set_pod("large-a", terminating=True)  # draining: no new queries even though still ready
            eventually(lambda: ready_ids(discovery) == ["small-a"])
            api.delete_pod("large-a")
            api.delete_pod("small-a")
            eventually(lambda: ready_ids(discovery) == [])

        assert [([i.instance_id for i in c.added], [i.instance_id for i in c.removed]) for c in changes] == [
            (["small-a"], []), (["large-a"], []), ([], ["small-a"]), (["small-a"], []), ([], ["large-a"]),
            ([], ["small-a"])]
        assert "other" not in {i.instance_id for c in changes for i in c.added}


@pytest.mark.parametrize("gone_as_event", [True, False], ids=["error-event", "http-status"])
def test_an_expired_resource_version_is_recovered_by_listing_again(gone_as_event: bool) -> None:
    with FakeKubeApi(gone_as_event=gone_as_event) as api:
        api.add_pod("small-a", SMALL, phase="Running", ready=True, ip="10.0.0.1")
        api.add_pod("small-b", SMALL, phase="Running", ready=True, ip="10.0.0.2")
        with discovering(api) as (discovery, _):
            assert ready_ids(discovery) == ["small-a", "small-b"] and api.gone == 0
            lists_before = api.lists
            with api.hold_watches():  # the watcher is cut off while the pool changes and the history is compacted
                api.interrupt_watches()
                time.sleep(0.1)
                api.delete_pod("small-a")
                api.set_pod("small-b", ready=False)
                api.add_pod("small-c", SMALL, phase="Running", ready=True, ip="10.0.0.3")
                api.compact()
            eventually(lambda: ready_ids(discovery) == ["small-c"])
            assert api.gone >= 1 and api.lists > lists_before


def test_api_errors_are_retried_with_back_off_until_the_server_answers() -> None:
    with FakeKubeApi() as api:
        api.add_pod("small-a", SMALL, phase="Running", ready=True, ip="10.0.0.1")
        with discovering(api, pools=POOLS[:1]) as (discovery, _):
            api.fail_next(500, count=2)
            api.fail_next(503, count=2)
            api.interrupt_watches()  # the next watch and lists fail four times before one succeeds
            eventually(lambda: api.failures >= 1)
            api.add_pod("small-b", SMALL, phase="Running", ready=True, ip="10.0.0.2")
            eventually(lambda: ready_ids(discovery) == ["small-a", "small-b"])
            assert api.failures == 4
            api.set_pod("small-a", ready=False)  # and the watch works again afterwards
            eventually(lambda: ready_ids(discovery) == ["small-b"])


def test_a_refused_list_is_logged_with_the_namespace_and_the_servers_explanation(
        caplog: pytest.LogCaptureFixture) -> None:
    """(QA: the warning said only "pod watch failed (HTTP 403 Forbidden)", for a list too: the API server's message,
    e.g. which service account may not list pods where, and the namespace were dropped.)"""
    with FakeKubeApi(namespace="serving") as api, caplog.at_level("WARNING", logger="bear.discovery"):
        api.fail_next(403, count=1)
        with discovering(api, pools=POOLS[:1]):
            pass
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1
    assert warnings[0].startswith("pool small: listing pods in namespace serving failed (HTTP 403 Forbidden: ")
    assert "injected failure" in warnings[0]


def test_watches_that_end_at_once_are_retried_with_back_off_not_in_a_tight_loop() -> None:
    with FakeKubeApi() as api:
        api.add_pod("small-a", SMALL, phase="Running", ready=True, ip="10.0.0.1")
        with discovering(api, pools=POOLS[:1], watch_timeout_s=30) as (discovery, _):
            api.watch_cap_s = 0.0  # from now on every watch ends empty as soon as it starts
            api.interrupt_watches()
            before = api.watches
            time.sleep(1.0)
            assert 2 <= api.watches - before <= 40  # back-off 0.02 s doubling to 0.2 s: ~10 tries, not thousands
            assert ready_ids(discovery) == ["small-a"]  # and each retry lists again, so nothing is missed
            api.watch_cap_s = None
            api.set_pod("small-a", ready=False)
            eventually(lambda: ready_ids(discovery) == [])


def test_an_unreachable_api_server_leaves_discovery_empty_and_retrying() -> None:
    with FakeKubeApi() as api:
        url = api.url
    with client.ApiClient(client.Configuration(host=url)) as api_client:  # nothing listens there any more
        discovery = KubernetesDiscovery(POOLS, "bear", api_client, backoff_base_s=0.02, backoff_cap_s=0.05)
        discovery.start()
        assert not discovery.wait_until_synced(0.3) and discovery.instances() == {}
        started_s = time.monotonic()
        discovery.stop()
        assert time.monotonic() - started_s < 2


def test_watches_are_renewed_when_the_server_ends_them() -> None:
    with FakeKubeApi() as api:
        with discovering(api, watch_timeout_s=1) as (discovery, _):
            time.sleep(1.5)  # the first watch ran its full timeoutSeconds and was renewed from its resourceVersion
            api.add_pod("large-a", LARGE, phase="Running", ready=True, ip="10.0.0.5")
            eventually(lambda: ready_ids(discovery) == ["large-a"])
            assert api.watches >= 3 and api.lists == 2 and api.gone == 0  # one list per pool, then only watches


def test_a_pool_without_selector_keeps_its_static_instances_and_listeners_run_on_the_event_loop() -> None:
    external = PoolSpec("external", "Qwen3-8B", 0.072, 0.287, {}, instances=(
        StaticInstance("ext-0", "http://192.0.2.10:8000", "192.0.2.10:50071"),))

    async def scenario(api: FakeKubeApi) -> list[str]:
        loop, heard = asyncio.get_running_loop(), asyncio.Queue[Change]()
        with client.ApiClient(client.Configuration(host=api.url)) as api_client:
            discovery = KubernetesDiscovery((POOLS[0], external), api.namespace, api_client)
            discovery.add_listener(heard.put_nowait, loop=loop)
            await loop.run_in_executor(None, discovery.start)
            try:
                assert (await asyncio.wait_for(heard.get(), 5)).added[0].instance_id == "ext-0"
                api.add_pod("small-a", SMALL, phase="Running", ready=True, ip="10.0.0.1")
                change = await asyncio.wait_for(heard.get(), 5)
                return sorted(change.instances)
            finally:
                await loop.run_in_executor(None, discovery.stop)

    with FakeKubeApi() as api:
        assert asyncio.run(scenario(api)) == ["ext-0", "small-a"]


def test_the_factory_connects_with_the_kubeconfig_outside_a_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pools_file = tmp_path / "pools.yaml"
    pools_file.write_text("pools:\n  - name: small\n    model: Qwen3-0.6B\n    selector:\n"
                          "      app.kubernetes.io/instance: bear\n      bear.dev/pool: small\n")
    with FakeKubeApi(namespace="serving") as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            f"apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: fake\n  cluster:\n"
            f"    server: {api.url}\ncontexts:\n- name: test\n  context:\n    cluster: fake\n    user: test\n"
            f"users:\n- name: test\n  user:\n    token: t0k3n\n")
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        api.add_pod("small-a", SMALL, phase="Running", ready=True, ip="10.0.0.1")
        discovery = open_discovery(DiscoveryConfig(mode="kubernetes", namespace="serving",
                                                   pools_file=str(pools_file)))
        discovery.start()
        try:
            assert discovery.wait_until_synced(5)
            assert sorted(discovery.instances()) == ["small-a"]
        finally:
            discovery.stop()
