"""The Helm chart (helm/bear): rendered by Helm's own engine (helm-python-sdk), linted strictly, every object checked
by kubernetes-validate in strict mode, for the default values and every example; then the essentials asserted on the
rendered objects, and bad values refused by values.schema.json or the templates' own checks.

helm-python-sdk and kubernetes-validate live in `.venv-helm` (`make helm-env`), not in the main environment:
tests/integration/helm_driver.py runs there, with the Python that BEAR_HELM_PYTHON names (`make test` sets it).
Without it these tests are skipped; set but missing, they fail.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bear.discovery.pools import parse_pools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "bear"
EXAMPLES = CHART / "examples"
DRIVER = Path(__file__).with_name("helm_driver.py")
KUBE_VERSIONS = ["1.27.0", "1.35.0"]  # the chart's kubeVersion floor and a current release
RELEASE, NAMESPACE = "prod", "serving"
PLUGIN_CLASSES = {"bear.snapshotter.plugin.AsyncSnapshotScheduler", "bear.snapshotter.plugin.SnapshotScheduler"}
PAPER_POOLS = {  # name → (model, gpus, tensor parallel, input price, output price): the paper's Table 1 set-up
    "small": ("Qwen/Qwen3-0.6B", 1, 1, 0.044, 0.173),
    "medium": ("Qwen/Qwen3-8B", 1, 1, 0.072, 0.287),
    "large": ("Qwen/Qwen3-32B", 2, 2, 0.287, 0.640),
}


DIGEST_A, DIGEST_B = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"


def _pool(**fields: Any) -> dict[str, Any]:
    return {"name": "p", "model": "m", "replicas": 1, "gpusPerReplica": 1, "tensorParallelSize": 1,
            "prices": {"inputPerMTokens": 0.1, "outputPerMTokens": 0.2}, **fields}


def _artifact_on_a_claim(sub_path: str) -> dict[str, Any]:
    return {"predictor": {"artifact": {"source": "persistentVolumeClaim",
                                       "persistentVolumeClaim": {"claimName": "artifacts", "subPath": sub_path}}}}


# name → (values files, values on top)
GOOD_CASES: dict[str, tuple[list[str], dict[str, Any]]] = {
    "default": ([], {}),
    **{f"example-{path.stem}": ([str(path)], {}) for path in sorted(EXAMPLES.glob("*.yaml"))},
    "paper+external-redis-tls": ([str(EXAMPLES / "paper-pools.yaml"), str(EXAMPLES / "external-redis-tls.yaml")], {}),
    "paper+production": ([str(EXAMPLES / "paper-pools.yaml"), str(EXAMPLES / "production.yaml")], {}),
    "everything-off": ([], {"networkPolicy": {"enabled": False}, "rbac": {"create": False},
                            "serviceAccount": {"create": False, "name": "shared"},
                            "metrics": {"scrapeAnnotations": False},
                            "vllm": {"podDisruptionBudget": {"enabled": False}, "preStopSleepSeconds": 0},
                            "redis": {"existingSecret": "bear-redis"}}),
    "replaced-native-blocks": ([], {"vllm": {
        "cacheVolume": {"persistentVolumeClaim": {"claimName": "model-cache"}},
        "readinessProbe": {"tcpSocket": {"port": "http"}},
        "startupProbe": {"exec": {"command": ["curl", "-sf", "localhost:8000/v1/models"]}, "failureThreshold": 360}}}),
    "long-names": ([], {"fullnameOverride": "bear-inference-router-production-us-east-1", "pools": [
        _pool(name="llama-3-1-8b-fp8"), _pool(name="llama-3-1-8b-bf16")]}),
    "62-character-fullname": ([], {"fullnameOverride": "a" * 58 + "-llm"}),
    "names-that-look-like-scalars": ([], {"fullnameOverride": "bear", "pools": [
        _pool(name="8"), _pool(name="32", gpusPerReplica=2, tensorParallelSize=2), _pool(name="on"),
        _pool(name="null")]}),
    "tiny-and-huge-prices": ([], {"pools": [_pool(prices={"inputPerMTokens": 1e-7, "outputPerMTokens": 1e6})]}),
    "model-path-ending-in-a-slash": ([], {"pools": [_pool(model="/cache/models/llama-3/")]}),
    "rediss-url-without-tls-enabled": ([], {"redis": {"enabled": False, "url": "rediss://redis.cache:6380/0",
                                                      "tls": {"enabled": False, "existingSecret": "redis-ca"}}}),
    "client-certificate-with-the-systems-cas": ([], {"redis": {"enabled": False, "url": "rediss://r.cache:6380/0",
                                                               "tls": {"enabled": True, "existingSecret": "client",
                                                                       "caKey": "", "certKey": "tls.crt",
                                                                       "keyKey": "tls.key"}}}),
    "artifact-in-a-configmap": ([], {"predictor": {"artifact": {"source": "configMap"}}}),
    "in-process": ([], {"router": {"inProcess": True}}),
    "in-process-artifact-on-a-claim": ([], {"router": {"inProcess": True, "env": [
        {"name": "BEAR_MAX_SNAPSHOT_AGE_S", "value": "3"}]}, **_artifact_on_a_claim("models/v3")}),
    "names-of-secrets-and-claims-that-look-like-scalars": ([], {
        "redis": {"existingSecret": "on", "existingSecretPasswordKey": "007",
                  "persistence": {"enabled": True, "storageClassName": "1.10"}},
        "predictor": {"artifact": {"source": "persistentVolumeClaim",
                                   "persistentVolumeClaim": {"claimName": "007", "subPath": "1.10"}}}}),
    "engine-callers-and-scrapers": ([], {"networkPolicy": {
        "engineFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}],
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}}),
    "engine-callers-only": ([], {"networkPolicy": {
        "engineFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}]}}),
    "scrape-annotations-overridden": ([], {"vllm": {"podAnnotations": {"prometheus.io/port": "8000"}}}),
    "ipv6-pods": ([str(EXAMPLES / "paper-pools.yaml")], {"podIPFamily": "IPv6"}),
    "images-pinned-by-digest": ([], {"image": {"digest": DIGEST_A}, "vllm": {"image": {"digest": DIGEST_B}},
                                    "redis": {"image": {"digest": DIGEST_A}},
                                    "pools": [_pool(name="same"), _pool(name="own", image={"repository": "r/own"}),
                                              _pool(name="pinned", image={"repository": "r/pin", "digest": DIGEST_A}),
                                              _pool(name="own-tag", image={"tag": "0.2.0-rc1"})]}),
    "pipeline-parallel": ([], {"vllm": {"extraArgs": ["--pipeline-parallel-size", "2"]}, "pools": [
        _pool(name="a", gpusPerReplica=8, tensorParallelSize=4), _pool(name="b", gpusPerReplica=2),
        _pool(name="cpu", gpusPerReplica=0, asyncScheduling=False)]}),
    "pipeline-parallel-short-flag": ([], {"vllm": {"extraArgs": ["-pp=4"]}, "pools": [
        _pool(name="a", gpusPerReplica=8, tensorParallelSize=2)]}),
    # --host: the chart leaves the listen address to the services (QA: refused as "a flag the chart sets")
    "service-extra-args": ([], {"router": {"extraArgs": ["--call-streams=off", "--host", "0.0.0.0"]},
                                "estimator": {"extraArgs": ["--config", "/etc/bear/estimator.yaml"]},
                                "predictor": {"extraArgs": ["--host=0.0.0.0"]}}),
    "extra-env-in-place-of-the-charts": ([], {
        "vllm": {"env": [{"name": "HF_HOME", "value": "/models/hf"}, {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
                 "snapshotter": {"env": [{"name": "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS", "value": "2"}]}},
        "router": {"env": [{"name": "BEAR_DEFAULT_POLICY", "value": "score"}]},
        "otel": {"endpoint": "http://otel-collector:4317", "resourceAttributes": None}}),
    "env-values-that-look-like-numbers": ([], {
        "router": {"env": [{"name": "BEAR_ROUTER_TTFT_FEEDBACK_WINDOW", "value": "64"}]},
        "vllm": {"snapshotter": {"env": [{"name": "BEAR_CALIBRATION_WINDOW", "value": "4000"}]}},
        "predictor": {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]}}),
    # prefixes of --pipeline-parallel-size, read as vLLM's parser reads them; flags the pool's engine leaves to vLLM
    "pipeline-parallel-abbreviated": ([], {"vllm": {"extraArgs": ["--pipeline-parallel", "2", "--max-num-seqs=64",
                                                                  "--enable-prefix-caching"]},
                                           "pools": [_pool(name="a", gpusPerReplica=4, tensorParallelSize=2,
                                                           engine={"maxModelLen": 4096})]}),
    "pipeline-parallel-shortest-abbreviation": ([], {"vllm": {"extraArgs": ["--pi=4"]}, "pools": [
        _pool(name="a", gpusPerReplica=4)]}),
    "redis-url-highest-port-and-a-database-query": ([], {"redis": {"enabled": False,
                                                                   "url": "redis://[fd00::5]:65535?db=2"}}),
    "disruption-budgets-in-percent": ([], {"vllm": {"podDisruptionBudget": {"enabled": True, "maxUnavailable": "100%"}},
                                           "router": {"podDisruptionBudget": {"enabled": True, "maxUnavailable": "0%"}},
                                           "estimator": {"podDisruptionBudget": {"enabled": True,
                                                                                 "maxUnavailable": "50%"}}}),
    "snapshot-settings-through-env": ([], {
        "estimator": {"maxSnapshotAgeSeconds": 1.0, "env": [{"name": "BEAR_MAX_SNAPSHOT_AGE_S", "value": " 3 "}]},
        "vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS", "value": "2e3"},
                                         {"name": "BEAR_SNAPSHOT_REFRESH_S", "value": "1.5"}]}}}),
    "snapshot-region-renamed": ([], {"vllm": {"snapshotter": {"region": "bear-snapshot-2"}}}),
    "batch-budget-equal-to-max-num-seqs": ([], {"pools": [_pool(engine={"maxNumBatchedTokens": 256,
                                                                        "maxNumSeqs": 256})]}),
    "names-that-are-dns-subdomains": ([], {"serviceAccount": {"create": True, "name": "007"},
                                           "predictor": {"artifact": {"source": "configMap",
                                                                      "configMap": {"name": "bear.predictor-v3"}}}}),
    # values.yaml documents null (Helm then drops the key) as meaningful for these: no block, vLLM's default, no probe,
    # the default cache volume, tracing off
    # vLLM's world size is TP x PP x PCP; DCP reuses those ranks (QA: PCP was left out of the GPU count)
    "prefill-context-parallel": ([], {"vllm": {"extraArgs": ["--prefill-context-parallel-size", "2", "-pp=2",
                                                             "-dcp", "2"]},
                                      "pools": [_pool(name="a", gpusPerReplica=8, tensorParallelSize=2)]}),
    "prefill-context-parallel-short-flag": ([], {"vllm": {"extraArgs": ["-pcp=4"]}, "pools": [
        _pool(name="a", gpusPerReplica=4)]}),
    "prefill-context-parallel-abbreviated": ([], {"vllm": {"extraArgs": ["--prefill_c", "2", "-dcp=2"]}, "pools": [
        _pool(name="a", gpusPerReplica=4, tensorParallelSize=2)]}),
    # (QA: Helm reads the values' numbers as floats: 1000000 rendered 1e+06)
    "large-whole-numbers": ([], {
        "vllm": {"terminationGracePeriodSeconds": 1_000_000, "preStopSleepSeconds": 999_999,
                 "shmSizeLimit": 17_179_869_184, "podDisruptionBudget": {"enabled": True, "maxUnavailable": 2_000_000}},
        "router": {"replicas": 1_000_000, "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1_000_000}},
        "estimator": {"autoscaling": {"enabled": True, "minReplicas": 1_000_000, "maxReplicas": 2_000_000}},
        "redis": {"persistence": {"enabled": True, "size": 10_737_418_240}},
        "pools": [_pool(replicas=1_000_000, gpusPerReplica=0, asyncScheduling=False,
                        engine={"maxNumBatchedTokens": 10_000_000, "maxNumSeqs": 1_000_000,
                                "maxModelLen": 10_000_000})]}),
    "snapshot-settings-through-env-at-their-bounds": ([], {
        "estimator": {"env": [{"name": "BEAR_MAX_SNAPSHOT_AGE_S", "value": "3600"}]},
        "vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS", "value": "60000"},
                                         {"name": "BEAR_SNAPSHOT_REFRESH_S", "value": "0.01"},
                                         {"name": "BEAR_SNAPSHOT_TTL_S", "value": "86400"}]}}}),
    # names Kubernetes and the snapshotter take: a '..' inside a name is no parent folder
    "artifact-subpath-and-region-with-dots": ([], {
        **_artifact_on_a_claim("releases/..v3/./.model"),
        "vllm": {"snapshotter": {"region": "..bear" + "-" * 194}}}),
    "network-policy-peers-of-every-kind": ([], {"networkPolicy": {
        "routerFrom": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
        "engineFrom": [{"namespaceSelector": {"matchLabels": {"team": "apps"}}, "podSelector": {}}],
        "metricsFrom": [{"podSelector": {"matchLabels": {"app": "prometheus"}}}]}}),
    # forms BEAR's services accept (bear.common.redis_config): the scheme in capitals, a password with an @, an IPv6
    # zone, a percent-encoded database, a fragment, an empty port
    "redis-url-in-capitals-with-an-ipv6-zone": ([], {"redis": {
        "enabled": False, "url": "REDISS://user:p@ss@[fe80::1%25eth0]:6380?db=%31#primary"}}),
    "redis-url-with-an-empty-port": ([], {"redis": {"enabled": False, "url": "redis://redis.cache:/0"}}),
    "documented-nulls": ([], {"predictor": {"resources": None}, "redis": {"resources": None},
                              "vllm": {"livenessProbe": None, "cacheVolume": None, "snapshotter": {"resources": None}},
                              "otel": {"endpoint": None},
                              "pools": [_pool(engine={"maxNumSeqs": None, "blockSize": None, "maxModelLen": None})]}),
    # (QA: Kubernetes expands $(VAR) and turns $$ into $ in env values and args: a Redis password with $$ arrived
    # with one $, a model path with $(X) lost it)
    "dollars-in-user-text": ([], {
        "redis": {"enabled": False, "url": "redis://:pa$$w0rd@host:6379/0"},
        "otel": {"endpoint": "http://collector:4318/tenant$(T)", "protocol": "http/protobuf",
                 "resourceAttributes": "team=a$$b,cost=$(C)"},
        "pools": [_pool(model="org/m$(X)"), _pool(name="q", model="org/q", servedModelName="q$$1")],
        "vllm": {"extraArgs": ["--chat-template=/t/$(T).jinja"], "env": [{"name": "TOKEN_FILE", "value": "$(HOME)/t"}]},
        "estimator": {"extraArgs": ["--config", "/etc/bear/$$.yaml"]},
        "predictor": {"artifact": {"image": {"path": "/opt/$(P)"}}}}),
    # (QA: one pool's pipeline parallelism went to every pool through vllm.extraArgs; a CPU pool took the
    # asynchronous plugin)
    "per-pool-vllm-settings": ([], {
        "vllm": {"extraArgs": ["--enable-prefix-caching"],
                 "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "INFO"},
                         {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]},
        "pools": [_pool(name="big", model="meta-llama/Llama-3.1-405B-Instruct-FP8", gpusPerReplica=16,
                        tensorParallelSize=8, extraArgs=["--pipeline-parallel-size", "2", "--kv-cache-dtype=fp8"],
                        env=[{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
                             {"name": "NCCL_DEBUG", "value": "WARN"}]),
                  _pool(name="small", model="Qwen/Qwen3-8B", asyncScheduling=False, extraArgs=[], env=[]),
                  _pool(name="cpu", model="Qwen/Qwen3-0.6B", gpusPerReplica=0, asyncScheduling=False,
                        image={"repository": "ghcr.io/bear-router/vllm-bear-cpu"},
                        engine={"blockSize": None, "gpuMemoryUtilization": None})]}),
    "pool-asynchronous-over-a-synchronous-chart": ([], {"vllm": {"asyncScheduling": False}, "pools": [
        _pool(name="gpu", asyncScheduling=True), _pool(name="inherits", asyncScheduling=None),
        _pool(name="cpu", gpusPerReplica=0)]}),
    # the same last path component, told apart by servedModelName; the same model in two pools is one model
    "served-model-names-told-apart": ([], {"pools": [
        _pool(name="a", model="org-one/llama-3-8b", servedModelName="llama-3-8b-one"),
        _pool(name="b", model="org-two/llama-3-8b"), _pool(name="c", model="org-two/llama-3-8b/")]}),
    "estimator-scaled-to-zero": ([], {"estimator": {"replicas": 0}}),
    "estimator-autoscaled-past-the-stream-cap": ([], {"estimator": {"replicas": 3, "autoscaling": {
        "enabled": True, "minReplicas": 3, "maxReplicas": 40}}}),
}
# name → (release, namespace) where a case needs its own (others use RELEASE and NAMESPACE)
RELEASE_AND_NAMESPACE = {"names-that-look-like-scalars": ("123", "2024"),
                         "release-name-starting-with-a-digit": ("123", NAMESPACE),
                         "release-name-with-a-dot": ("bear.prod", NAMESPACE)}
# name → (values, what the error must say); refused by values.schema.json
SCHEMA_REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "unknown-pool-key": ({"pools": [_pool(gpus=2)]}, "additional properties 'gpus'"),
    "misspelt-top-level-key": ({"pool": []}, "additional properties 'pool'"),
    "pool-without-prices": ({"pools": [{k: v for k, v in _pool().items() if k != "prices"}]}, "prices"),
    "negative-gpus": ({"pools": [_pool(gpusPerReplica=-1)]}, "gpusPerReplica"),
    # over a million USD per million tokens: a typo (BEAR's services refuse it too)
    "price-over-the-bound": ({"pools": [_pool(prices={"inputPerMTokens": 0.1, "outputPerMTokens": 1.5e6})]},
                             "outputPerMTokens"),
    "gpu-memory-over-1": ({"pools": [_pool(engine={"gpuMemoryUtilization": 1.5})]}, "gpuMemoryUtilization"),
    "fractional-batch-budget": ({"pools": [_pool(engine={"maxNumBatchedTokens": 10.5})]}, "maxNumBatchedTokens"),
    "pool-name-not-a-dns-label": ({"pools": [_pool(name="Large_Pool")]}, "name"),
    "no-pools": ({"pools": []}, "pools"),
    "unknown-policy": ({"router": {"defaultPolicy": "fastest"}}, "defaultPolicy"),
    "external-redis-without-url": ({"redis": {"enabled": False}}, "url"),
    "redis-url-scheme": ({"redis": {"enabled": False, "url": "http://redis:6379"}}, "url"),
    "tls-on-bundled-redis": ({"redis": {"tls": {"enabled": True}}}, "tls"),
    "client-cert-without-key": ({"redis": {"enabled": False, "url": "rediss://r:6380", "tls": {
        "enabled": True, "certKey": "tls.crt"}}}, "keyKey"),
    "artifact-source": ({"predictor": {"artifact": {"source": "s3"}}}, "source"),
    "pvc-artifact-without-claim": ({"predictor": {"artifact": {"source": "persistentVolumeClaim"}}}, "claimName"),
    "otel-protocol": ({"otel": {"protocol": "http/json"}}, "protocol"),
    "pod-ip-family-misspelt": ({"podIPFamily": "ipv6"}, "podIPFamily"),
    "otel-endpoint-without-a-scheme": ({"otel": {"endpoint": "otel-collector.observability:4317"}}, "endpoint"),
    "number-as-image-tag": ({"image": {"tag": 20240101}}, "'/image/tag': got number, want string"),
    "number-as-pool-image-tag": ({"pools": [_pool(image={"tag": 1.10})]}, "'/pools/0/image/tag': got number"),
    "fullname-override-over-63-characters": ({"fullnameOverride": "a" * 64}, "fullnameOverride"),
    "shm-size-not-a-quantity": ({"vllm": {"shmSizeLimit": "16 GB"}}, "shmSizeLimit"),
    # (QA: rendered as it was; the API server refuses the claim at install)
    "redis-claim-size-not-a-quantity": ({"redis": {"persistence": {"enabled": True, "size": "10GB"}}}, "size"),
    "sampler-ratio-not-a-number": ({"otel": {"samplerArg": "abc"}}, "samplerArg"),
    "sampler-ratio-above-1": ({"otel": {"samplerArg": 2}}, "samplerArg"),
    "digest-in-the-repository": ({"image": {"repository": f"ghcr.io/acme/bear@{DIGEST_A}"}}, "/image/repository"),
    # (QA: REGISTRY/bear:0.1.0 rendered REGISTRY/bear:0.1.0:0.1.0, an image no kubelet pulls)
    "tag-in-the-repository": ({"image": {"repository": "registry.example.com/bear:0.1.0"}}, "/image/repository"),
    "tag-in-the-vllm-repository": ({"vllm": {"image": {"repository": "registry.example.com:5000/vllm-bear:0.1"}}},
                                   "/vllm/image/repository"),
    "digest-in-the-tag": ({"image": {"tag": f"0.1.0@{DIGEST_A}"}}, "/image/tag"),
    "digest-not-sha256": ({"vllm": {"image": {"digest": "latest"}}}, "/vllm/image/digest"),
    "redis-url-without-a-host": ({"redis": {"enabled": False, "url": "redis://"}}, "/redis/url"),
    "redis-url-port-not-a-number": ({"redis": {"enabled": False, "url": "redis://redis:notaport/0"}}, "/redis/url"),
    "redis-url-database-not-a-number": ({"redis": {"enabled": False, "url": "redis://redis:6379/cache"}},
                                        "/redis/url"),
    "redis-timeout-over-an-hour": ({"redis": {"timeoutSeconds": 7200}}, "/redis/timeoutSeconds"),
    "snapshotter-poll-over-a-minute": ({"vllm": {"snapshotter": {"pollIntervalMs": 120000}}},
                                       "/vllm/snapshotter/pollIntervalMs"),
    "snapshot-age-over-an-hour": ({"estimator": {"maxSnapshotAgeSeconds": 7200}}, "/estimator/maxSnapshotAgeSeconds"),
    "redis-on-a-unix-socket": ({"redis": {"enabled": False, "url": "unix:///run/redis.sock"}}, "/redis/url"),
    "model-with-a-trailing-space": ({"pools": [_pool(model="meta-llama/Llama-3.1-8B-Instruct ")]}, "/pools/0/model"),
    "served-name-with-a-leading-space": ({"pools": [_pool(servedModelName=" llama")]}, "/pools/0/servedModelName"),
    # Kubernetes refuses an EnvVar whose value is a number
    "env-value-a-number": ({"router": {"env": [{"name": "BEAR_ROUTER_TTFT_FEEDBACK_WINDOW", "value": 64}]}},
                           "'/router/env/0/value': got number, want string"),
    "sidecar-env-value-a-number": ({"vllm": {"snapshotter": {"env": [{"name": "BEAR_CALIBRATION_WINDOW",
                                                                      "value": 4000}]}}},
                                   "'/vllm/snapshotter/env/0/value': got number, want string"),
    "env-entry-with-a-misspelt-key": ({"estimator": {"env": [{"name": "A", "vaule": "1"}]}},
                                      "additional properties 'vaule'"),
    "env-without-a-name": ({"vllm": {"env": [{"value": "1"}]}}, "'/vllm/env/0': missing property 'name'"),
    "env-with-an-empty-name": ({"predictor": {"env": [{"name": "", "value": "1"}]}}, "/predictor/env/0/name"),
    "redis-url-port-over-65535": ({"redis": {"enabled": False, "url": "redis://redis.cache:99999/0"}}, "/redis/url"),
    "redis-url-port-0": ({"redis": {"enabled": False, "url": "redis://redis.cache:0/0"}}, "/redis/url"),
    "redis-url-database-query-not-a-number": ({"redis": {"enabled": False, "url": "redis://redis.cache:6379?db=x"}},
                                              "/redis/url"),
    "disruption-budget-over-100-percent": ({"vllm": {"podDisruptionBudget": {"enabled": True,
                                                                             "maxUnavailable": "150%"}}},
                                           "/vllm/podDisruptionBudget/maxUnavailable"),
    "predictor-disruption-budget-over-100-percent": ({"predictor": {"podDisruptionBudget": {
        "enabled": True, "maxUnavailable": "101%"}}}, "/predictor/podDisruptionBudget/maxUnavailable"),
    "artifact-configmap-name-not-a-dns-name": ({"predictor": {"artifact": {"source": "configMap",
                                                                           "configMap": {"name": "My_CM"}}}},
                                               "/predictor/artifact/configMap/name"),
    "service-account-name-not-a-dns-name": ({"serviceAccount": {"create": True, "name": "My_SA"}},
                                            "/serviceAccount/name"),
    # null drops a key (Helm's coalescing): one the chart needs is required, so the schema names it
    "metrics-port-null": ({"metrics": {"port": None}}, "'/metrics': missing property 'port'"),
    "otel-null": ({"otel": None}, "missing property 'otel'"),
    "router-service-null": ({"router": {"service": None}}, "'/router': missing property 'service'"),
    "otel-protocol-null": ({"otel": {"endpoint": "http://c:4317", "protocol": None}},
                           "'/otel': missing property 'protocol'"),
    "disruption-budget-max-unavailable-null": ({"vllm": {"podDisruptionBudget": {"enabled": True,
                                                                                  "maxUnavailable": None}}},
                                               "'/vllm/podDisruptionBudget': missing property 'maxUnavailable'"),
    # (QA: Kubernetes refuses these subPaths; the chart rendered them)
    "artifact-subpath-absolute": (_artifact_on_a_claim("/predictor/v3"),
                                  "'/predictor/artifact/persistentVolumeClaim/subPath': '/predictor/v3' does not"),
    "artifact-subpath-climbing-out": (_artifact_on_a_claim("predictor/../../etc"),
                                      "/predictor/artifact/persistentVolumeClaim/subPath"),
    "artifact-subpath-parent": (_artifact_on_a_claim(".."), "/predictor/artifact/persistentVolumeClaim/subPath"),
    # (QA: ".." became /dev/shm/..)
    "snapshot-region-parent": ({"vllm": {"snapshotter": {"region": ".."}}}, "'/vllm/snapshotter/region': '..' does"),
    "snapshot-region-dot": ({"vllm": {"snapshotter": {"region": "."}}}, "'/vllm/snapshotter/region': '.' does"),
    "snapshot-region-over-200-characters": ({"vllm": {"snapshotter": {"region": "a" * 201}}},
                                            "/vllm/snapshotter/region"),
    # (QA: each rendered a NetworkPolicy the API server refuses)
    "network-peer-misspelt-key": ({"networkPolicy": {"routerFrom": [{"namespaceSelecter": {"matchLabels": {
        "team": "apps"}}}]}}, "additional properties 'namespaceSelecter' not allowed"),
    "network-peer-a-whole-rule": ({"networkPolicy": {"metricsFrom": [{"from": [{"namespaceSelector": {}}]}]}},
                                  "additional properties 'from' not allowed"),
    "network-peer-a-string": ({"networkPolicy": {"engineFrom": ["10.0.0.0/8"]}},
                              "'/networkPolicy/engineFrom/0': got string, want object"),
    "network-peer-empty": ({"networkPolicy": {"engineFrom": [{}]}},
                           "'/networkPolicy/engineFrom/0': missing property 'ipBlock'"),
    "network-peer-ip-block-without-cidr": ({"networkPolicy": {"routerFrom": [{"ipBlock": {"except": ["10.1/16"]}}]}},
                                           "'/networkPolicy/routerFrom/0/ipBlock': missing property 'cidr'"),
    "network-peer-ip-block-with-a-selector": ({"networkPolicy": {"routerFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"},
                                                                                "podSelector": {}}]}},
                                              "'/networkPolicy/routerFrom/0': 'not' failed"),
    "redis-url-percent-encoded-database-not-a-number": ({"redis": {"enabled": False, "url": "redis://r?db=%41"}},
                                                        "/redis/url"),
    "autoscaling-min-replicas-null": ({"estimator": {"autoscaling": {"enabled": True, "minReplicas": None}}},
                                      "'/estimator/autoscaling': missing property 'minReplicas'"),
    "pool-async-scheduling-a-string": ({"pools": [_pool(asyncScheduling="yes")]}, "/pools/0/asyncScheduling"),
    "pool-extra-args-a-number": ({"pools": [_pool(extraArgs=["--max-loras", 4])]}, "/pools/0/extraArgs/1"),
    "pool-env-value-a-number": ({"pools": [_pool(env=[{"name": "OMP_NUM_THREADS", "value": 8}])]},
                                "'/pools/0/env/0/value': got number, want string"),
}
# How Helm's render reports a schema refusal. The driver's check before it validates the values merged with the
# chart's defaults, where a key set to null is present again; the render's check sees it dropped.
SCHEMA_REFUSED_AT_RENDER = "values don't meet the specifications of the schema(s)"
# name → (values, what the error must say); refused by the templates' own checks
TEMPLATE_REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "in-process-with-estimator-env": ({"router": {"inProcess": True}, "estimator": {"env": [
        {"name": "BEAR_LPS_WINDOW_S", "value": "30"}]}}, "estimator.env: with router.inProcess the estimator runs "
                                                         "inside the router pods, which would not read it"),
    "in-process-with-predictor-args": ({"router": {"inProcess": True}, "predictor": {"extraArgs": ["--host=::"]}},
                                       "predictor.extraArgs: with router.inProcess"),
    "in-process-flag-in-router-args": ({"router": {"extraArgs": ["--in-process=predictor"]}},
                                       "router.extraArgs: --in-process=predictor is a flag the chart sets"),
    "in-process-snapshot-age-in-router-env": ({"router": {"inProcess": True, "env": [
        {"name": "BEAR_MAX_SNAPSHOT_AGE_S", "value": "0"}]}}, "BEAR_MAX_SNAPSHOT_AGE_S in router.env (0) must be > 0"),
    "tensor-parallel-over-gpus": ({"pools": [_pool(gpusPerReplica=2, tensorParallelSize=4)]},
                                  "tensorParallelSize (4) exceeds gpusPerReplica (2)"),
    "duplicate-pool-names": ({"pools": [_pool(name="a"), _pool(name="a")]}, 'the name "a" is used twice'),
    "tensor-parallel-not-dividing-gpus": ({"pools": [_pool(gpusPerReplica=4, tensorParallelSize=3)]},
                                          "tensorParallelSize (3) does not divide gpusPerReplica (4)"),
    "autoscaling-min-over-max": ({"router": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}},
                                 "router.autoscaling: minReplicas (5) exceeds maxReplicas (2)"),
    "metrics-port-on-a-grpc-port": ({"metrics": {"port": 50052}},
                                    "estimator.grpcPort and metrics.port are both 50052"),
    "vllm-port-on-the-sidecar-grpc-port": ({"vllm": {"port": 50071}},
                                           "vllm.port and vllm.snapshotter.grpcPort are both 50071"),
    "sidecar-metrics-port-on-the-vllm-port": ({"metrics": {"snapshotterPort": 8000}},
                                              "metrics.snapshotterPort and vllm.port are both 8000"),
    "model-path-without-a-name": ({"pools": [_pool(model="/")]}, "pools[p]: set servedModelName"),
    "client-cert-without-tls-secret": ({"redis": {"enabled": False, "url": "rediss://r:6380", "tls": {
        "enabled": True, "certKey": "tls.crt", "keyKey": "tls.key"}}}, "keys of redis.tls.existingSecret"),
    "client-key-without-cert": ({"redis": {"enabled": False, "url": "rediss://r:6380", "tls": {
        "enabled": True, "existingSecret": "s", "keyKey": "tls.key"}}}, "redis.tls.certKey and redis.tls.keyKey go"),
    "release-name-starting-with-a-digit": ({}, "Service names must start with a letter: set fullnameOverride"),
    "release-name-with-a-dot": ({}, "Service names take only lower-case letters, digits and '-'"),
    "tls-secret-for-a-plain-redis-url": ({"redis": {"enabled": False, "url": "redis://redis.data:6380/0", "tls": {
        "enabled": False, "existingSecret": "redis-ca"}}}, "BEAR talks plain TCP to redis://redis.data:6380/0"),
    "role-bound-to-the-default-account": ({"serviceAccount": {"create": False}},
                                          "with serviceAccount.create=false, set serviceAccount.name"),
    # (QA: the name written out passed the check above; created, it clashed with the namespace's own account)
    "role-bound-to-the-default-account-by-name": ({"serviceAccount": {"create": False, "name": "default"}},
                                                  "rbac.create would let the namespace's default service account"),
    "the-default-account-created": ({"serviceAccount": {"create": True, "name": "default"}},
                                    "serviceAccount.name: default names the namespace's own service account"),
    # (QA: ignored without a word with the bundled Redis)
    "tls-secret-with-the-bundled-redis": ({"redis": {"tls": {"existingSecret": "bear-redis-tls"}}},
                                          "redis.tls applies to an external Redis"),
    "extra-args-served-model-name": ({"vllm": {"extraArgs": ["--served-model-name", "foo"]}},
                                     "vllm.extraArgs: --served-model-name is a flag the chart sets for pools["),
    "extra-args-port": ({"vllm": {"extraArgs": ["--port=9000"]}}, "vllm.extraArgs: --port=9000 is a flag"),
    "extra-args-engine-setting": ({"pools": [_pool(engine={"maxNumSeqs": 64})],
                                   "vllm": {"extraArgs": ["--max_num_seqs", "128"]}},
                                  "vllm.extraArgs: --max_num_seqs is a flag the chart sets for pools[p]"),
    # (QA: vLLM 0.32's other name for --gpu-memory-utilization got past: the engine ran at 0.5, the values said 0.9)
    "extra-args-gpu-memory-alias": ({"pools": [_pool(engine={"gpuMemoryUtilization": 0.9})],
                                     "vllm": {"extraArgs": ["--device-memory-utilization", "0.5"]}},
                                    "vllm.extraArgs: --device-memory-utilization is a flag the chart sets for pools[p]"),
    "gpus-left-idle": ({"pools": [_pool(gpusPerReplica=8, tensorParallelSize=4)]},
                       "pools[p]: gpusPerReplica (8) is not tensorParallelSize (4) x the pipeline-parallel size (1) x "
                       "the prefill-context-parallel size (1) of vllm.extraArgs: vLLM would use 4 GPUs of each pod and "
                       "leave the others idle"),
    "gpus-short-of-the-pipeline": ({"vllm": {"extraArgs": ["--pipeline_parallel_size=2"]}, "pools": [_pool()]},
                                   "gpusPerReplica (1) is not tensorParallelSize (1) x the pipeline-parallel size (2) "
                                   "x the prefill-context-parallel size (1) of vllm.extraArgs: vLLM would need 2 GPUs, "
                                   "more than each pod has, and fail to start"),
    "extra-args-flag-and-value-in-one-item": ({"vllm": {"extraArgs": ["--max-num-seqs 32"]}},
                                              'vllm.extraArgs: "--max-num-seqs 32" is a flag and its value in one'),
    "router-extra-args-port": ({"router": {"extraArgs": ["--grpc-port=9000"]}},
                               "router.extraArgs: --grpc-port=9000 is a flag the chart sets for the router"),
    "estimator-extra-args-redis": ({"estimator": {"extraArgs": ["--redis-url", "redis://other:6379"]}},
                                   "estimator.extraArgs: --redis-url is a flag the chart sets for the estimator"),
    "predictor-extra-args-model-dir": ({"predictor": {"extraArgs": ["--model_dir=/tmp/m"]}},
                                       "predictor.extraArgs: --model_dir=/tmp/m is a flag the chart sets"),
    "service-extra-args-flag-and-value-in-one-item": ({"router": {"extraArgs": ["--call-streams off"]}},
                                                      'router.extraArgs: "--call-streams off" is a flag and its'),
    "snapshot-age-within-the-idle-refresh": ({"estimator": {"maxSnapshotAgeSeconds": 0.5}},
                                             "estimator.maxSnapshotAgeSeconds (0.5) must exceed"),
    "snapshot-age-within-a-longer-idle-refresh": ({"estimator": {"maxSnapshotAgeSeconds": 1.0}, "vllm": {
        "snapshotter": {"env": [{"name": "BEAR_SNAPSHOT_REFRESH_S", "value": "2"}]}}},
        "idle refresh interval (BEAR_SNAPSHOT_REFRESH_S, 2 s)"),
    "snapshot-age-within-the-read-interval": ({"vllm": {"snapshotter": {"pollIntervalMs": 2000}}},
                                              "read interval (vllm.snapshotter.pollIntervalMs, 2 s)"),
    "bundled-redis-without-a-tag": ({"redis": {"image": {"tag": ""}}}, "redis.image.tag: set a tag"),
    "extra-args-data-parallel": ({"vllm": {"extraArgs": ["--data-parallel-size", "2"]}},
                                 "vllm.extraArgs: --data-parallel-size: BEAR's snapshotter observes data-parallel "
                                 "rank 0 only"),
    "env-given-twice": ({"router": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}},
                        "router.env: A is given twice"),
    "pre-stop-sleep-outlasting-the-grace-period": ({"vllm": {"preStopSleepSeconds": 180}},
                                                   "vllm.preStopSleepSeconds (180) must be shorter than "
                                                   "vllm.terminationGracePeriodSeconds (120)"),
    "autoscaling-without-a-cpu-request": ({"router": {"autoscaling": {"enabled": True},
                                                      "resources": {"requests": {"cpu": None}}}},
                                          "set router.resources.requests.cpu"),
    # vLLM's parser takes any unambiguous prefix of a flag
    "extra-args-abbreviated-tensor-parallel": ({"vllm": {"extraArgs": ["--tensor-parallel", "1"]}},
                                               "vllm.extraArgs: --tensor-parallel (--tensor-parallel-size abbreviated) "
                                               "is a flag the chart sets for pools[default]"),
    "extra-args-abbreviated-engine-setting": ({"pools": [_pool(engine={"maxNumSeqs": 64})],
                                              "vllm": {"extraArgs": ["--max_num_seq=128"]}},
                                             "vllm.extraArgs: --max_num_seq=128 (--max-num-seqs abbreviated) is a"),
    "extra-args-abbreviated-served-model-name": ({"vllm": {"extraArgs": ["--served-model", "x"]}},
                                                 "--served-model (--served-model-name abbreviated) is a flag"),
    "extra-args-abbreviated-no-async-scheduling": ({"vllm": {"extraArgs": ["--no-async-sched"]}},
                                                   "--no-async-sched (--no-async-scheduling abbreviated) is a flag"),
    "extra-args-abbreviated-short-tensor-parallel": ({"vllm": {"extraArgs": ["-t", "2"]}},
                                                     "vllm.extraArgs: -t (-tp abbreviated) is a flag"),
    "extra-args-abbreviated-data-parallel": ({"vllm": {"extraArgs": ["--data-parallel-s=2"]}},
                                             "vllm.extraArgs: --data-parallel-s=2: BEAR's snapshotter observes"),
    "gpus-short-of-an-abbreviated-pipeline": ({"vllm": {"extraArgs": ["--pipeline-parallel=2"]}, "pools": [_pool()]},
                                              "gpusPerReplica (1) is not tensorParallelSize (1) x the "
                                              "pipeline-parallel size (2) x"),
    "poll-interval-in-the-sidecar-env-within-the-snapshot-age": (
        {"vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS", "value": "2000"}]}}},
        "estimator.maxSnapshotAgeSeconds (1) must exceed the snapshotters' read interval "
        "(BEAR_SNAPSHOTTER_POLL_INTERVAL_MS in vllm.snapshotter.env, 2 s)"),
    "snapshot-age-in-the-estimator-env-within-the-idle-refresh": (
        {"estimator": {"maxSnapshotAgeSeconds": 5, "env": [{"name": "BEAR_MAX_SNAPSHOT_AGE_S", "value": "0.4"}]}},
        "BEAR_MAX_SNAPSHOT_AGE_S in estimator.env (0.4) must exceed the snapshotters' idle refresh interval"),
    "refresh-in-the-sidecar-env-not-a-number": (
        {"vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOT_REFRESH_S", "value": "abc"}]}}},
        'vllm.snapshotter.env: BEAR_SNAPSHOT_REFRESH_S must be a number, got "abc"'),
    "snapshot-age-in-the-estimator-env-not-a-number": (
        {"estimator": {"env": [{"name": "BEAR_MAX_SNAPSHOT_AGE_S", "value": "1s"}]}},
        'estimator.env: BEAR_MAX_SNAPSHOT_AGE_S must be a number, got "1s"'),
    "snapshot-region-in-the-vllm-env": ({"vllm": {"env": [{"name": "BEAR_SNAPSHOT_REGION", "value": "other"}]}},
                                        "vllm.env: BEAR_SNAPSHOT_REGION would name the shared-memory region of one "
                                        "container only"),
    "snapshot-region-in-the-sidecar-env": ({"vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOT_REGION",
                                                                               "value": "other"}]}}},
                                           "vllm.snapshotter.env: BEAR_SNAPSHOT_REGION would name the shared-memory "
                                           "region of one container only (vLLM's plugin writes it, the sidecar reads "
                                           "it): set vllm.snapshotter.region instead"),
    "bundled-redis-with-a-url": ({"redis": {"enabled": True, "url": "redis://redis.cache:6379/0"}},
                                 "redis.url is set, but redis.enabled=true deploys the bundled Redis"),
    "gpus-short-of-the-prefill-context-parallel": (
        {"vllm": {"extraArgs": ["-pcp", "2"]}, "pools": [_pool()]},
        "pools[p]: gpusPerReplica (1) is not tensorParallelSize (1) x the pipeline-parallel size (1) x the "
        "prefill-context-parallel size (2)"),
    "gpus-short-of-an-abbreviated-prefill-context-parallel": (
        {"vllm": {"extraArgs": ["-pc", "2", "--pipeline-parallel-size=2"]},
         "pools": [_pool(gpusPerReplica=4, tensorParallelSize=2)]},
        "gpusPerReplica (4) is not tensorParallelSize (2) x the pipeline-parallel size (2) x the "
        "prefill-context-parallel size (2) of vllm.extraArgs: vLLM would need 8 GPUs"),
    # an env value skips the schema's bounds on the same setting (QA: the pods crash-looped at start)
    "poll-interval-in-the-sidecar-env-zero": (
        {"vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS", "value": "0"}]}}},
        "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS in vllm.snapshotter.env (0) must be > 0 and at most 60000"),
    "poll-interval-in-the-sidecar-env-over-a-minute": (
        {"estimator": {"maxSnapshotAgeSeconds": 3600},
         "vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS", "value": "120000"}]}}},
        "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS in vllm.snapshotter.env (120000) must be > 0 and at most 60000"),
    "snapshot-age-in-the-estimator-env-over-an-hour": (
        {"estimator": {"env": [{"name": "BEAR_MAX_SNAPSHOT_AGE_S", "value": "7200"}]}},
        "BEAR_MAX_SNAPSHOT_AGE_S in estimator.env (7200) must be > 0 and at most 3600"),
    # (QA: beyond a float's range, the value was shown as 0)
    "snapshot-age-in-the-estimator-env-beyond-a-float": (
        {"estimator": {"env": [{"name": "BEAR_MAX_SNAPSHOT_AGE_S", "value": "1e400"}]}},
        "BEAR_MAX_SNAPSHOT_AGE_S in estimator.env (1e400) must be > 0 and at most 3600"),
    "poll-interval-in-the-sidecar-env-below-a-float": (
        {"vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS", "value": "-1e400"}]}}},
        "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS in vllm.snapshotter.env (-1e400) must be > 0"),
    "refresh-in-the-sidecar-env-below-its-minimum": (
        {"vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOT_REFRESH_S", "value": "0.001"}]}}},
        "BEAR_SNAPSHOT_REFRESH_S in vllm.snapshotter.env (0.001) must be at least 0.01 (seconds) and below the "
        "snapshot TTL (BEAR_SNAPSHOT_TTL_S, 10 s)"),
    "refresh-in-the-sidecar-env-not-below-the-ttl": (
        {"estimator": {"maxSnapshotAgeSeconds": 5},
         "vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOT_REFRESH_S", "value": "2"},
                                          {"name": "BEAR_SNAPSHOT_TTL_S", "value": "2"}]}}},
        "BEAR_SNAPSHOT_REFRESH_S in vllm.snapshotter.env (2) must be at least 0.01 (seconds) and below the snapshot "
        "TTL (BEAR_SNAPSHOT_TTL_S, 2 s)"),
    "ttl-in-the-sidecar-env-below-a-second": (
        {"vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOT_TTL_S", "value": "0.5"}]}}},
        "BEAR_SNAPSHOT_TTL_S in vllm.snapshotter.env (0.5) must be at least 1 and at most 86400"),
    "batch-budget-below-max-num-seqs": ({"pools": [_pool(engine={"maxNumBatchedTokens": 256, "maxNumSeqs": 1024})]},
                                        "pools[p]: engine.maxNumBatchedTokens (256) is below engine.maxNumSeqs (1024): "
                                        "vLLM refuses to start"),
    # (QA: two models named alike by their last path component: one name for BEAR and the clients)
    "served-model-names-derived-alike": (
        {"pools": [_pool(name="a", model="org-one/llama-3-8b"), _pool(name="b", model="org-two/llama-3-8b")]},
        'pools[a] and pools[b] serve different models (org-one/llama-3-8b, org-two/llama-3-8b) by one name, '
        '"llama-3-8b", derived from a model\'s last path component (servedModelName unset): BEAR and its clients know '
        'a model by its name alone and would take the two for one; set servedModelName'),
    "served-model-name-derived-like-anothers-given-one": (
        {"pools": [_pool(name="a", model="org/llama"), _pool(name="b", model="org/other", servedModelName="llama")]},
        'pools[a] and pools[b] serve different models (org/llama, org/other) by one name, "llama"'),
    # (QA: a port given in env was overridden by the flag the chart passes, the Service and probes kept the chart's)
    "router-grpc-port-in-env": ({"router": {"env": [{"name": "BEAR_ROUTER_GRPC_PORT", "value": "7000"}]}},
                                "router.env: BEAR_ROUTER_GRPC_PORT would be overridden by --grpc-port, which the "
                                "chart passes from router.grpcPort"),
    "estimator-metrics-port-in-env": ({"estimator": {"env": [{"name": "BEAR_ESTIMATOR_METRICS_PORT",
                                                              "value": "9000"}]}},
                                      "estimator.env: BEAR_ESTIMATOR_METRICS_PORT would be overridden by "
                                      "--metrics-port, which the chart passes from metrics.port"),
    "predictor-grpc-port-in-env": ({"predictor": {"env": [{"name": "BEAR_PREDICTOR_GRPC_PORT", "value": "7001"}]}},
                                   "predictor.env: BEAR_PREDICTOR_GRPC_PORT would be overridden"),
    "snapshotter-grpc-port-in-env": ({"vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOTTER_GRPC_PORT",
                                                                        "value": "6000"}]}}},
                                     "vllm.snapshotter.env: BEAR_SNAPSHOTTER_GRPC_PORT would be overridden by "
                                     "--grpc-port, which the chart passes from vllm.snapshotter.grpcPort"),
    "snapshotter-metrics-port-in-env": ({"vllm": {"snapshotter": {"env": [{"name": "BEAR_SNAPSHOTTER_METRICS_PORT",
                                                                           "value": "off"}]}}},
                                        "BEAR_SNAPSHOTTER_METRICS_PORT would be overridden by --metrics-port, which "
                                        "the chart passes from metrics.snapshotterPort"),
    # per pool: its extraArgs after vllm.extraArgs, its env over vllm.env, its asyncScheduling over vllm's
    "pool-extra-args-short-of-gpus": ({"pools": [_pool(extraArgs=["-pp", "2"])]},
                                      "pools[p]: gpusPerReplica (1) is not tensorParallelSize (1) x the "
                                      "pipeline-parallel size (2) x the prefill-context-parallel size (1) of "
                                      "vllm.extraArgs and pools[p].extraArgs: vLLM would need 2 GPUs"),
    "pool-extra-args-undoing-the-pipeline-of-vllm-extra-args": (
        {"vllm": {"extraArgs": ["-pp=2"]}, "pools": [_pool(extraArgs=["-pp=1"]), _pool(name="q")]},
        "pools[q]: gpusPerReplica (1) is not tensorParallelSize (1) x the pipeline-parallel size (2)"),
    # (QA: the pipeline parallelism of one pool, given in vllm.extraArgs, reached the others)
    "pipeline-parallel-of-one-pool-in-vllm-extra-args": (
        {"vllm": {"extraArgs": ["--pipeline-parallel-size", "2"]},
         "pools": [_pool(name="big", gpusPerReplica=16, tensorParallelSize=8), _pool(name="small")]},
        "pools[small]: gpusPerReplica (1) is not tensorParallelSize (1) x the pipeline-parallel size (2) x the "
        "prefill-context-parallel size (1) of vllm.extraArgs: vLLM would need 2 GPUs, more than each pod has, and fail "
        "to start (vllm.extraArgs reaches every pool: a size meant for some pools goes in their own extraArgs)"),
    "pool-extra-args-served-model-name": ({"pools": [_pool(extraArgs=["--served-model-name=x"])]},
                                          "pools[p].extraArgs: --served-model-name=x is a flag the chart sets"),
    "pool-extra-args-async-scheduling": ({"pools": [_pool(extraArgs=["--async-scheduling"])]},
                                         "pools[p].extraArgs: --async-scheduling is a flag the chart sets"),
    "pool-extra-args-data-parallel": ({"pools": [_pool(extraArgs=["-dp", "2"])]},
                                      "pools[p].extraArgs: -dp: BEAR's snapshotter observes data-parallel rank 0"),
    "pool-extra-args-flag-and-value-in-one-item": ({"pools": [_pool(extraArgs=["--max-loras 4"])]},
                                                   'pools[p].extraArgs: "--max-loras 4" is a flag and its value'),
    "pool-env-snapshot-region": ({"pools": [_pool(env=[{"name": "BEAR_SNAPSHOT_REGION", "value": "x"}])]},
                                 "pools[p].env: BEAR_SNAPSHOT_REGION would name the shared-memory region of one "
                                 "container only"),
    "pool-env-given-twice": ({"pools": [_pool(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}])]},
                             "pools[p].env: A is given twice"),
    "cpu-pool-with-async-scheduling": ({"pools": [_pool(gpusPerReplica=0)]},
                                       "pools[p]: gpusPerReplica is 0 and asyncScheduling is on (vllm.asyncScheduling):"
                                       " vLLM's CPU platform turns async scheduling off, while the chart would run "
                                       "BEAR's asynchronous scheduler; set asyncScheduling: false for this pool"),
    "cpu-pool-with-its-own-async-scheduling": ({"vllm": {"asyncScheduling": False},
                                                "pools": [_pool(gpusPerReplica=0, asyncScheduling=True)]},
                                               "gpusPerReplica is 0 and asyncScheduling is on (pools[p]"),
    # (QA: the exporter appends /v1/traces itself: spans went to /v1/traces/v1/traces)
    "otel-http-endpoint-with-the-traces-path": ({"otel": {"endpoint": "http://collector:4318/v1/traces",
                                                          "protocol": "http/protobuf"}},
                                                "otel.endpoint (http://collector:4318/v1/traces) ends in /v1/traces, "
                                                "which the exporter appends itself with protocol http/protobuf"),
    "otel-http-endpoint-with-the-traces-path-and-a-slash": ({"otel": {"endpoint": "https://c.obs/v1/traces/",
                                                                      "protocol": "http/protobuf"}},
                                                            "otel.endpoint (https://c.obs/v1/traces/) ends in "
                                                            "/v1/traces"),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = os.environ.get("BEAR_HELM_PYTHON")
    if not python:
        pytest.skip("BEAR_HELM_PYTHON is not set (make test sets it to .venv-helm's python)")
    if not Path(python).exists():
        pytest.fail(f"BEAR_HELM_PYTHON={python} does not exist: run `make helm-env` (part of `make setup`)")
    cases = [{"name": name, "values_files": files, "values": values} for name, (files, values) in GOOD_CASES.items()]
    cases += [{"name": name, "values": values}
              for name, (values, _) in {**SCHEMA_REFUSALS, **TEMPLATE_REFUSALS}.items()]
    for case in cases:
        case["release"], case["namespace"] = RELEASE_AND_NAMESPACE.get(case["name"], (RELEASE, NAMESPACE))
    request = {"chart": str(CHART), "kube_versions": KUBE_VERSIONS, "cases": cases}
    done = subprocess.run([python, str(DRIVER)], input=json.dumps(request), capture_output=True, text=True,
                          check=False, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["cases"]


# Native Kubernetes blocks in values.yaml: documented as a whole, their own keys are Kubernetes'.
NATIVE_BLOCKS = {"resources", "startupProbe", "readinessProbe", "livenessProbe", "securityContext",
                 "podSecurityContext", "cacheVolume"}


def undocumented_values(text: str) -> list[str]:
    """Keys of values.yaml without a `# --` comment right above them (outside native blocks)."""
    lines, stack, missing = text.splitlines(), [], []
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)(- )?([A-Za-z][\w.-]*):", line)
        if not match:
            continue
        indent, key = len(match.group(1)) + (2 if match.group(2) else 0), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        ancestors = [name for _, name in stack]
        stack.append((indent, key))
        if NATIVE_BLOCKS & set(ancestors):
            continue
        above = number - 1
        while above >= 0 and lines[above].strip().startswith("#") and not lines[above].strip().startswith("# --"):
            above -= 1
        if above < 0 or not lines[above].strip().startswith("# --"):
            missing.append(".".join([*ancestors, key]))
    return missing


def objects(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [document for template, text in sorted(report["manifests"].items()) if template.endswith(".yaml")
            for document in yaml.safe_load_all(text) if document]


def of_kind(report: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects(report) if o["kind"] == kind}


def component(report: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in of_kind(report, kind).values()
               if o["metadata"]["labels"]["app.kubernetes.io/component"] == name]
    assert len(matches) == 1, f"{len(matches)} {kind} for {name}"
    return matches[0]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return found


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def kubernetes_expanded(text: str, defined: dict[str, str]) -> str:
    """An env value or an argument as the kubelet passes it on: $$ is $, $(NAME) the value of a variable defined
    before it (kept as written where none is)."""
    return re.sub(r"\$\$|\$\(([^)]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else defined.get(m.group(1), m.group(0)), text)


POD_FIELDS = {"metadata.name": "pod-0", "metadata.namespace": NAMESPACE, "status.podIP": "10.0.0.7",
              "spec.nodeName": "node-1"}


def kubernetes_env(c: dict[str, Any]) -> dict[str, str]:
    """A container's environment as its process gets it (a pod's fields filled in; Secrets left out)."""
    defined: dict[str, str] = {}
    for entry in c.get("env", []):
        if "value" in entry:
            defined[entry["name"]] = kubernetes_expanded(entry["value"], defined)
        elif "fieldRef" in entry.get("valueFrom", {}):
            defined[entry["name"]] = POD_FIELDS[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return defined


def kubernetes_args(c: dict[str, Any]) -> list[str]:
    return [kubernetes_expanded(a, kubernetes_env(c)) for a in c.get("args", [])]


def engines(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The vLLM Deployments by pool name."""
    return {d["metadata"]["labels"]["bear.dev/pool"]: d for d in of_kind(report, "Deployment").values()
            if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"}


def pools_file(report: dict[str, Any]) -> dict[str, Any]:
    """The pools file as BEAR reads it (bear.discovery.pools), by pool name."""
    config_map = component(report, "ConfigMap", "pools")
    return {pool.name: pool for pool in parse_pools(yaml.safe_load(config_map["data"]["pools.yaml"]))}


def set_fields(block: dict[str, Any]) -> set[str]:
    """The keys of a native block that are set (null is how Helm values unset a key)."""
    return {key for key, value in block.items() if value is not None}


# --- every values file renders, lints strictly and validates --------------------------------------------------------


def test_every_value_is_documented_and_covered_by_the_schema() -> None:
    text = (CHART / "values.yaml").read_text()
    assert undocumented_values(text) == []
    assert undocumented_values("a:\n  # -- b\n  b: 1\n  c: 2\n") == ["a", "a.c"]  # the checker itself
    schema = json.loads((CHART / "values.schema.json").read_text())

    def check(values: Any, node: dict[str, Any], where: str) -> None:
        if isinstance(values, dict) and node.get("additionalProperties") is False:
            assert set(values) <= set(node["properties"]), f"{where}: {set(values) - set(node['properties'])}"
            for key, value in values.items():
                check(value, node["properties"][key], f"{where}.{key}")
        elif isinstance(values, list) and "items" in node:
            for value in values:
                check(value, node["items"], f"{where}[]")

    check(yaml.safe_load(text), schema, "values")
    assert yaml.safe_load(text)["pools"][0].keys() >= {
        "name", "model", "replicas", "gpusPerReplica", "tensorParallelSize", "prices", "engine", "image", "resources",
        "nodeSelector", "tolerations", "affinity"}  # the contract's keys


@pytest.mark.parametrize("case", sorted(GOOD_CASES))
def test_renders_lints_strictly_and_validates_for_kubernetes(reports: dict[str, Any], case: str) -> None:
    report = reports[case]
    assert report["schema_error"] is None and report["render_error"] is None
    assert report["lint"]["errors"] == []
    assert [m for m in report["lint"]["messages"] if m["severity"] >= 2] == []  # strict: no warnings either
    assert report["invalid"] == []
    assert len(objects(report)) >= 10


@pytest.mark.parametrize("case", sorted(GOOD_CASES))
def test_every_volume_has_one_source_and_every_probe_one_handler(reports: dict[str, Any], case: str) -> None:
    handlers = {"httpGet", "tcpSocket", "exec", "grpc"}
    for workload in [*of_kind(reports[case], "Deployment").values(), *of_kind(reports[case], "StatefulSet").values()]:
        pod = workload["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            assert len(set_fields(volume) - {"name"}) == 1, f"{workload['metadata']['name']}: {volume}"
        for c in pod["containers"]:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if c.get(probe) is not None:  # vLLM's probes may be set to null
                    assert len(set_fields(c[probe]) & handlers) == 1, f"{c['name']} {probe}: {c[probe]}"


@pytest.mark.parametrize("case", sorted(GOOD_CASES))
def test_object_names_are_unique_and_within_kubernetes_limits(reports: dict[str, Any], case: str) -> None:
    named = [(o["kind"], o["metadata"]["name"]) for o in objects(reports[case])]
    assert len(named) == len(set(named))
    for kind, name in named:
        assert len(name) <= (52 if kind == "StatefulSet" else 63), name  # 52: the controller-revision-hash label
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?" if kind == "Service" else r"[a-z0-9]([-a-z0-9]*[a-z0-9])?",
                            name), f"{kind}/{name}"


@pytest.mark.parametrize("case", sorted(GOOD_CASES))
def test_every_pools_file_reads_back_and_selects_exactly_its_pools_pods(reports: dict[str, Any], case: str) -> None:
    pools, deployments = pools_file(reports[case]), engines(reports[case])
    assert sorted(pools) == sorted(deployments)
    for name, pool in pools.items():
        assert dict(pool.selector) == deployments[name]["spec"]["selector"]["matchLabels"]
        for other, engine in deployments.items():
            labels = engine["spec"]["template"]["metadata"]["labels"]
            assert (pool.selector.items() <= labels.items()) is (other == name)


@pytest.mark.parametrize("case", sorted(SCHEMA_REFUSALS))
def test_the_schema_refuses_bad_values(reports: dict[str, Any], case: str) -> None:
    report = reports[case]
    error = report["schema_error"]
    if error is None and report["render_error"] and SCHEMA_REFUSED_AT_RENDER in report["render_error"]:
        error = report["render_error"]  # a key set to null: Helm drops it before its own schema check, at render
    assert error is not None and SCHEMA_REFUSALS[case][1] in error


@pytest.mark.parametrize("case", sorted(TEMPLATE_REFUSALS))
def test_the_templates_refuse_what_the_schema_cannot_see(reports: dict[str, Any], case: str) -> None:
    report = reports[case]
    assert report["schema_error"] is None
    assert report["render_error"] is not None and TEMPLATE_REFUSALS[case][1] in report["render_error"]


@pytest.mark.parametrize("case", sorted(GOOD_CASES))
def test_no_container_names_a_variable_twice(reports: dict[str, Any], case: str) -> None:
    """Server-side apply (Helm 4's default) refuses a pod whose env names a variable twice."""
    for workload in objects(reports[case]):
        for c in workload.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            names = [e["name"] for e in c.get("env", [])]
            assert len(names) == len(set(names)), (workload["metadata"]["name"], c["name"], names)


def test_the_operators_env_takes_the_place_of_the_charts(reports: dict[str, Any]) -> None:
    report = reports["extra-env-in-place-of-the-charts"]
    (engine,) = engines(report).values()
    vllm = container(engine, "vllm")
    names = [e["name"] for e in vllm["env"]]
    assert env(vllm)["HF_HOME"] == "/models/hf" and names.index("HF_HOME") < names.index("VLLM_CACHE_ROOT")
    assert names[-1] == "VLLM_LOGGING_LEVEL" and env(vllm)["BEAR_SNAPSHOT_REGION"] == "bear-snapshot"
    sidecar = env(container(engine, "snapshotter"))
    assert sidecar["BEAR_SNAPSHOTTER_POLL_INTERVAL_MS"] == "2" and sidecar["BEAR_POOL"] == "default"
    router = env(container(component(report, "Deployment", "router"), "router"))
    assert router["BEAR_DEFAULT_POLICY"] == "score" and router["HOME"] == "/tmp"
    assert router["OTEL_RESOURCE_ATTRIBUTES"].endswith(",service.version=0.1.0")  # nothing of a null



def test_env_values_that_look_like_numbers_stay_strings(reports: dict[str, Any]) -> None:
    report = reports["env-values-that-look-like-numbers"]
    router = env(container(component(report, "Deployment", "router"), "router"))
    assert router["BEAR_ROUTER_TTFT_FEEDBACK_WINDOW"] == "64"
    (engine,) = engines(report).values()
    assert env(container(engine, "snapshotter"))["BEAR_CALIBRATION_WINDOW"] == "4000"
    predictor = env(container(component(report, "Deployment", "predictor"), "predictor"))
    assert predictor["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}


def test_the_snapshot_settings_given_through_env_are_the_ones_checked_and_rendered(reports: dict[str, Any]) -> None:
    """The estimator's env sets a 3 s age limit over the 2 s read interval of the sidecars' env (1.0 s, the value's,
    would be refused): the check reads what the containers get."""
    report = reports["snapshot-settings-through-env"]
    assert env(container(component(report, "Deployment", "estimator"), "estimator"))["BEAR_MAX_SNAPSHOT_AGE_S"] == " 3 "
    (engine,) = engines(report).values()
    sidecar = env(container(engine, "snapshotter"))
    assert sidecar["BEAR_SNAPSHOTTER_POLL_INTERVAL_MS"] == "2e3" and sidecar["BEAR_SNAPSHOT_REFRESH_S"] == "1.5"


def test_both_containers_of_an_engine_pod_name_the_same_region(reports: dict[str, Any]) -> None:
    (engine,) = engines(reports["snapshot-region-renamed"]).values()
    assert env(container(engine, "vllm"))["BEAR_SNAPSHOT_REGION"] == "bear-snapshot-2"
    assert env(container(engine, "snapshotter"))["BEAR_SNAPSHOT_REGION"] == "bear-snapshot-2"


@pytest.mark.parametrize("url", [
    "redis://r", "redis://r:1", "redis://r:65535/15", "redis://r:06379/0", "rediss://u:p@r:6380/0",
    "redis://[fd00::5]:6379/0", "redis://r:6379?db=2", "redis://r?x=1&db=3", "redis://r?db=", "redis://r/",
    "redis://r:0/0", "redis://r:99999/0", "redis://r:65536", "redis://r:6379?db=x", "redis://r?a=1&db=x",
    "redis://r?db=1&db=x", "redis://r:6379/cache", "redis://", "redis://r:notaport/0", "redis://r?db=1+",
    "redis://r?socket_timeout=5", "redis://r?db=1&x", "redis://r?db&db=2", "redis://r?"])
def test_the_schema_takes_a_redis_url_where_bears_services_do(url: str) -> None:
    """redis.url's pattern against bear.common.redis_config, which every pod runs at start."""
    from bear.common.redis_config import RedisConfig

    pattern = json.loads((CHART / "values.schema.json").read_text())["properties"]["redis"]["properties"]["url"]
    try:
        RedisConfig(url=url)
        accepted = True
    except ValueError:
        accepted = False
    assert bool(re.search(pattern["pattern"], url)) is accepted


def test_names_that_are_dns_subdomains_are_used_as_given(reports: dict[str, Any]) -> None:
    report = reports["names-that-are-dns-subdomains"]
    assert list(of_kind(report, "ServiceAccount")) == ["007"]
    assert component(report, "Deployment", "router")["spec"]["template"]["spec"]["serviceAccountName"] == "007"
    predictor = component(report, "Deployment", "predictor")
    (volume,) = [v for v in predictor["spec"]["template"]["spec"]["volumes"] if v["name"] == "predictor-artifact"]
    assert volume["configMap"]["name"] == "bear.predictor-v3"


# --- the pools --------------------------------------------------------------------------------------------------------


def test_one_vllm_deployment_per_pool_with_its_gpus_parallelism_and_the_plugin(reports: dict[str, Any]) -> None:
    report = reports["example-paper-pools"]
    deployments = engines(report)
    assert sorted(deployments) == sorted(PAPER_POOLS)
    for pool, (model, gpus, tensor_parallel, input_price, output_price) in PAPER_POOLS.items():
        vllm = container(deployments[pool], "vllm")
        assert vllm["command"] == ["vllm", "serve"] and vllm["args"][0] == model
        assert vllm["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert vllm["resources"]["requests"]["nvidia.com/gpu"] == gpus
        args = vllm["args"]
        assert flag(args, "--tensor-parallel-size") == str(tensor_parallel)
        assert flag(args, "--scheduler-cls") == "bear.snapshotter.plugin.AsyncSnapshotScheduler"
        assert "--async-scheduling" in args
        assert flag(args, "--served-model-name") == model.split("/")[-1]
        assert [flag(args, f) for f in ("--max-num-batched-tokens", "--max-num-seqs", "--block-size",
                                        "--gpu-memory-utilization", "--max-model-len")] == [
            "8192", "1024", "16", "0.9", "40960"]
        sidecar = env(container(deployments[pool], "snapshotter"))
        assert (sidecar["BEAR_POOL"], sidecar["BEAR_MODEL"]) == (pool, model.split("/")[-1])
        assert (pools_file(report)[pool].input_usd_per_mtok, pools_file(report)[pool].output_usd_per_mtok) == (
            input_price, output_price)
        # prices live in the pools file only: changing one rolls the router and the estimator, not the GPU pods
        assert not {"BEAR_INPUT_USD_PER_MTOK", "BEAR_OUTPUT_USD_PER_MTOK"} & set(sidecar)
        assert env(vllm)["BEAR_SNAPSHOT_REGION"] == sidecar["BEAR_SNAPSHOT_REGION"]
        assert deployments[pool]["spec"]["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    budgets = [p["metadata"]["labels"] for p in of_kind(report, "PodDisruptionBudget").values()]
    assert sorted(b["bear.dev/pool"] for b in budgets if b["app.kubernetes.io/component"] == "engine") == sorted(
        PAPER_POOLS)


def test_the_plugin_classes_named_by_the_chart_exist() -> None:
    tree = ast.parse((ROOT / "services" / "snapshotter" / "plugin.py").read_text())
    defined = {f"bear.snapshotter.plugin.{node.name}" for node in tree.body if isinstance(node, ast.ClassDef)}
    assert PLUGIN_CLASSES <= defined


def test_a_cpu_pool_gets_no_gpu_the_synchronous_plugin_and_vllms_own_defaults(reports: dict[str, Any]) -> None:
    (engine,) = engines(reports["example-cpu-kind"]).values()
    vllm = container(engine, "vllm")
    assert "nvidia.com/gpu" not in vllm["resources"]["limits"] and "nvidia.com/gpu" not in vllm["resources"]["requests"]
    assert flag(vllm["args"], "--scheduler-cls") == "bear.snapshotter.plugin.SnapshotScheduler"
    assert "--async-scheduling" not in vllm["args"] and "--block-size" not in vllm["args"]
    assert "--gpu-memory-utilization" not in vllm["args"] and flag(vllm["args"], "--served-model-name") == "tiny-qwen3"
    assert engine["spec"]["replicas"] == 2 and vllm["args"][-3:] == ["--enforce-eager", "--dtype", "bfloat16"]


def test_async_scheduling_is_passed_to_vllm_either_way(reports: dict[str, Any]) -> None:
    """vLLM's own default (None) turns async scheduling on with CUDA: the chart always says which the plugin expects."""
    for case, flag_given, plugin in (("example-paper-pools", "--async-scheduling", "AsyncSnapshotScheduler"),
                                     ("example-cpu-kind", "--no-async-scheduling", "SnapshotScheduler")):
        for engine in engines(reports[case]).values():
            args = container(engine, "vllm")["args"]
            assert [a for a in args if a.endswith("async-scheduling")] == [flag_given]
            assert flag(args, "--scheduler-cls") == f"bear.snapshotter.plugin.{plugin}"


def test_a_probe_or_cache_volume_in_the_values_replaces_the_default(reports: dict[str, Any]) -> None:
    def vllm_pod(case: str) -> tuple[dict[str, Any], dict[str, Any]]:
        (engine,) = engines(reports[case]).values()
        volumes = {v["name"]: v for v in engine["spec"]["template"]["spec"]["volumes"]}
        return container(engine, "vllm"), volumes["cache"]

    vllm, cache = vllm_pod("default")
    assert cache == {"name": "cache", "emptyDir": {"sizeLimit": "200Gi"}}
    assert vllm["readinessProbe"] == {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5,
                                      "failureThreshold": 3}
    vllm, cache = vllm_pod("replaced-native-blocks")
    assert cache == {"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}}
    assert vllm["readinessProbe"] == {"tcpSocket": {"port": "http"}, "periodSeconds": 5, "failureThreshold": 3}
    assert vllm["startupProbe"] == {"exec": {"command": ["curl", "-sf", "localhost:8000/v1/models"]},
                                    "periodSeconds": 10, "failureThreshold": 360}
    assert vllm["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}  # not overridden
    for engine in engines(reports["example-paper-pools"]).values():  # the example keeps weights on a claim
        (cache,) = [v for v in engine["spec"]["template"]["spec"]["volumes"] if v["name"] == "cache"]
        assert cache == {"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}}


def test_names_that_yaml_would_read_as_numbers_or_booleans_stay_strings(reports: dict[str, Any]) -> None:
    report = reports["names-that-look-like-scalars"]
    assert sorted(pools_file(report)) == ["32", "8", "null", "on"]
    for o in objects(report):
        assert o["metadata"]["namespace"] == "2024"
        assert o["metadata"]["labels"]["app.kubernetes.io/instance"] == "123"
    for name, engine in engines(report).items():
        assert engine["spec"]["template"]["metadata"]["labels"]["bear.dev/pool"] == name
        assert env(container(engine, "snapshotter"))["BEAR_POOL"] == name


def test_prices_of_any_size_reach_the_pools_file_as_numbers(reports: dict[str, Any]) -> None:
    report = reports["tiny-and-huge-prices"]  # the largest price allowed: Go writes 1e+06
    (pool,) = pools_file(report).values()
    assert (pool.input_usd_per_mtok, pool.output_usd_per_mtok) == (1e-7, 1e6)


def test_a_model_path_ending_in_a_slash_is_named_by_its_last_directory(reports: dict[str, Any]) -> None:
    report = reports["model-path-ending-in-a-slash"]
    assert pools_file(report)["p"].model == "llama-3"
    assert flag(container(engines(report)["p"], "vllm")["args"], "--served-model-name") == "llama-3"


def test_the_sidecar_shares_a_memory_backed_dev_shm_with_vllm(reports: dict[str, Any]) -> None:
    for engine in engines(reports["example-paper-pools"]).values():
        pod = engine["spec"]["template"]["spec"]
        shm = [v["name"] for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        assert len(shm) == 1
        for name in ("vllm", "snapshotter"):
            mounts = {m["mountPath"]: m["name"] for m in container(engine, name)["volumeMounts"]}
            assert mounts["/dev/shm"] == shm[0]
        sidecar = env(container(engine, "snapshotter"))
        assert sidecar["BEAR_INSTANCE_ID"] == "$(POD_NAME)"
        assert sidecar["BEAR_INSTANCE_ENDPOINT"] == "http://$(POD_IP):8000"
        assert sidecar["BEAR_ENGINE_HEALTH_URL"] == "http://localhost:8000/health"  # the pod's own vLLM
        assert sidecar["BEAR_SNAPSHOTTER_ENDPOINT"] == "$(POD_IP):50071"
        assert sidecar["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_a_pool_adds_its_own_extra_args_and_env_to_vllms_and_may_schedule_otherwise(reports: dict[str, Any]) -> None:
    pools = engines(reports["per-pool-vllm-settings"])
    big, small, cpu = (container(pools[name], "vllm") for name in ("big", "small", "cpu"))
    assert big["args"][-4:] == ["--enable-prefix-caching", "--pipeline-parallel-size", "2", "--kv-cache-dtype=fp8"]
    assert big["resources"]["limits"]["nvidia.com/gpu"] == 16  # TP 8 x its own PP 2
    assert small["args"][-1] == cpu["args"][-1] == "--enable-prefix-caching"
    assert "--pipeline-parallel-size" not in small["args"] and small["resources"]["limits"]["nvidia.com/gpu"] == 1
    names = [e["name"] for e in big["env"]]
    assert env(big)["VLLM_LOGGING_LEVEL"] == "DEBUG" and names.count("VLLM_LOGGING_LEVEL") == 1
    assert names.index("VLLM_LOGGING_LEVEL") < names.index("HF_TOKEN") and names[-1] == "NCCL_DEBUG"
    assert env(small)["VLLM_LOGGING_LEVEL"] == "INFO" and "NCCL_DEBUG" not in env(small)
    assert env(cpu)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    for case, expected in (("per-pool-vllm-settings", {"big": True, "small": False, "cpu": False}),
                           ("pool-asynchronous-over-a-synchronous-chart", {"gpu": True, "inherits": False,
                                                                          "cpu": False})):
        for name, asynchronous in expected.items():
            args = container(engines(reports[case])[name], "vllm")["args"]
            assert [a for a in args if a.endswith("async-scheduling")] == [
                "--async-scheduling" if asynchronous else "--no-async-scheduling"], (case, name)
            assert flag(args, "--scheduler-cls") == "bear.snapshotter.plugin." + (
                "AsyncSnapshotScheduler" if asynchronous else "SnapshotScheduler"), (case, name)


def test_pools_with_models_named_alike_serve_them_by_the_names_given(reports: dict[str, Any]) -> None:
    report = reports["served-model-names-told-apart"]
    assert {name: pool.model for name, pool in pools_file(report).items()} == {
        "a": "llama-3-8b-one", "b": "llama-3-8b", "c": "llama-3-8b"}
    for name, engine in engines(report).items():
        assert flag(container(engine, "vllm")["args"], "--served-model-name") == pools_file(report)[name].model


def test_the_pools_file_describes_every_pool(reports: dict[str, Any]) -> None:
    """What each pool serves and costs; that its selector picks exactly its pods is checked for every case above."""
    pools = pools_file(reports["example-paper-pools"])
    assert sorted(pools) == sorted(PAPER_POOLS)
    for name, (model, _, _, input_price, output_price) in PAPER_POOLS.items():
        pool = pools[name]
        assert (pool.model, pool.input_usd_per_mtok, pool.output_usd_per_mtok) == (
            model.split("/")[-1], input_price, output_price)
        assert (pool.http_port, pool.snapshotter_grpc_port) == (8000, 50071)


# --- the services -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "streams"), [("default", "8"), ("paper+production", "48"),
                                               ("estimator-autoscaled-past-the-stream-cap", "64"),
                                               ("large-whole-numbers", "64"), ("estimator-scaled-to-zero", "8"),
                                               ("in-process", None)])
def test_the_router_balances_streams_over_every_estimator_and_predictor_pod(reports: dict[str, Any], case: str,
                                                                            streams: str | None) -> None:
    """The router opens BEAR_ROUTER_UPSTREAM_STREAMS streams to each of the estimator and the predictor (four per pod
    of the larger, as many as either may scale to, in [4, 64]), balanced
    round-robin over the addresses their names resolve to: headless Services, whose DNS names every ready pod (a
    ClusterIP Service's one address would put every stream on whichever pod the first connection reached)."""
    report = reports[case]
    router = env(container(component(report, "Deployment", "router"), "router"))
    assert router.get("BEAR_ROUTER_UPSTREAM_STREAMS") == streams
    services = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s["spec"]
                for s in of_kind(report, "Service").values()}
    assert "clusterIP" not in services["router"]
    for name in ("estimator", "predictor"):
        if streams is None:  # in process: no Service of their own
            assert name not in services
            continue
        spec = services[name]
        assert (spec["type"], spec["clusterIP"]) == ("ClusterIP", "None")
        assert [p["name"] for p in spec["ports"]] == ["grpc", "metrics"]
        assert router[f"BEAR_{name.upper()}_ADDRESS"].startswith(
            component(report, "Service", name)["metadata"]["name"] + ":")


def test_dollars_in_the_users_text_reach_the_containers_as_written(reports: dict[str, Any]) -> None:
    """Kubernetes expands $(VAR) and turns $$ into $ in env values and args: the chart doubles every $ of the text it
    places there, and leaves the operator's own env entries, written in Kubernetes' syntax, as they are."""
    report, given = reports["dollars-in-user-text"], GOOD_CASES["dollars-in-user-text"][1]
    router = container(component(report, "Deployment", "router"), "router")
    assert env(router)["BEAR_REDIS_URL"] == "redis://:pa$$$$w0rd@host:6379/0"
    settings = kubernetes_env(router)
    assert settings["BEAR_REDIS_URL"] == given["redis"]["url"]
    assert settings["OTEL_EXPORTER_OTLP_ENDPOINT"] == given["otel"]["endpoint"]
    assert settings["OTEL_RESOURCE_ATTRIBUTES"] == (f"k8s.namespace.name={NAMESPACE},k8s.pod.name=pod-0,"
                                                    "k8s.node.name=node-1,service.version=0.1.0,team=a$$b,cost=$(C)")
    estimator = container(component(report, "Deployment", "estimator"), "estimator")
    assert kubernetes_args(estimator)[-2:] == ["--config", "/etc/bear/$$.yaml"]
    predictor = container(component(report, "Deployment", "predictor"), "predictor")
    assert kubernetes_env(predictor)["BEAR_PREDICTOR_MODEL_DIR"] == "/opt/$(P)"
    pools = engines(report)
    vllm = container(pools["p"], "vllm")
    args = kubernetes_args(vllm)
    assert args[0] == "org/m$(X)" and flag(args, "--served-model-name") == "m$(X)" == pools_file(report)["p"].model
    assert args[-1] == "--chat-template=/t/$(T).jinja"
    assert env(vllm)["TOKEN_FILE"] == "$(HOME)/t" and kubernetes_env(vllm)["TOKEN_FILE"] == "/tmp/t"  # the operator's
    assert kubernetes_env(container(pools["p"], "snapshotter"))["BEAR_MODEL"] == "m$(X)"
    assert flag(kubernetes_args(container(pools["q"], "vllm")), "--served-model-name") == "q$$1"
    assert kubernetes_env(container(pools["q"], "snapshotter"))["BEAR_MODEL"] == "q$$1" == pools_file(report)["q"].model


def test_the_sidecar_takes_its_ports_from_its_flags_alone(reports: dict[str, Any]) -> None:
    """The chart passes --grpc-port and --metrics-port, which win over the environment: it sets no variable beside
    them (and refuses one in vllm.snapshotter.env), so the port the sidecar serves is the one its probes check."""
    from bear.cli.main import build_parser
    from bear.snapshotter.serve import config_from

    (engine,) = engines(reports["default"]).values()
    sidecar = container(engine, "snapshotter")
    assert not {"BEAR_SNAPSHOTTER_GRPC_PORT", "BEAR_SNAPSHOTTER_METRICS_PORT"} & set(env(sidecar))
    config = config_from(build_parser().parse_args(kubernetes_args(sidecar)), kubernetes_env(sidecar))
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert (config.grpc_port, config.metrics_port) == (ports["grpc-snapshot"], ports["metrics"]) == (50071, 9465)
    assert config.advertised_endpoint == "10.0.0.7:50071"
    assert sidecar["readinessProbe"]["grpc"]["port"] == config.grpc_port


def test_router_estimator_and_predictor_are_wired_to_each_other(reports: dict[str, Any]) -> None:
    report = reports["default"]
    services = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s for s in of_kind(report, "Service").values()}
    ports = {name: {p["name"]: p["port"] for p in s["spec"]["ports"]} for name, s in services.items()}
    assert ports["router"]["grpc"] == 50051 and ports["estimator"]["grpc"] == 50052
    assert ports["predictor"]["grpc"] == 50053 and ports["redis"]["redis"] == 6379
    router = env(container(component(report, "Deployment", "router"), "router"))
    assert router["BEAR_ESTIMATOR_ADDRESS"] == f"{services['estimator']['metadata']['name']}:50052"
    assert router["BEAR_PREDICTOR_ADDRESS"] == f"{services['predictor']['metadata']['name']}:50053"
    assert router["BEAR_DEFAULT_POLICY"] == "bear"
    estimator = env(container(component(report, "Deployment", "estimator"), "estimator"))
    assert estimator["BEAR_PREDICTOR_ADDRESS"] == router["BEAR_PREDICTOR_ADDRESS"]  # residents' remaining lengths
    for name in ("router", "estimator"):
        settings = env(container(component(report, "Deployment", name), name))
        assert (settings["BEAR_DISCOVERY"], settings["BEAR_NAMESPACE"]) == ("kubernetes", "$(POD_NAMESPACE)")
        assert settings["BEAR_POOLS_FILE"] == "/etc/bear/pools/pools.yaml"
    for name in ("router", "estimator", "predictor"):
        deployment = component(report, "Deployment", name)
        main = container(deployment, name)
        assert main["args"][:2] == ["serve", name] and deployment["spec"]["replicas"] == 2
        settings = env(main)
        redis_url = f"redis://{services['redis']['metadata']['name']}:6379/0"
        assert settings.get("BEAR_REDIS_URL") == (redis_url if name != "predictor" else None)  # it needs no Redis
        assert settings["OTEL_SERVICE_NAME"] == f"bear-{name}"
    predictor = container(component(report, "Deployment", "predictor"), "predictor")
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert predictor["image"] == f"ghcr.io/bear-router/bear-predictor:{app_version}"  # the BEAR image's + -predictor
    assert env(predictor)["BEAR_PREDICTOR_MODEL_DIR"] == "/opt/bear/predictor"
    # the notes' build command tags the image the chart runs (it said `-t IMAGE`)
    build = (f"docker build -f docker/predictor.Dockerfile --build-arg BEAR_IMAGE=ghcr.io/bear-router/bear:{app_version}"
             f" -t ghcr.io/bear-router/bear-predictor:{app_version} predictor/")
    assert build in report["manifests"]["bear/templates/NOTES.txt"]
    assert component(report, "StatefulSet", "redis")["spec"]["serviceName"] == services["redis"]["metadata"]["name"]


def test_in_process_the_router_pods_run_the_predictor_and_the_estimator(reports: dict[str, Any]) -> None:
    report = reports["in-process"]
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in of_kind(report, "Deployment").values()
            if d["metadata"]["labels"]["app.kubernetes.io/component"] != "engine"} == {"router"}
    services = {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in of_kind(report, "Service").values()}
    assert "estimator" not in services and "predictor" not in services
    policies = {p["metadata"]["labels"]["app.kubernetes.io/component"]
                for p in of_kind(report, "NetworkPolicy").values()}
    assert policies == {"router", "engine", "redis"}
    router = container(component(report, "Deployment", "router"), "router")
    settings = env(router)
    assert settings["BEAR_ROUTER_IN_PROCESS"] == "predictor,estimator"
    assert settings["BEAR_PREDICTOR_MODEL_DIR"] == "/opt/bear/predictor" and settings["BEAR_MAX_SNAPSHOT_AGE_S"] == "1"
    assert "BEAR_ESTIMATOR_ADDRESS" not in settings and "BEAR_PREDICTOR_ADDRESS" not in settings
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert router["image"] == f"ghcr.io/bear-router/bear-predictor:{app_version}"  # the artifact is in that image
    notes = report["manifests"]["bear/templates/NOTES.txt"]
    assert "The router (with the predictor in it) runs the image" in notes
    assert "(router on 9464, snapshotters" in notes
    # An artifact on a claim is mounted in the router pods, which run the BEAR image.
    report = reports["in-process-artifact-on-a-claim"]
    deployment = component(report, "Deployment", "router")
    router = container(deployment, "router")
    assert router["image"] == f"ghcr.io/bear-router/bear:{app_version}"
    mounts = {m["name"]: m for m in router["volumeMounts"]}
    assert mounts["predictor-artifact"]["mountPath"] == env(router)["BEAR_PREDICTOR_MODEL_DIR"] == "/var/lib/bear/predictor"
    assert mounts["predictor-artifact"]["subPath"] == "models/v3" and "pools" in mounts
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["predictor-artifact"]["persistentVolumeClaim"]["claimName"] == "artifacts"
    assert env(router)["BEAR_MAX_SNAPSHOT_AGE_S"] == "3"  # router.env's, in place of the chart's


def test_every_container_has_probes_and_bear_answers_grpc_health(reports: dict[str, Any]) -> None:
    report = reports["example-paper-pools"]
    for workload in [*of_kind(report, "Deployment").values(), *of_kind(report, "StatefulSet").values()]:
        for c in workload["spec"]["template"]["spec"]["containers"]:
            assert "readinessProbe" in c and "livenessProbe" in c, f"{workload['metadata']['name']}/{c['name']}"
            if c["name"] in ("router", "estimator", "predictor"):
                grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    assert c[probe]["grpc"] == {"port": grpc_port}
            elif c["name"] == "snapshotter":  # ready while its engine's snapshots flow: the service's health
                assert c["readinessProbe"]["grpc"] == {"port": 50071, "service": "bear.v1.Snapshotter"}
            elif c["name"] == "vllm":
                assert c["startupProbe"]["httpGet"] == c["readinessProbe"]["httpGet"] == {"path": "/health",
                                                                                          "port": "http"}


def test_pods_run_as_non_root_without_privilege_escalation(reports: dict[str, Any]) -> None:
    for case in GOOD_CASES:
        for workload in [*of_kind(reports[case], "Deployment").values(), *of_kind(reports[case], "StatefulSet")
                         .values()]:
            pod = workload["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
            for c in pod["containers"]:
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
                assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_only_router_and_estimator_may_read_pods_and_nothing_else(reports: dict[str, Any]) -> None:
    report = reports["default"]
    (role,) = of_kind(report, "Role").values()
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    (binding,) = of_kind(report, "RoleBinding").values()
    (account,) = of_kind(report, "ServiceAccount").values()
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]
    for workload in [*of_kind(report, "Deployment").values(), *of_kind(report, "StatefulSet").values()]:
        pod, name = workload["spec"]["template"]["spec"], workload["metadata"]["labels"]["app.kubernetes.io/component"]
        reads = name in ("router", "estimator")
        assert pod["automountServiceAccountToken"] is reads
        assert (pod.get("serviceAccountName") == account["metadata"]["name"]) is reads


def test_network_policies_admit_only_the_callers_of_each_port(reports: dict[str, Any]) -> None:
    report = reports["default"]
    policies = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in of_kind(report, "NetworkPolicy")
                .values()}
    assert sorted(policies) == ["engine", "estimator", "predictor", "redis", "router"]

    def callers(name: str, port: int) -> list[str] | None:
        (rule,) = [r for r in policies[name]["spec"]["ingress"] if r["ports"][0]["port"] == port]
        if "from" not in rule:
            return None  # anyone
        return sorted(peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"])

    assert callers("estimator", 50052) == ["router"]
    assert callers("predictor", 50053) == ["estimator", "router"]
    assert callers("engine", 50071) == ["estimator", "router"]
    assert callers("router", 50051) is None and callers("engine", 8000) is None
    redis_peers = policies["redis"]["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]
    assert {"key": "app.kubernetes.io/instance", "operator": "In", "values": [RELEASE]} in redis_peers


@pytest.mark.parametrize(("case", "admitted"), [("engine-callers-and-scrapers", ["apps", "monitoring"]),
                                               ("engine-callers-only", ["apps"])])
def test_vllms_port_admits_its_callers_and_the_scrapers_of_its_metrics(reports: dict[str, Any], case: str,
                                                                       admitted: list[str]) -> None:
    """vLLM serves /metrics on its inference port: restricted to engineFrom, that port admits metricsFrom's scrapers
    too (else Prometheus, admitted to every metrics port, could not scrape vLLM's), and not anyone when metricsFrom
    is empty (that would open inference to anyone)."""
    (policy,) = [p for p in of_kind(reports[case], "NetworkPolicy").values()
                 if p["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]
    (rule,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 8000]
    namespaces = [peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for peer in rule["from"]]
    assert namespaces == admitted


def test_autoscaling_replaces_fixed_replicas_and_traces_go_to_the_collector(reports: dict[str, Any]) -> None:
    report = reports["paper+production"]
    autoscalers = {h["spec"]["scaleTargetRef"]["name"]: h for h in of_kind(report, "HorizontalPodAutoscaler").values()}
    for name in ("router", "estimator"):
        deployment = component(report, "Deployment", name)
        assert "replicas" not in deployment["spec"]
        assert autoscalers[deployment["metadata"]["name"]]["spec"]["metrics"][0]["resource"]["name"] == "cpu"
        settings = env(container(deployment, name))
        assert settings["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability.svc:4317"
        assert settings["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert settings["OTEL_RESOURCE_ATTRIBUTES"].endswith("deployment.environment=production")
    assert component(report, "Deployment", "predictor")["spec"]["replicas"] == 2  # not autoscaled
    predictor = container(component(report, "Deployment", "predictor"), "predictor")
    (artifact,) = [m for m in predictor["volumeMounts"] if m["mountPath"] == "/var/lib/bear/predictor"]
    assert artifact["subPath"] == "predictor/v3" and artifact["readOnly"] is True
    router_service = component(report, "Service", "router")
    assert router_service["spec"]["type"] == "LoadBalancer"
    # /metrics stays inside the cluster (QA: the balancer published it too)
    assert [p["name"] for p in router_service["spec"]["ports"]] == ["grpc"]
    assert [p["name"] for p in component(reports["default"], "Service", "router")["spec"]["ports"]] == [
        "grpc", "metrics"]
    assert "volumeClaimTemplates" in component(report, "StatefulSet", "redis")["spec"]


def test_changing_the_redis_claim_makes_a_new_statefulset_not_a_refused_upgrade(reports: dict[str, Any]) -> None:
    """A StatefulSet's volumeClaimTemplates cannot change (QA: `helm upgrade` turning persistence on, or resizing the
    claim, was refused by the API server): the name carries the claim's hash; the Service, and so the URL, stays."""
    names = {}
    for case in ("default", "paper+production", "large-whole-numbers"):
        statefulset = component(reports[case], "StatefulSet", "redis")
        service = component(reports[case], "Service", "redis")["metadata"]["name"]
        assert statefulset["spec"]["serviceName"] == service and len(statefulset["metadata"]["name"]) <= 52
        names[case] = statefulset["metadata"]["name"]
        assert (names[case] == service) == ("volumeClaimTemplates" not in statefulset["spec"])
    assert len(set(names.values())) == 3  # memory only, a 2Gi claim, a 10 GiB claim


@pytest.mark.parametrize("case", ["default", "paper+production"])
def test_a_new_chart_version_rolls_no_pod_whose_spec_it_does_not_change(reports: dict[str, Any], case: str) -> None:
    """Pod templates carry no label that changes with the chart or its appVersion (QA: every upgrade rolled every
    vLLM pod, reloading its weights, and the bundled Redis, for a changed helm.sh/chart label alone)."""
    workloads = [o for o in objects(reports[case]) if o["kind"] in ("Deployment", "StatefulSet")]
    assert len(workloads) >= 5
    for workload in workloads:
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert "helm.sh/chart" not in labels and "app.kubernetes.io/version" not in labels, workload["metadata"]
        assert labels.items() >= workload["spec"]["selector"]["matchLabels"].items()
        assert "helm.sh/chart" in workload["metadata"]["labels"]  # the objects themselves keep them


def test_an_external_redis_gets_its_password_from_a_secret_and_tls_files_mounted(reports: dict[str, Any]) -> None:
    report = reports["paper+external-redis-tls"]
    assert not of_kind(report, "StatefulSet")
    assert not [s for s in of_kind(report, "Service").values()
                if s["metadata"]["labels"]["app.kubernetes.io/component"] == "redis"]
    bear_containers = [c for d in of_kind(report, "Deployment").values() for c in d["spec"]["template"]["spec"]
                       ["containers"] if c["name"] not in ("vllm", "predictor")]  # the predictor needs no Redis
    assert len(bear_containers) == 2 + len(PAPER_POOLS)
    for c in bear_containers:
        settings = env(c)
        assert settings["BEAR_REDIS_URL"] == "rediss://redis.cache.svc.cluster.local:6380/0"
        assert settings["BEAR_REDIS_PASSWORD"] == {"secretKeyRef": {"name": "bear-redis", "key": "password"}}
        assert settings["BEAR_REDIS_TLS"] == "true"
        assert [settings[f"BEAR_REDIS_TLS_{kind}_FILE"] for kind in ("CA", "CERT", "KEY")] == [
            "/etc/bear/redis-tls/ca.crt", "/etc/bear/redis-tls/tls.crt", "/etc/bear/redis-tls/tls.key"]
        assert {"name": "redis-tls", "mountPath": "/etc/bear/redis-tls", "readOnly": True} in c["volumeMounts"]


def test_a_rediss_url_means_tls_with_the_secrets_ca_even_without_tls_enabled(reports: dict[str, Any]) -> None:
    report = reports["rediss-url-without-tls-enabled"]
    redis_clients = [c for d in of_kind(report, "Deployment").values() for c in d["spec"]["template"]["spec"]
                     ["containers"] if c["name"] not in ("vllm", "predictor")]
    assert len(redis_clients) == 3  # router, estimator, one snapshotter
    for c in redis_clients:
        settings = env(c)
        assert settings["BEAR_REDIS_TLS"] == "true"
        assert settings["BEAR_REDIS_TLS_CA_FILE"] == "/etc/bear/redis-tls/ca.crt"
        assert "BEAR_REDIS_TLS_CERT_FILE" not in settings
        assert {"name": "redis-tls", "mountPath": "/etc/bear/redis-tls", "readOnly": True} in c["volumeMounts"]


def test_long_names_are_cut_to_63_characters_with_a_hash_and_short_ones_kept(reports: dict[str, Any]) -> None:
    short = reports["default"]
    assert sorted(engines(short)) == ["default"] and engines(short)["default"]["metadata"]["name"] == \
        f"{RELEASE}-bear-engine-default"
    assert {s["metadata"]["name"] for s in of_kind(short, "Service").values()} == {
        f"{RELEASE}-bear-{name}" for name in ("router", "estimator", "predictor", "redis")}
    names = {pool: d["metadata"]["name"] for pool, d in engines(reports["long-names"]).items()}  # 67 characters uncut
    assert len(set(names.values())) == 2
    for pool, name in names.items():  # the beginning, a hash of the whole, and what the object is: its pool
        assert name.startswith("bear-inference-router-produc") and name.endswith(f"-engine-{pool}")
        assert len(name) == 63 and re.search(r"-[0-9a-f]{8}-engine-", name)
    long_fullname = reports["62-character-fullname"]
    services = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s["metadata"]["name"]
                for s in of_kind(long_fullname, "Service").values()}
    assert len(set(services.values())) == 4
    for component_name, name in services.items():
        assert len(name) <= 63 and name.endswith(f"-{component_name}"), name
    router = env(container(component(long_fullname, "Deployment", "router"), "router"))
    assert router["BEAR_REDIS_URL"] == f"redis://{services['redis']}:6379/0"
    assert router["BEAR_ESTIMATOR_ADDRESS"] == f"{services['estimator']}:50052"
    assert component(long_fullname, "StatefulSet", "redis")["spec"]["serviceName"] == services["redis"]


def test_the_bundled_redis_takes_the_password_from_the_secret_too(reports: dict[str, Any]) -> None:
    redis = container(component(reports["everything-off"], "StatefulSet", "redis"), "redis")
    assert redis["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert env(redis)["REDIS_PASSWORD"] == {"secretKeyRef": {"name": "bear-redis", "key": "password"}}
    report = reports["everything-off"]
    assert not of_kind(report, "NetworkPolicy") and not of_kind(report, "Role")
    assert component(report, "Deployment", "router")["spec"]["template"]["spec"]["serviceAccountName"] == "shared"


def test_a_digest_pins_the_image_it_was_given_for_and_no_other(reports: dict[str, Any]) -> None:
    report = reports["images-pinned-by-digest"]
    pools = engines(report)
    assert container(pools["same"], "vllm")["image"] == f"ghcr.io/bear-router/vllm-bear@{DIGEST_B}"
    assert container(pools["own"], "vllm")["image"] == "r/own:0.1.0"  # another repository: not vllm.image's digest
    assert container(pools["pinned"], "vllm")["image"] == f"r/pin@{DIGEST_A}"
    # its own tag: not vllm.image's digest either (it would pin another image than the tag names)
    assert container(pools["own-tag"], "vllm")["image"] == "ghcr.io/bear-router/vllm-bear:0.2.0-rc1"
    assert container(pools["same"], "snapshotter")["image"] == f"ghcr.io/bear-router/bear@{DIGEST_A}"
    for name in ("router", "estimator"):
        assert container(component(report, "Deployment", name), name)["image"] == f"ghcr.io/bear-router/bear@{DIGEST_A}"
    # The predictor image is another image: the BEAR image's digest does not pin it.
    assert container(component(report, "Deployment", "predictor"), "predictor")["image"] == \
        "ghcr.io/bear-router/bear-predictor:0.1.0"
    (redis,) = of_kind(report, "StatefulSet").values()
    assert redis["spec"]["template"]["spec"]["containers"][0]["image"] == f"redis@{DIGEST_A}"


def test_a_pod_gets_the_gpus_of_its_tensor_and_pipeline_parallelism(reports: dict[str, Any]) -> None:
    for case, expected in (("pipeline-parallel", {"a": (8, "4"), "b": (2, "1"), "cpu": (None, None)}),
                           ("pipeline-parallel-short-flag", {"a": (8, "2")}),
                           ("pipeline-parallel-abbreviated", {"a": (4, "2")}),
                           ("pipeline-parallel-shortest-abbreviation", {"a": (4, "1")}),
                           ("prefill-context-parallel", {"a": (8, "2")}),
                           ("prefill-context-parallel-short-flag", {"a": (4, "1")}),
                           ("prefill-context-parallel-abbreviated", {"a": (4, "2")})):
        for pool, (gpus, tensor_parallel) in expected.items():
            vllm = container(engines(reports[case])[pool], "vllm")
            assert vllm.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == gpus, (case, pool)
            if tensor_parallel is not None:
                assert flag(vllm["args"], "--tensor-parallel-size") == tensor_parallel, (case, pool)


def test_the_predictor_artifact_can_be_baked_into_an_image(reports: dict[str, Any]) -> None:
    predictor = component(reports["example-cpu-kind"], "Deployment", "predictor")
    main = container(predictor, "predictor")
    assert main["image"] == "ghcr.io/example/bear-with-predictor:2026-01"
    assert env(main)["BEAR_PREDICTOR_MODEL_DIR"] == "/opt/bear/predictor"
    assert [v["name"] for v in predictor["spec"]["template"]["spec"]["volumes"]] == ["tmp"]


def test_the_notes_tell_how_to_call_route(reports: dict[str, Any]) -> None:
    notes = reports["default"]["manifests"]["bear/templates/NOTES.txt"]
    assert "grpcurl -plaintext -d '{\"prompt\": " in notes and "\"ttft_slo_ms\": 500}'" in notes
    assert "bear.v1.Router/Route" in notes and f"port-forward svc/{RELEASE}-bear-router 50051:50051" in notes


@pytest.mark.parametrize("example", sorted(GOOD_CASES))
def test_every_setting_the_chart_gives_a_service_is_one_it_reads(reports: dict[str, Any], example: str) -> None:
    from bear.estimator.config import ENVIRONMENT as ESTIMATOR
    from bear.predictor.config import ENVIRONMENT as PREDICTOR
    from bear.router.config import ENVIRONMENT as ROUTER

    known = {"router": set(ROUTER), "estimator": set(ESTIMATOR), "predictor": set(PREDICTOR)}
    deployments = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in
                   of_kind(reports[example], "Deployment").values()}
    for name, reads in known.items():
        if name not in deployments:  # router.inProcess: the router reads their settings
            continue
        given = {k for k in env(container(component(reports[example], "Deployment", name), name)) if k.startswith("BEAR_")}
        if "BEAR_ROUTER_IN_PROCESS" in given:
            reads = reads | known["estimator"] | known["predictor"]
        assert given <= reads, f"{name} is given settings it never reads: {sorted(given - reads)}"


def test_the_services_are_started_with_arguments_the_cli_accepts(reports: dict[str, Any]) -> None:
    from bear.cli.main import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices  # noqa: SLF001 (argparse's only way)
    assert "serve" in commands
    for case in ("example-paper-pools", "service-extra-args"):
        for workload in of_kind(reports[case], "Deployment").values():
            for c in workload["spec"]["template"]["spec"]["containers"]:
                if c["name"] != "vllm":
                    parser.parse_args(c["args"])


def test_an_artifact_in_a_configmap_is_mounted_where_the_predictor_reads_it(reports: dict[str, Any]) -> None:
    predictor = component(reports["artifact-in-a-configmap"], "Deployment", "predictor")
    main = container(predictor, "predictor")
    assert main["image"].startswith("ghcr.io/bear-router/bear:")  # the services image: the artifact is mounted
    assert env(main)["BEAR_PREDICTOR_MODEL_DIR"] == "/var/lib/bear/predictor"
    (volume,) = [v for v in predictor["spec"]["template"]["spec"]["volumes"] if v["name"] == "predictor-artifact"]
    assert volume["configMap"]["name"] == f"{RELEASE}-bear-predictor-artifact"


def test_names_that_look_like_numbers_or_booleans_stay_strings(reports: dict[str, Any]) -> None:
    report = reports["names-of-secrets-and-claims-that-look-like-scalars"]
    router = env(container(component(report, "Deployment", "router"), "router"))
    assert router["BEAR_REDIS_PASSWORD"] == {"secretKeyRef": {"name": "on", "key": "007"}}
    predictor = component(report, "Deployment", "predictor")
    (volume,) = [v for v in predictor["spec"]["template"]["spec"]["volumes"] if v["name"] == "predictor-artifact"]
    assert volume["persistentVolumeClaim"]["claimName"] == "007"
    (mount,) = [m for m in container(predictor, "predictor")["volumeMounts"] if m["name"] == "predictor-artifact"]
    assert mount["subPath"] == "1.10"
    redis = component(report, "StatefulSet", "redis")
    assert redis["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "1.10"


def test_a_pods_own_annotations_win_over_the_scrape_hints(reports: dict[str, Any]) -> None:
    for pod in engines(reports["scrape-annotations-overridden"]).values():
        annotations = pod["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == "8000" and annotations["prometheus.io/scrape"] == "true"


def test_a_client_certificate_can_go_with_the_systems_cas(reports: dict[str, Any]) -> None:
    router = env(container(component(reports["client-certificate-with-the-systems-cas"], "Deployment", "router"),
                           "router"))
    assert "BEAR_REDIS_TLS_CA_FILE" not in router
    assert router["BEAR_REDIS_TLS_CERT_FILE"] == "/etc/bear/redis-tls/tls.crt"


def test_the_snapshotter_gets_no_tracing_settings_it_would_not_read(reports: dict[str, Any]) -> None:
    for pod in engines(reports["paper+production"]).values():
        assert not [name for name in env(container(pod, "snapshotter")) if name.startswith("OTEL_")]


def test_on_ipv6_pods_vllm_listens_on_every_ipv6_address_and_pod_addresses_are_bracketed(
        reports: dict[str, Any]) -> None:
    for name, report in (("ipv4", reports["example-paper-pools"]), ("ipv6", reports["ipv6-pods"])):
        for pod in engines(report).values():
            vllm, sidecar = container(pod, "vllm"), env(container(pod, "snapshotter"))
            if name == "ipv6":
                assert flag(vllm["args"], "--host") == "::"
                assert sidecar["BEAR_INSTANCE_ENDPOINT"] == "http://[$(POD_IP)]:8000"
                assert sidecar["BEAR_SNAPSHOTTER_ENDPOINT"] == "[$(POD_IP)]:50071"
            else:
                assert flag(vllm["args"], "--host") == "0.0.0.0"
                assert sidecar["BEAR_INSTANCE_ENDPOINT"] == "http://$(POD_IP):8000"
                assert sidecar["BEAR_SNAPSHOTTER_ENDPOINT"] == "$(POD_IP):50071"


def test_whole_numbers_are_written_out_in_full(reports: dict[str, Any]) -> None:
    """Helm reads the values' numbers as floats, which print 1000000 as 1e+06 (QA: an invalid grace period)."""
    report = reports["large-whole-numbers"]
    (engine,) = engines(report).values()
    pod = engine["spec"]["template"]["spec"]
    assert engine["spec"]["replicas"] == 1_000_000 and pod["terminationGracePeriodSeconds"] == 1_000_000
    vllm = container(engine, "vllm")
    assert vllm["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "999999"]
    assert [flag(vllm["args"], f) for f in ("--max-num-batched-tokens", "--max-num-seqs", "--max-model-len")] == [
        "10000000", "1000000", "10000000"]
    (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"]["sizeLimit"] == 17_179_869_184
    budgets = {b["metadata"]["labels"]["app.kubernetes.io/component"]: b["spec"]["maxUnavailable"]
               for b in of_kind(report, "PodDisruptionBudget").values()}
    assert budgets["engine"] == 2_000_000 and budgets["router"] == 1_000_000
    assert component(report, "Deployment", "router")["spec"]["replicas"] == 1_000_000
    autoscaler = component(report, "HorizontalPodAutoscaler", "estimator")["spec"]
    assert (autoscaler["minReplicas"], autoscaler["maxReplicas"]) == (1_000_000, 2_000_000)
    claim = component(report, "StatefulSet", "redis")["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == 10_737_418_240
    assert "e+" not in "".join(t for name, t in report["manifests"].items() if name.endswith(".yaml"))


def test_redis_urls_the_services_accept_are_accepted_and_tls_follows_the_scheme_in_any_case(
        reports: dict[str, Any]) -> None:
    from bear.common.redis_config import RedisConfig

    for case, tls in (("redis-url-in-capitals-with-an-ipv6-zone", "true"), ("redis-url-with-an-empty-port", None)):
        router = env(container(component(reports[case], "Deployment", "router"), "router"))
        RedisConfig(url=router["BEAR_REDIS_URL"])  # the router's own check
        assert router.get("BEAR_REDIS_TLS") == tls, case
    for case in ("redis-url-percent-encoded-database-not-a-number", "redis-url-database-not-a-number"):
        with pytest.raises(ValueError, match="the database must be a number"):  # refused by the services too
            RedisConfig(url=SCHEMA_REFUSALS[case][0]["redis"]["url"])


def test_network_policy_peers_are_rendered_as_given(reports: dict[str, Any]) -> None:
    report = reports["network-policy-peers-of-every-kind"]
    given = GOOD_CASES["network-policy-peers-of-every-kind"][1]["networkPolicy"]
    rules = {(p["metadata"]["labels"]["app.kubernetes.io/component"], r["ports"][0]["port"]): r.get("from")
             for p in of_kind(report, "NetworkPolicy").values() for r in p["spec"]["ingress"]}
    assert rules[("router", 50051)] == given["routerFrom"]
    assert rules[("engine", 8000)] == given["engineFrom"] + given["metricsFrom"]
    assert rules[("engine", 9465)] == rules[("router", 9464)] == given["metricsFrom"]
