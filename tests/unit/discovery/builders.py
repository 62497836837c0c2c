"""Pods as the Kubernetes client gives them (V1Pod), in one line each."""

from __future__ import annotations

import datetime

from kubernetes import client


def make_pod(name: str = "pod-0", *, phase: str = "Running", ready: bool = True, ip: str | None = "10.0.0.7",
             terminating: bool = False, labels: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name, labels=labels or {}, resource_version="1",
            deletion_timestamp=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) if terminating else None),
        spec=client.V1PodSpec(containers=[client.V1Container(name="vllm", image="vllm")]),
        status=client.V1PodStatus(phase=phase, pod_ip=ip, conditions=[
            client.V1PodCondition(type="Ready", status="True" if ready else "False")]),
    )
