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

Prices may be left out, both of them (the chart always writes them): the pool's prices are then 0 and the router
takes those its instances' snapshotters registered (BEAR_INPUT_USD_PER_MTOK, BEAR_OUTPUT_USD_PER_MTOK), else the
cost the predictor's catalogue gives for the model. Both written as 0 mean the same (as in the chart's values: a pool
meant to cost nothing takes a tiny price, 1e-9). One price without the other is refused.

No two pools may claim the same instance: a static id is listed once in the whole file, and no pool's selector may
be a subset of another's (every pod of the narrower pool would match both). Every error names the pool and the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

import yaml

from bear.common.prices import PRICE_RANGE, price_ok
from bear.common.yaml_files import load_yaml, read_settings_file

DEFAULT_HTTP_PORT = 8000
DEFAULT_SNAPSHOTTER_GRPC_PORT = 50071
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Kubernetes label syntax: a key is [prefix/]name, the prefix a DNS subdomain; a value is like a name (never empty here)
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_FILE_KEYS = {"pools"}
_POOL_KEYS = {"name", "model", "input_usd_per_mtok", "output_usd_per_mtok", "selector", "http_port",
              "snapshotter_grpc_port", "instances"}
_PRICE_KEYS = ("input_usd_per_mtok", "output_usd_per_mtok")
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
        text = read_settings_file(path)
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
    _refuse_unknown(document, _FILE_KEYS, "the pools file")
    pools = tuple(_pool(entry, index) for index, entry in enumerate(document["pools"]))
    repeated = _listed_more_than_once((pool.name, pool.name) for pool in pools)
    if repeated:
        raise PoolsFileError(f"pool names must be unique: {', '.join(sorted(repeated))} repeated")
    repeated = _listed_more_than_once((static.instance_id, pool.name) for pool in pools for static in pool.instances)
    if repeated:
        raise PoolsFileError("instance ids must be unique across pools: " + "; ".join(
            f"{instance_id} repeated (pools {', '.join(names)})" for instance_id, names in sorted(repeated.items())))
    _refuse_nested_selectors(pools)
    return pools


def _listed_more_than_once(listings: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """{key: where it was listed} for each key of the (key, where) pairs that comes more than once; linear."""
    places: dict[str, list[str]] = {}
    for key, where in listings:
        places.setdefault(key, []).append(where)
    return {key: where for key, where in places.items() if len(where) > 1}


def _refuse_nested_selectors(pools: tuple[PoolSpec, ...]) -> None:
    """Two pools whose selectors nest would claim the same pods: every pod of the narrower one matches the wider one.
    Pairwise, as pools are few (each is a Deployment)."""
    selecting = [(pool, pool.selector.items()) for pool in pools if pool.selector]
    for i, (first, first_labels) in enumerate(selecting):
        for second, second_labels in selecting[i + 1:]:
            if first_labels <= second_labels or second_labels <= first_labels:
                wider, narrower = (first, second) if first_labels <= second_labels else (second, first)
                raise PoolsFileError(
                    f"pools {wider.name} and {narrower.name} would claim the same pods: every pod pool "
                    f"{narrower.name} selects ({narrower.label_selector}) also matches pool {wider.name}'s selector "
                    f"({wider.label_selector}); give each pool a label of its own (e.g. bear.dev/pool)")


def _refuse_unknown(entry: Mapping[Any, Any], known: set[str], where: str) -> None:
    unknown = sorted(str(key) for key in entry if key not in known)
    if unknown:
        raise PoolsFileError(f"{where}: unknown field(s) {', '.join(unknown)}")


def _pool(entry: Any, index: int) -> PoolSpec:
    where = f"pools[{index}]"
    if not isinstance(entry, dict):
        raise PoolsFileError(f"{where} must be a mapping")
    name = entry.get("name")
    if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name):
        raise PoolsFileError(f"{where}.name must be a DNS label (lower-case letters, digits, '-'), got {name!r}")
    where = f"pool {name}"
    _refuse_unknown(entry, _POOL_KEYS, where)
    model = entry.get("model")
    if not isinstance(model, str) or not model.strip():
        raise PoolsFileError(f"{where}.model must be a non-empty string, got {model!r}")
    if model != model.strip():
        raise PoolsFileError(f"{where}.model {model!r} has leading or trailing spaces (it would be another model "
                             f"than {model.strip()!r})")
    missing_prices = [key for key in _PRICE_KEYS if key not in entry]
    if len(missing_prices) == 1:
        raise PoolsFileError(f"{where}.{missing_prices[0]} is missing: give both prices or neither (without prices, "
                             f"the instances' registered prices are used)")
    instances = entry.get("instances", [])
    if not isinstance(instances, list):
        raise PoolsFileError(f"{where}.instances must be a list, got {instances!r}")
    return PoolSpec(
        name=name,
        model=model,
        input_usd_per_mtok=_price(entry, "input_usd_per_mtok", where),
        output_usd_per_mtok=_price(entry, "output_usd_per_mtok", where),
        selector=_selector(entry, where),
        http_port=_port(entry, "http_port", DEFAULT_HTTP_PORT, where),
        snapshotter_grpc_port=_port(entry, "snapshotter_grpc_port", DEFAULT_SNAPSHOTTER_GRPC_PORT, where),
        instances=tuple(_instance(item, f"{where}.instances[{i}]") for i, item in enumerate(instances)),
    )


def _selector(entry: Mapping[str, Any], where: str) -> dict[str, str]:
    """Absent: the pool is not looked up in Kubernetes. Given, it must select something, in Kubernetes label syntax
    (a value such as 'a,b' or 'x y' would change the selector's meaning or be refused by the API server)."""
    if "selector" not in entry:
        return {}
    selector = entry["selector"]
    if not isinstance(selector, dict) or not selector:
        raise PoolsFileError(f"{where}.selector must map label names to values (leave it out for a pool of static "
                             f"instances only), got {selector!r}")
    for key, value in selector.items():
        if not _is_label_key(key):
            raise PoolsFileError(f"{where}.selector: {key!r} is not a label name ([DNS subdomain/]name, the name up "
                                 f"to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)")
        if not isinstance(value, str) or not _LABEL_NAME.fullmatch(value):
            raise PoolsFileError(f"{where}.selector.{key} must be a label value (a string of up to 63 letters, "
                                 f"digits, '-', '_' or '.', starting and ending with a letter or digit), got {value!r}")
    return dict(selector)


def _is_label_key(key: Any) -> bool:
    if not isinstance(key, str):
        return False
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return _LABEL_NAME.fullmatch(name) is not None


def _instance(entry: Any, where: str) -> StaticInstance:
    if not isinstance(entry, dict):
        raise PoolsFileError(f"{where} must be a mapping")
    _refuse_unknown(entry, _INSTANCE_KEYS, where)
    instance_id, endpoint = entry.get("id"), entry.get("endpoint")
    if not isinstance(instance_id, str) or not instance_id or _has_space_or_control(instance_id):
        raise PoolsFileError(f"{where}.id must be a non-empty string without spaces, got {instance_id!r}")
    if isinstance(endpoint, str) and "@" in endpoint.partition("://")[2].partition("/")[0]:  # not shown: a password
        raise PoolsFileError(f"{where}.endpoint must not carry a user or password: the router returns the endpoint to "
                             "every client and writes it into its traces")
    if not isinstance(endpoint, str) or not _is_http_url(endpoint):
        raise PoolsFileError(f"{where}.endpoint must be an http:// or https:// URL with a host, got {endpoint!r}")
    snapshotter = entry.get("snapshotter", "")
    if not isinstance(snapshotter, str) or (snapshotter and not _is_host_port(snapshotter)):
        raise PoolsFileError(f"{where}.snapshotter must be host:port (an IPv6 address in brackets), "
                             f"got {snapshotter!r}")
    return StaticInstance(instance_id, endpoint, snapshotter)


def _has_space_or_control(text: str) -> bool:
    return not text.isprintable() or any(character.isspace() for character in text)


def _is_http_url(text: str) -> bool:
    try:
        parts = urlsplit(text)  # raises for a bracketed host that is no IPv6 address
    except ValueError:
        return False
    return (text.startswith(("http://", "https://")) and bool(parts.hostname) and _has_valid_port(parts)
            and not _has_space_or_control(text))


def _is_host_port(text: str) -> bool:
    try:
        parts = urlsplit(f"//{text}")
    except ValueError:
        return False
    return (parts.netloc == text and "@" not in text and bool(parts.hostname)
            and _has_valid_port(parts, required=True) and not _has_space_or_control(text))


def _has_valid_port(parts: SplitResult, required: bool = False) -> bool:
    """The URL's port, if it names one (`required`: it must), is a number from 1 to 65535."""
    try:
        port = parts.port  # raises for a port that is not a number or not in 0-65535
    except ValueError:
        return False
    return port != 0 and (port is not None or not required)


def _price(entry: Mapping[str, Any], key: str, where: str) -> float:
    value = entry.get(key, 0.0)
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not price_ok(value):  # also refuses .nan, .inf and huge integers
        raise PoolsFileError(f"{where}.{key} must be {PRICE_RANGE}, got {value!r}")
    return float(value)


def _port(entry: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise PoolsFileError(f"{where}.{key} must be a port number, got {value!r}")
    return value
