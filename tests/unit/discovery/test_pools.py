"""The pools file: what it reads, its defaults, and refusals that name the pool and the field."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from bear.discovery.pools import PoolsFileError, PoolSpec, StaticInstance, load_pools_file, parse_pools

PAPER_POOLS = """
pools:
  - name: small
    model: Qwen3-0.6B
    input_usd_per_mtok: 0.044
    output_usd_per_mtok: 0.173
    selector: {app.kubernetes.io/instance: bear, bear.dev/pool: small}
  - name: large
    model: Qwen3-32B
    input_usd_per_mtok: 0.287
    output_usd_per_mtok: 0.640
    http_port: 8080
    snapshotter_grpc_port: 50099
    instances:
      - {id: large-0, endpoint: "http://127.0.0.1:8080", snapshotter: "127.0.0.1:50099"}
"""


def test_a_pools_file_is_read_with_its_defaults(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(PAPER_POOLS)
    small, large = load_pools_file(path)
    assert small == PoolSpec("small", "Qwen3-0.6B", 0.044, 0.173,
                             {"app.kubernetes.io/instance": "bear", "bear.dev/pool": "small"})
    assert (small.http_port, small.snapshotter_grpc_port, small.instances) == (8000, 50071, ())
    assert small.label_selector == "app.kubernetes.io/instance=bear,bear.dev/pool=small"
    assert (large.http_port, large.snapshotter_grpc_port, large.selector) == (8080, 50099, {})
    assert large.instances == (StaticInstance("large-0", "http://127.0.0.1:8080", "127.0.0.1:50099"),)


def test_a_tiny_price_is_written_as_the_readme_says(tmp_path: Path) -> None:
    """(QA: `1e-9`, the README's price of a pool that costs nothing, was text to YAML 1.1 and refused.)"""
    path = tmp_path / "pools.yaml"
    path.write_text("pools:\n  - {name: free, model: m, input_usd_per_mtok: 1e-9, output_usd_per_mtok: 2E-9}\n")
    (free,) = load_pools_file(path)
    assert (free.input_usd_per_mtok, free.output_usd_per_mtok) == (1e-9, 2e-9)


def _pool(**fields: Any) -> dict[str, Any]:
    return {"pools": [{"name": "small", "model": "m", **fields}]}


@pytest.mark.parametrize("document, message", [
    (None, "`pools` list"),
    ({"pools": {"small": {}}}, "`pools` list"),
    ({"pools": ["small"]}, r"pools\[0\] must be a mapping"),
    ({"pools": [{"name": "Small_Pool", "model": "m"}]}, r"pools\[0\].name must be a DNS label"),
    (_pool(model=""), "pool small.model"),
    (_pool(input_usd_per_mtok=-1, output_usd_per_mtok=0.1), "pool small.input_usd_per_mtok"),
    (_pool(input_usd_per_mtok=0.1, output_usd_per_mtok="cheap"), "pool small.output_usd_per_mtok"),
    (_pool(http_port=0), "pool small.http_port"),
    (_pool(snapshotter_grpc_port=True), "pool small.snapshotter_grpc_port"),
    (_pool(selector={"bear.dev/pool": 3}), "pool small.selector"),
    (_pool(replicas=2), r"unknown field\(s\) replicas"),
    (_pool(instances=[{"id": "a", "endpoint": "127.0.0.1:8000"}]), r"pool small.instances\[0\].endpoint"),
    (_pool(instances=[{"endpoint": "http://a"}]), r"pool small.instances\[0\].id"),
    (_pool(instances=[{"id": "a", "endpoint": "http://a", "port": 1}]), "unknown field"),
    ({"pools": [{"name": "a", "model": "m"}, {"name": "a", "model": "n"}]}, "unique: a repeated"),
    ({"pools": [{"name": "a", "model": "m", "instances": [{"id": "x", "endpoint": "http://1"}]},
                {"name": "b", "model": "m", "instances": [{"id": "x", "endpoint": "http://2"}]}]},
     r"instance ids must be unique across pools: x repeated \(pools a, b\)"),
    ({"pools": [], "defaults": {"model": "m"}}, r"the pools file: unknown field\(s\) defaults"),
    (_pool(model="  "), "pool small.model must be a non-empty string"),
    (_pool(model="Qwen3-8B "), "pool small.model 'Qwen3-8B ' has leading or trailing spaces"),
    (_pool(input_usd_per_mtok=0.1), "pool small.output_usd_per_mtok is missing: give both prices or neither"),
    (_pool(selector=""), "pool small.selector must map label names to values"),
    (_pool(selector=False), "pool small.selector must map label names to values"),
    (_pool(selector={}), "pool small.selector must map label names to values"),
    (_pool(selector=None), "pool small.selector must map label names to values"),
    (_pool(selector={"app": "a,b"}), "pool small.selector.app must be a label value"),
    (_pool(selector={"app": "x y"}), "pool small.selector.app must be a label value"),
    (_pool(selector={"app": "a" * 64}), "pool small.selector.app must be a label value"),
    (_pool(selector={"app": "bär"}), "pool small.selector.app must be a label value"),
    (_pool(selector={"!bad key": "v"}), "pool small.selector: '!bad key' is not a label name"),
    (_pool(selector={"Bear.dev/pool": "v"}), "pool small.selector: 'Bear.dev/pool' is not a label name"),
    (_pool(selector={"a/b/c": "v"}), "pool small.selector: 'a/b/c' is not a label name"),
    (_pool(selector={"/pool": "v"}), "pool small.selector: '/pool' is not a label name"),
    (_pool(instances=""), "pool small.instances must be a list, got ''"),
    (_pool(instances=0), "pool small.instances must be a list, got 0"),
    (_pool(instances=[{"id": "", "endpoint": "http://a"}]), r"pool small.instances\[0\].id must be a non-empty"),
    (_pool(instances=[{"id": "a b", "endpoint": "http://a"}]), r"pool small.instances\[0\].id .* without spaces"),
    (_pool(instances=[{"id": "a\n", "endpoint": "http://a"}]), r"pool small.instances\[0\].id .* without spaces"),
    (_pool(instances=[{"id": "a", "endpoint": "http://"}]), r"pool small.instances\[0\].endpoint .* with a host"),
    (_pool(instances=[{"id": "a", "endpoint": "http://:8000"}]), r"pool small.instances\[0\].endpoint"),
    (_pool(instances=[{"id": "a", "endpoint": "http://h:99999"}]), r"pool small.instances\[0\].endpoint"),
    (_pool(instances=[{"id": "a", "endpoint": "http://h x:1"}]), r"pool small.instances\[0\].endpoint"),
    (_pool(instances=[{"id": "a", "endpoint": "http://h", "snapshotter": "garbage"}]),
     r"pool small.instances\[0\].snapshotter must be host:port"),
    (_pool(instances=[{"id": "a", "endpoint": "http://h", "snapshotter": "h:0"}]), r"\[0\].snapshotter"),
    (_pool(instances=[{"id": "a", "endpoint": "http://h", "snapshotter": "fd00::7:50071"}]), r"\[0\].snapshotter"),
    (_pool(instances=[{"id": "a", "endpoint": "http://h", "snapshotter": "h:1/x"}]), r"\[0\].snapshotter"),
    # (QA: the router would hand the password to every client and write it into its traces)
    (_pool(instances=[{"id": "a", "endpoint": "http://admin:s3cret@h:8000/v1"}]),
     r"pool small.instances\[0\].endpoint must not carry a user or password: the router returns the endpoint to "
     r"every client and writes it into its traces$"),
    # (QA: a bracketed host that is no IPv6 address escaped as urllib's ValueError: the estimator died with a traceback)
    (_pool(instances=[{"id": "a", "endpoint": "http://[::1:8000"}]), r"pool small.instances\[0\].endpoint"),
    (_pool(instances=[{"id": "a", "endpoint": "http://[vllm-0]:8000"}]), r"pool small.instances\[0\].endpoint"),
    (_pool(instances=[{"id": "a", "endpoint": "http://h", "snapshotter": "[::1:50071"}]), r"\[0\].snapshotter"),
    (_pool(instances=[{"id": "a", "endpoint": "http://h", "snapshotter": "[fe80::zz]:1"}]), r"\[0\].snapshotter"),
    ({"pools": [{"name": "all", "model": "m", "selector": {"app": "bear"}},
                {"name": "large", "model": "n", "selector": {"app": "bear", "bear.dev/pool": "large"}}]},
     r"pools all and large would claim the same pods: every pod pool large selects \(app=bear,bear.dev/pool=large\)"
     r" also matches pool all's selector \(app=bear\)"),
    ({"pools": [{"name": "a", "model": "m", "selector": {"app": "bear"}},
                {"name": "b", "model": "n", "selector": {"app": "bear"}}]}, "pools a and b would claim the same pods"),
])
def test_bad_pools_are_refused_with_the_field_named(document: Any, message: str) -> None:
    with pytest.raises(PoolsFileError, match=message):
        parse_pools(document)


@pytest.mark.parametrize("text", [".inf", ".nan", "1" + "0" * 400, "1e300", "-0.5"],
                         ids=["inf", "nan", "too-large-for-a-float", "a-cost-that-overflows", "negative"])
def test_a_price_out_of_bounds_is_refused_with_the_field_named(text: str) -> None:
    # 1e300 USD per million tokens made a long prompt's cost infinite: 0 × inf utility (λ = 0) is NaN, and max() kept
    # a leading NaN, so that instance won every decision
    with pytest.raises(PoolsFileError, match=r"pool small.output_usd_per_mtok must be a number in \[0, 1e\+06\]"):
        parse_pools(yaml.safe_load(f"pools: [{{name: small, model: m, input_usd_per_mtok: 1, "
                                   f"output_usd_per_mtok: {text}}}]"))


def test_the_documented_example_loads() -> None:
    example = Path(__file__).parents[3] / "docs" / "examples" / "pools.yaml"  # README: the router's section
    pools = load_pools_file(example)
    assert [(p.name, p.model, [i.instance_id for i in p.instances]) for p in pools] == [
        ("small", "Qwen3-0.6B", ["small-0"]), ("medium", "Qwen3-8B", ["medium-0"]), ("large", "Qwen3-32B", ["large-0"])]


def test_unreadable_or_non_yaml_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PoolsFileError, match="cannot read"):
        load_pools_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [unclosed")
    with pytest.raises(PoolsFileError, match="not YAML"):
        load_pools_file(bad)
    bad.write_text("pools:\n  - name: small\n    model: m\n    input_usd_per_mtok: 0.1\n    input_usd_per_mtok: 0.2\n")
    with pytest.raises(PoolsFileError, match=r"(?s)bad.yaml.*the key 'input_usd_per_mtok' appears a second time"):
        load_pools_file(bad)


def test_a_file_that_is_not_utf8_text_is_refused_with_its_name(tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(PoolsFileError, match=f"the pools file {binary} is not UTF-8 text"):
        load_pools_file(binary)


def test_what_the_checks_must_not_refuse() -> None:
    """Prices left out (both): 0, the instances' registered prices are used. Prefixed label keys, bracketed IPv6
    snapshotters, https endpoints with a path, and selectors that overlap without nesting are all fine."""
    external, small, large = parse_pools({"pools": [
        {"name": "external", "model": "Qwen/Qwen3-8B", "instances": [
            {"id": "ext-0", "endpoint": "https://llm.example.com:8443/v1", "snapshotter": "[fd00::7]:50071"}]},
        {"name": "small", "model": "m", "selector": {"app.kubernetes.io/instance": "bear", "bear.dev/pool": "small"}},
        {"name": "large", "model": "m", "selector": {"app.kubernetes.io/instance": "bear", "bear.dev/pool": "large"}},
    ]})
    assert (external.input_usd_per_mtok, external.output_usd_per_mtok) == (0.0, 0.0)
    assert external.instances[0].snapshotter_address == "[fd00::7]:50071"
    assert small.label_selector == "app.kubernetes.io/instance=bear,bear.dev/pool=small" and large.selector


def test_uniqueness_is_checked_in_linear_time() -> None:
    """30,000 instance ids took seconds with a quadratic check; a linear one takes a small fraction of one."""
    document = {"pools": [{"name": f"p{p}", "model": "m", "instances": [
        {"id": f"p{p}-{i}", "endpoint": "http://10.0.0.1:8000"} for i in range(3000)]} for p in range(10)]}
    started_s = time.perf_counter()
    assert sum(len(pool.instances) for pool in parse_pools(document)) == 30000
    assert time.perf_counter() - started_s < 1.5
