"""When a pod is a routable instance, and which instance it is.

A pod is routable when all of these hold:
    not terminating        metadata.deletionTimestamp is unset (a pod being drained gets no new queries)
    Running                status.phase == "Running"
    Ready                  the condition "Ready" is "True": every container's readiness probe passes, i.e. vLLM's
                           /health answers and the snapshotter sidecar serves (its health follows the engine)
    addressed              status.podIP is set
Its instance id is the pod name; its endpoint http://<podIP>:<pool http_port>; its snapshotter <podIP>:<pool
snapshotter_grpc_port>; its pool and model are the pool's (the pools file), whose selector found it.
"""

from __future__ import annotations

from typing import Any

from bear.discovery.instances import Instance
from bear.discovery.pools import PoolSpec


def is_routable(pod: Any) -> bool:
    """`pod` is a kubernetes.client.V1Pod (or anything with the same attributes)."""
    status = pod.status
    if pod.metadata.deletion_timestamp is not None or status is None:
        return False
    if status.phase != "Running" or not status.pod_ip:
        return False
    return any(condition.type == "Ready" and condition.status == "True" for condition in status.conditions or ())


def instance_of(pod: Any, pool: PoolSpec) -> Instance:
    host = _host(pod.status.pod_ip)
    return Instance(
        instance_id=pod.metadata.name,
        pool=pool.name,
        model=pool.model,
        endpoint=f"http://{host}:{pool.http_port}",
        snapshotter_address=f"{host}:{pool.snapshotter_grpc_port}",
    )


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip  # IPv6 addresses go in brackets before a port
