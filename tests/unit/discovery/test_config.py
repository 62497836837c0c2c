"""Discovery settings: defaults, the environment, the pod's own namespace, and refusals naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from bear.discovery.config import DiscoveryConfig


def test_defaults_are_static_discovery_without_pools(tmp_path: Path) -> None:
    config = DiscoveryConfig.from_environ({}, namespace_file=tmp_path / "absent")
    assert config == DiscoveryConfig() and (config.mode, config.namespace, config.pools_file) == (
        "static", "default", "")


def test_every_setting_is_read(tmp_path: Path) -> None:
    config = DiscoveryConfig.from_environ({
        "BEAR_DISCOVERY": "Kubernetes", "BEAR_NAMESPACE": "serving", "BEAR_POOLS_FILE": "/etc/bear/pools.yaml",
        "BEAR_DISCOVERY_WATCH_TIMEOUT_S": "60", "BEAR_DISCOVERY_BACKOFF_CAP_S": "3"}, namespace_file=tmp_path / "x")
    assert (config.mode, config.namespace, config.pools_file, config.watch_timeout_s, config.backoff_cap_s) == (
        "kubernetes", "serving", "/etc/bear/pools.yaml", 60.0, 3.0)


def test_the_namespace_defaults_to_the_pods_own(tmp_path: Path) -> None:
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("llm-serving\n")
    assert DiscoveryConfig.from_environ({}, namespace_file=namespace_file).namespace == "llm-serving"
    assert DiscoveryConfig.from_environ({"BEAR_NAMESPACE": "x"}, namespace_file=namespace_file).namespace == "x"
    assert DiscoveryConfig.from_environ({"BEAR_NAMESPACE": " x\n"}, namespace_file=namespace_file).namespace == "x"


@pytest.mark.parametrize("environ, names", [
    ({"BEAR_DISCOVERY": "consul"}, "BEAR_DISCOVERY"),
    ({"BEAR_DISCOVERY_WATCH_TIMEOUT_S": "0"}, "BEAR_DISCOVERY_WATCH_TIMEOUT_S"),
    ({"BEAR_DISCOVERY_WATCH_TIMEOUT_S": "soon"}, "BEAR_DISCOVERY_WATCH_TIMEOUT_S"),
    ({"BEAR_DISCOVERY_BACKOFF_CAP_S": "0.01"}, "BEAR_DISCOVERY_BACKOFF_CAP_S"),
    ({"BEAR_DISCOVERY_WATCH_TIMEOUT_S": "inf"}, r"BEAR_DISCOVERY_WATCH_TIMEOUT_S must be >= 1 and <= 86400 \(a day\)"),
    ({"BEAR_DISCOVERY_WATCH_TIMEOUT_S": "nan"}, "BEAR_DISCOVERY_WATCH_TIMEOUT_S"),
    ({"BEAR_DISCOVERY_WATCH_TIMEOUT_S": "9.3e9"}, "BEAR_DISCOVERY_WATCH_TIMEOUT_S"),  # overflowed time_t in every watch
    ({"BEAR_DISCOVERY_WATCH_TIMEOUT_S": "86401"}, "BEAR_DISCOVERY_WATCH_TIMEOUT_S"),
    ({"BEAR_DISCOVERY_BACKOFF_CAP_S": "inf"}, r"BEAR_DISCOVERY_BACKOFF_CAP_S must be >= 0.2 and <= 3600 \(an hour\)"),
    ({"BEAR_DISCOVERY_BACKOFF_CAP_S": "1e308"}, "BEAR_DISCOVERY_BACKOFF_CAP_S"),
    ({"BEAR_DISCOVERY_BACKOFF_CAP_S": "3601"}, "BEAR_DISCOVERY_BACKOFF_CAP_S"),
    # (QA: a namespace no pod can be in was taken, and the pools stayed empty for ever)
    ({"BEAR_DISCOVERY": "kubernetes", "BEAR_NAMESPACE": "Bear"}, "BEAR_NAMESPACE must be a Kubernetes namespace"),
    ({"BEAR_DISCOVERY": "kubernetes", "BEAR_NAMESPACE": "my bear"}, "BEAR_NAMESPACE"),
    ({"BEAR_DISCOVERY": "kubernetes", "BEAR_NAMESPACE": "bear\nx"}, "BEAR_NAMESPACE"),
    ({"BEAR_DISCOVERY": "kubernetes", "BEAR_NAMESPACE": "a" * 64}, "BEAR_NAMESPACE"),
])
def test_bad_settings_name_the_variable(environ: dict[str, str], names: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=names):
        DiscoveryConfig.from_environ(environ, namespace_file=tmp_path / "absent")


def test_the_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    config = DiscoveryConfig.from_environ({"BEAR_DISCOVERY_WATCH_TIMEOUT_S": "86400",
                                           "BEAR_DISCOVERY_BACKOFF_CAP_S": "3600"}, namespace_file=tmp_path / "x")
    assert (config.watch_timeout_s, config.backoff_cap_s) == (86400.0, 3600.0)
