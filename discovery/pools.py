"""The pools file (BEAR_POOLS_FILE): which pools exist, what they serve and cost, and how to find their instances.

The Helm chart renders it from its `pools:` values into a ConfigMap; locally it is written by hand:

    pools:
      - name: small                      # pool name (DNS label)
        model: Qwen3-0.6B                # the model's name for BEAR (predictor catalogue) and vLLM's served name
        input_usd_per_mtok: 0.044        # prices, USD per million tokens
        output_usd_per_mtok: 0.173
        selector:                        # kubernetes discovery: labels of the pool's pods (all must match)
          app.kubernetes.io/instance: bear
          bear.dev/pool: small
        http_port: 8000                  # the vLLM server's port in each pod (default 8000)
        snapshotter_grpc_port: 50071     # the snapshotter sidecar's gRPC port in each pod (default 50071)
        instances:                       # static discovery: the pool's instances, each always ready
          - id: small-0
            endpoint: http://127.0.0.1:8000
            snapshotter: 127.0.0.1:50071

Every error names the pool and the field.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bear.common.yaml_files import load_yaml

DEFAULT_HTTP_PORT = 8000
DEFAULT_SNAPSHOTTER_GRPC_PORT = 50071
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_POOL_KEYS = {"name", "model", "input_usd_per_mtok", "output_usd_per_mtok", "selector", "http_port",
              "snapshotter_grpc_port", "instances"}
_INSTANCE_KEYS = {"id", "endpoint", "snapshotter"}


class PoolsFileError(ValueError):
    """A pools file that cannot be used; the message names the pool and the field."""


@dataclass(frozen=True, slots=True)
class StaticInstance:
    instance_id: str
    endpoint: str  # the vLLM server, e.g. http://127.0.0.1:8000
    snapshotter_address: str  # host:port of its snapshotter sidecar's gRPC server ("" if none)


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    model: str
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    selector: Mapping[str, str]  # label → value; empty: the pool is not discoverable through Kubernetes
    http_port: int = DEFAULT_HTTP_PORT
    snapshotter_grpc_port: int = DEFAULT_SNAPSHOTTER_GRPC_PORT
    instances: tuple[StaticInstance, ...] = ()

    @property
    def label_selector(self) -> str:
        """The selector as the Kubernetes API takes it (`k=v,k2=v2`, keys sorted)."""
        return ",".join(f"{key}={value}" for key, value in sorted(self.selector.items()))


def load_pools_file(path: str | Path) -> tuple[PoolSpec, ...]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise PoolsFileError(f"cannot read the pools file {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise PoolsFileError(f"the pools file {path} is not UTF-8 text (byte {error.object[error.start]:#04x} at "
                             f"offset {error.start})") from None
    try:
        document = load_yaml(text)
    except yaml.YAMLError as error:
        raise PoolsFileError(f"the pools file {path} is not YAML: {error}") from None
    return parse_pools(document)


def parse_pools(document: Any) -> tuple[PoolSpec, ...]:
    if not isinstance(document, dict) or not isinstance(document.get("pools"), list):
        raise PoolsFileError("the pools file must be a mapping with a `pools` list")
    pools = tuple(_pool(entry, index) for index, entry in enumerate(document["pools"]))
    names = [pool.name for pool in pools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise PoolsFileError(f"pool names must be unique: {', '.join(duplicates)} repeated")
    ids = [instance.instance_id for pool in pools for instance in pool.instances]
    repeated = sorted({instance_id for instance_id in ids if ids.count(instance_id) > 1})
    if repeated:
        raise PoolsFileError(f"instance ids must be unique across pools: {', '.join(repeated)} repeated")
    return pools


def _pool(entry: Any, index: int) -> PoolSpec:
    where = f"pools[{index}]"
    if not isinstance(entry, dict):
        raise PoolsFileError(f"{where} must be a mapping")
    name = entry.get("name")
    if not isinstance(name, str) or not _DNS_LABEL.match(name):
        raise PoolsFileError(f"{where}.name must be a DNS label (lower-case letters, digits, '-'), got {name!r}")
    where = f"pool {name}"
    unknown = sorted(set(entry) - _POOL_KEYS)
    if unknown:
        raise PoolsFileError(f"{where}: unknown field(s) {', '.join(unknown)}")
    model = entry.get("model")
    if not isinstance(model, str) or not model:
        raise PoolsFileError(f"{where}.model must be a non-empty string")
    selector = entry.get("selector") or {}
    if not isinstance(selector, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and v
                                                 for k, v in selector.items()):
        raise PoolsFileError(f"{where}.selector must map label names to string values")
    instances = entry.get("instances") or []
    if not isinstance(instances, list):
        raise PoolsFileError(f"{where}.instances must be a list")
    return PoolSpec(
        name=name,
        model=model,
        input_usd_per_mtok=_price(entry, "input_usd_per_mtok", where),
        output_usd_per_mtok=_price(entry, "output_usd_per_mtok", where),
        selector=dict(selector),
        http_port=_port(entry, "http_port", DEFAULT_HTTP_PORT, where),
        snapshotter_grpc_port=_port(entry, "snapshotter_grpc_port", DEFAULT_SNAPSHOTTER_GRPC_PORT, where),
        instances=tuple(_instance(item, f"{where}.instances[{i}]") for i, item in enumerate(instances)),
    )


def _instance(entry: Any, where: str) -> StaticInstance:
    if not isinstance(entry, dict):
        raise PoolsFileError(f"{where} must be a mapping")
    unknown = sorted(set(entry) - _INSTANCE_KEYS)
    if unknown:
        raise PoolsFileError(f"{where}: unknown field(s) {', '.join(unknown)}")
    instance_id, endpoint = entry.get("id"), entry.get("endpoint")
    if not isinstance(instance_id, str) or not instance_id:
        raise PoolsFileError(f"{where}.id must be a non-empty string")
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise PoolsFileError(f"{where}.endpoint must be an http:// or https:// URL, got {endpoint!r}")
    snapshotter = entry.get("snapshotter", "")
    if not isinstance(snapshotter, str):
        raise PoolsFileError(f"{where}.snapshotter must be host:port")
    return StaticInstance(instance_id, endpoint, snapshotter)


def _price(entry: Mapping[str, Any], key: str, where: str) -> float:
    value = entry.get(key, 0.0)
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not 0 <= value <= sys.float_info.max:  # also refuses .nan, .inf and huge integers
        raise PoolsFileError(f"{where}.{key} must be a finite number >= 0 (USD per million tokens), got {value!r}")
    return float(value)


def _port(entry: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise PoolsFileError(f"{where}.{key} must be a port number, got {value!r}")
    return value
