"""Builds the configured discovery source: the one place that chooses between static and Kubernetes."""

from __future__ import annotations

from bear.discovery.config import DiscoveryConfig
from bear.discovery.instances import Discovery
from bear.discovery.pools import PoolSpec, load_pools_file
from bear.discovery.static import StaticDiscovery


def open_discovery(config: DiscoveryConfig, pools: tuple[PoolSpec, ...] | None = None) -> Discovery:
    """Not started yet: call `start()` (and `stop()` at shutdown). `pools` defaults to the configured pools file."""
    if pools is None:
        pools = load_pools_file(config.pools_file) if config.pools_file else ()
    if config.mode == "static":
        return StaticDiscovery(pools)
    from bear.discovery.kubernetes_discovery import KubernetesDiscovery  # the client only where it is used

    return KubernetesDiscovery(pools, config.namespace, watch_timeout_s=config.watch_timeout_s,
                               backoff_base_s=config.backoff_base_s, backoff_cap_s=config.backoff_cap_s)
