"""Static discovery (the local default) and the factory's choice of source."""

from __future__ import annotations

from pathlib import Path

from bear.discovery.config import DiscoveryConfig
from bear.discovery.factory import open_discovery
from bear.discovery.instances import Change, Instance
from bear.discovery.kubernetes_discovery import KubernetesDiscovery
from bear.discovery.pools import PoolSpec, StaticInstance
from bear.discovery.static import StaticDiscovery

POOLS = (
    PoolSpec("small", "Qwen3-0.6B", 0.044, 0.173, {}, instances=(
        StaticInstance("small-0", "http://127.0.0.1:8000", "127.0.0.1:50071"),
        StaticInstance("small-1", "http://127.0.0.1:8001", "127.0.0.1:50072"))),
    PoolSpec("large", "Qwen3-32B", 0.287, 0.640, {}, instances=(
        StaticInstance("large-0", "http://127.0.0.1:8002", ""),)),
)


def test_static_instances_are_all_ready_once_started() -> None:
    discovery, changes = StaticDiscovery(POOLS), []
    discovery.add_listener(changes.append)
    assert not discovery.wait_until_synced(0) and not discovery.instances()
    discovery.start()
    assert discovery.wait_until_synced(0)
    assert discovery.instances()["small-1"] == Instance("small-1", "small", "Qwen3-0.6B", "http://127.0.0.1:8001",
                                                        "127.0.0.1:50072")
    assert sorted(discovery.instances()) == ["large-0", "small-0", "small-1"]
    assert [len(change.added) for change in changes] == [2, 1] and all(isinstance(c, Change) for c in changes)
    discovery.stop()


def test_the_factory_reads_the_pools_file_and_picks_the_source(tmp_path: Path) -> None:
    pools_file = tmp_path / "pools.yaml"
    pools_file.write_text("pools:\n  - {name: small, model: m, selector: {bear.dev/pool: small}}\n")
    static = open_discovery(DiscoveryConfig(pools_file=str(pools_file)))
    assert isinstance(static, StaticDiscovery) and [pool.name for pool in static.pools] == ["small"]
    cluster = open_discovery(DiscoveryConfig(mode="kubernetes", pools_file=str(pools_file)))
    assert isinstance(cluster, KubernetesDiscovery) and cluster.pools == static.pools  # built, not started
    assert open_discovery(DiscoveryConfig()).pools == ()
