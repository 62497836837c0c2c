"""When a pod is routed to, and the instance it becomes."""

from __future__ import annotations

import pytest
from kubernetes import client

from bear.discovery.pods import instance_of, is_routable
from bear.discovery.pools import PoolSpec
from tests.unit.discovery.builders import make_pod

POOL = PoolSpec("large", "Qwen3-32B", 0.287, 0.640, {"bear.dev/pool": "large"}, http_port=8000,
                snapshotter_grpc_port=50071)


@pytest.mark.parametrize("pod, routable", [
    (make_pod(), True),
    (make_pod(phase="Pending", ready=False, ip=None), False),
    (make_pod(ready=False), False),  # running, but /health or the snapshotter does not answer yet
    (make_pod(ip=None), False),
    (make_pod(terminating=True), False),  # draining: no new queries
    (make_pod(phase="Succeeded"), False),
    (make_pod(phase="Failed", ready=False), False),
], ids=["ready", "pending", "unready", "no-ip", "terminating", "succeeded", "failed"])
def test_only_running_ready_addressed_live_pods_are_routable(pod: client.V1Pod, routable: bool) -> None:
    assert is_routable(pod) is routable


def test_a_pod_without_status_or_conditions_is_not_routable() -> None:
    bare = make_pod()
    bare.status.conditions = None
    assert not is_routable(bare)
    bare.status = None
    assert not is_routable(bare)


def test_the_instance_is_named_after_the_pod_and_described_by_its_pool() -> None:
    instance = instance_of(make_pod("large-7f9c-x2", ip="10.1.2.3"), POOL)
    assert (instance.instance_id, instance.pool, instance.model) == ("large-7f9c-x2", "large", "Qwen3-32B")
    assert (instance.endpoint, instance.snapshotter_address) == ("http://10.1.2.3:8000", "10.1.2.3:50071")


def test_ipv6_addresses_are_bracketed() -> None:
    instance = instance_of(make_pod(ip="fd00::7"), POOL)
    assert (instance.endpoint, instance.snapshotter_address) == ("http://[fd00::7]:8000", "[fd00::7]:50071")
