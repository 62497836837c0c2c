"""Which instances a query may go to: discovery's ready ones with pools, else the registered ones."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from bear.discovery.instances import Instance
from bear.discovery.pools import PoolSpec
from bear.router.pool import InstancePool, Registration, routable_instances, same_model
from bear.router.query import InvalidQuery

POOLS = (PoolSpec("small", "Qwen/Qwen3-0.6B", 0.044, 0.173, {}), PoolSpec("free", "Qwen/Qwen3-8B", 0.0, 0.0, {}))


def test_without_pools_every_registered_instance_is_routable_in_id_order() -> None:
    registrations = {"b": Registration("b", "p", "m", "http://b", 1.0, 2.0), "a": Registration("a", "p", "m", "")}
    assert [i.instance_id for i in routable_instances({}, (), registrations)] == ["a", "b"]
    assert routable_instances({}, (), registrations)[1].cost_micro_usd(10, 5) == 10 * 1.0 + 5 * 2.0


def test_with_pools_discovery_decides_and_registrations_fill_in() -> None:
    discovered = {"s-0": Instance("s-0", "small", "Qwen/Qwen3-0.6B", "http://10.0.0.1:8000", ""),
                  "f-0": Instance("f-0", "free", "Qwen/Qwen3-8B", "", "")}
    registrations = {"f-0": Registration("f-0", "free", "Qwen/Qwen3-8B", "http://10.0.0.2:8000", 0.5, 0.6),
                     "gone": Registration("gone", "small", "Qwen/Qwen3-0.6B", "http://x")}  # not ready: not routed
    instances = {i.instance_id: i for i in routable_instances(discovered, POOLS, registrations)}
    assert set(instances) == {"s-0", "f-0"}
    assert (instances["s-0"].input_usd_per_mtok, instances["s-0"].endpoint) == (0.044, "http://10.0.0.1:8000")
    assert (instances["f-0"].input_usd_per_mtok, instances["f-0"].endpoint) == (0.5, "http://10.0.0.2:8000")


def test_a_discovery_change_is_seen_at_once() -> None:
    state = {"now": MappingProxyType({"s-0": Instance("s-0", "small", "m", "http://a", "")})}
    pool = InstancePool(lambda: state["now"], POOLS)
    assert [i.instance_id for i in pool.instances()] == ["s-0"]
    state["now"] = MappingProxyType({})  # the pod turned unready
    assert pool.instances() == ()


def test_allowed_models_select_by_exact_or_short_name_and_unknown_models_are_refused() -> None:
    pool = InstancePool(lambda: {})
    pool.update_registrations({"a": Registration("a", "p", "Qwen/Qwen3-8B", "http://a"),
                               "b": Registration("b", "p", "Qwen3-32B", "http://b")}, now_s=0.0)
    assert [i.instance_id for i in pool.select(["Qwen3-8B"])] == ["a"]
    assert [i.instance_id for i in pool.select(["Qwen/Qwen3-32B", "Qwen3-8B"])] == ["a", "b"]
    assert len(pool.select([])) == 2
    with pytest.raises(InvalidQuery, match="allowed_models: unknown model 'gpt-9'; the pool serves"):
        pool.select(["gpt-9"])


def test_model_names() -> None:
    assert same_model("Qwen/Qwen3-8B", "Qwen3-8B") and same_model("a", "a") and not same_model("Qwen3-8B", "qwen3-8b")
    assert same_model("Qwen3-8B", "Qwen/Qwen3-8B") and same_model("Qwen/Qwen3-8B", "Qwen/Qwen3-8B")
    assert not same_model("Qwen/Qwen3-8B", "unsloth/Qwen3-8B")  # another organisation's model of that name


def test_allowed_models_of_another_organisation_select_nothing_of_this_one() -> None:
    pool = InstancePool(lambda: {})
    pool.update_registrations({"a": Registration("a", "p", "Qwen/Qwen3-8B", "http://a"),
                               "b": Registration("b", "p", "unsloth/Qwen3-8B", "http://b")}, now_s=0.0)
    assert [i.instance_id for i in pool.select(["unsloth/Qwen3-8B"])] == ["b"]
    assert [i.instance_id for i in pool.select(["Qwen3-8B"])] == ["a", "b"]
    with pytest.raises(InvalidQuery, match="allowed_models: unknown model 'meta/Qwen3-8B'"):
        pool.select(["meta/Qwen3-8B"])


def test_a_registration_missing_from_a_redis_back_empty_is_kept_for_a_while() -> None:
    pool = InstancePool(lambda: {}, forget_after_s=15.0)
    a, b = Registration("a", "p", "m", "http://a"), Registration("b", "p", "m", "http://b")
    pool.update_registrations({"a": a, "b": b}, now_s=100.0)
    pool.update_registrations({}, now_s=110.0, redis_new=True)  # Redis restarted empty
    assert [i.instance_id for i in pool.instances()] == ["a", "b"]
    pool.update_registrations({"a": a}, now_s=114.0)  # a re-registered, b not yet
    assert [i.instance_id for i in pool.instances()] == ["a", "b"]
    c = Registration("c", "p", "m", "http://c")  # registered after the reset, then withdrawn: gone at once
    pool.update_registrations({"a": a, "c": c}, now_s=115.0)
    pool.update_registrations({"a": a}, now_s=116.0)
    assert [i.instance_id for i in pool.instances()] == ["a", "b"]
    pool.update_registrations({"a": a}, now_s=126.0)
    assert [i.instance_id for i in pool.instances()] == ["a"]


def test_a_registration_missing_from_a_redis_that_kept_the_others_is_gone_at_once() -> None:
    """Its sidecar withdrew it (the engine died) or stopped refreshing it: queries sent there would be lost."""
    pool = InstancePool(lambda: {}, forget_after_s=15.0)
    a, b = Registration("a", "p", "m", "http://a"), Registration("b", "p", "m", "http://b")
    pool.update_registrations({"a": a, "b": b}, now_s=100.0, redis_new=True)  # the router's first read
    pool.update_registrations({"a": a, "b": b}, now_s=120.0)
    pool.update_registrations({"a": a}, now_s=121.0)
    assert [i.instance_id for i in pool.instances()] == ["a"]
