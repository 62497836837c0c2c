"""Settings from the environment: defaults, parsing, and refusals that name the variable."""

from __future__ import annotations

import socket

import pytest

from bear.common.redis_config import RedisConfig
from bear.snapshotter.config import PluginConfig, SnapshotterConfig


def test_defaults_from_an_empty_environment() -> None:
    plugin, sidecar = PluginConfig.from_environ({}), SnapshotterConfig.from_environ({})
    assert plugin == PluginConfig() and plugin.region == sidecar.region == "bear-snapshot"
    assert sidecar.instance_id == socket.gethostname() and sidecar.poll_interval_s == 0.005
    assert sidecar.redis.embedded and sidecar.heartbeat_s == pytest.approx(sidecar.snapshot_ttl_s / 3)


def test_every_setting_is_read() -> None:
    sidecar = SnapshotterConfig.from_environ({
        "BEAR_SNAPSHOT_REGION": "engine-7", "BEAR_INSTANCE_ID": "pod-7", "BEAR_POOL": "large",
        "BEAR_MODEL": "qwen3-32b",
        "BEAR_INSTANCE_ENDPOINT": "http://10.0.0.7:8000", "BEAR_INPUT_USD_PER_MTOK": "0.4",
        "BEAR_OUTPUT_USD_PER_MTOK": "1.6", "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS": "2.5",
        "BEAR_SNAPSHOTTER_GRPC_HOST": "127.0.0.1", "BEAR_SNAPSHOTTER_GRPC_PORT": "0",
        "BEAR_SNAPSHOTTER_ENDPOINT": "10.0.0.7:50071", "BEAR_SNAPSHOT_TTL_S": "3", "BEAR_CALIBRATION_WINDOW": "500",
        "BEAR_CALIBRATION_MIN_SAMPLES": "40", "BEAR_CALIBRATION_REFIT_S": "1", "BEAR_CALIBRATION_RECENT_STEPS": "16",
        "BEAR_REDIS_URL": "redis://r:6379/1"})
    assert (sidecar.region, sidecar.instance_id, sidecar.pool, sidecar.model, sidecar.endpoint) == (
        "engine-7", "pod-7", "large", "qwen3-32b", "http://10.0.0.7:8000")
    assert (sidecar.input_usd_per_million_tokens, sidecar.output_usd_per_million_tokens) == (0.4, 1.6)
    assert (sidecar.poll_interval_s, sidecar.grpc_host, sidecar.grpc_port, sidecar.advertised_endpoint) == (
        0.0025, "127.0.0.1", 0, "10.0.0.7:50071")
    assert (sidecar.snapshot_ttl_s, sidecar.calibration_window, sidecar.calibration_min_samples,
            sidecar.calibration_refit_s, sidecar.calibration_recent_steps) == (3.0, 500, 40, 1.0, 16)
    assert sidecar.redis.url == "redis://r:6379/1"
    plugin = PluginConfig.from_environ({"BEAR_SNAPSHOT_REGION": "/tmp/x", "BEAR_SNAPSHOT_MAX_WAITING": "0",
                                        "BEAR_SNAPSHOT_RING_STEPS": "16", "BEAR_SNAPSHOT_MAX_ID_BYTES": "64"})
    assert plugin == PluginConfig(region="/tmp/x", max_waiting_rows=0, ring_steps=16, max_id_bytes=64)


@pytest.mark.parametrize("environ, names", [
    ({"BEAR_SNAPSHOTTER_GRPC_PORT": "http"}, "BEAR_SNAPSHOTTER_GRPC_PORT"),
    ({"BEAR_SNAPSHOTTER_GRPC_PORT": "70000"}, "BEAR_SNAPSHOTTER_GRPC_PORT"),
    ({"BEAR_SNAPSHOTTER_POLL_INTERVAL_MS": "0"}, "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS"),
    ({"BEAR_SNAPSHOT_TTL_S": "0.5"}, "BEAR_SNAPSHOT_TTL_S"),
    ({"BEAR_CALIBRATION_MIN_SAMPLES": "5000"}, "BEAR_CALIBRATION_MIN_SAMPLES"),
    ({"BEAR_CALIBRATION_RECENT_STEPS": "-1"}, "BEAR_CALIBRATION_RECENT_STEPS"),
    ({"BEAR_CALIBRATION_RECENT_STEPS": "5000"}, "BEAR_CALIBRATION_RECENT_STEPS"),
    ({"BEAR_CALIBRATION_RECENT_STEPS": "eight"}, "BEAR_CALIBRATION_RECENT_STEPS"),
    ({"BEAR_INPUT_USD_PER_MTOK": "-1"}, r"BEAR_INPUT_USD_PER_MTOK must be a number in \[0, 1e\+06\]"),
    ({"BEAR_OUTPUT_USD_PER_MTOK": "2e6"}, r"BEAR_OUTPUT_USD_PER_MTOK must be a number in \[0, 1e\+06\]"),
    ({"BEAR_REDIS_URL": "http://r"}, "BEAR_REDIS_URL"),
    ({"BEAR_REDIS_TLS": "maybe"}, "BEAR_REDIS_TLS"),
    ({"BEAR_INSTANCE_ENDPOINT": "not a url"}, "BEAR_INSTANCE_ENDPOINT"),  # clients are sent there
    ({"BEAR_INSTANCE_ENDPOINT": "http://10.0.0.7:99999"}, "BEAR_INSTANCE_ENDPOINT"),
    ({"BEAR_CALIBRATION_WINDOW": "99999999999999999999999"}, r"BEAR_CALIBRATION_WINDOW must be in \[8, 100000\]"),
    ({"BEAR_INSTANCE_ID": "pod 7"}, "BEAR_INSTANCE_ID must have no spaces or control characters"),
    ({"BEAR_INSTANCE_ID": "pod-7\nforged log line"}, "BEAR_INSTANCE_ID must have no spaces or control characters"),
    ({"BEAR_POOL": "p o o l"}, r"BEAR_POOL \(--pool\) must be 1-253 characters without spaces"),
    ({"BEAR_POOL": "p" * 5000}, r"BEAR_POOL \(--pool\) must be 1-253 characters"),
    # (QA: a name too long for a file logged a traceback at every poll instead of refusing at start)
    ({"BEAR_SNAPSHOT_REGION": "/dev/shm/" + "r" * 300}, "BEAR_SNAPSHOT_REGION's file name must be at most 200"),
])
def test_bad_sidecar_settings_name_the_variable(environ: dict[str, str], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        SnapshotterConfig.from_environ(environ)


@pytest.mark.parametrize("name, text", [
    ("BEAR_INPUT_USD_PER_MTOK", "inf"), ("BEAR_INPUT_USD_PER_MTOK", "nan"), ("BEAR_OUTPUT_USD_PER_MTOK", "inf"),
    ("BEAR_OUTPUT_USD_PER_MTOK", "nan"), ("BEAR_SNAPSHOTTER_POLL_INTERVAL_MS", "inf"), ("BEAR_SNAPSHOT_TTL_S", "inf"),
    ("BEAR_SNAPSHOTTER_ENGINE_TIMEOUT_S", "inf"), ("BEAR_CALIBRATION_REFIT_S", "inf"),
])
def test_a_setting_that_is_no_finite_number_is_refused_naming_the_variable(name: str, text: str) -> None:
    with pytest.raises(ValueError, match=f"{name} .*must be"):
        SnapshotterConfig.from_environ({name: text})


@pytest.mark.parametrize("name, message", [
    ("BEAR_SNAPSHOTTER_POLL_INTERVAL_MS", r"\(--poll-interval-ms\) must be > 0 and at most 60000"),
    ("BEAR_SNAPSHOT_TTL_S", r"must be in \[1, 86400\]"),
])
def test_a_poll_interval_or_ttl_too_long_to_wait_for_is_refused(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"{name} {message}"):
        SnapshotterConfig.from_environ({name: "1e300"})


@pytest.mark.parametrize("environ, names", [
    ({"BEAR_SNAPSHOT_RING_STEPS": "2"}, "BEAR_SNAPSHOT_RING_STEPS"),
    ({"BEAR_SNAPSHOT_MAX_WAITING": "-1"}, "BEAR_SNAPSHOT_MAX_WAITING"),
    ({"BEAR_SNAPSHOT_MAX_WAITING": "100000"}, r"BEAR_SNAPSHOT_MAX_WAITING must be in \[0, 65536\]"),
    ({"BEAR_SNAPSHOT_MAX_ID_BYTES": "many"}, "BEAR_SNAPSHOT_MAX_ID_BYTES"),
    ({"BEAR_SNAPSHOT_REGION": ".."}, "BEAR_SNAPSHOT_REGION must name a file"),  # (QA: /dev/shm/.. is /dev)
    ({"BEAR_SNAPSHOT_REGION": "/tmp/regions/"}, "BEAR_SNAPSHOT_REGION must name a file"),
    ({"BEAR_SNAPSHOT_REGION": "r" * 201}, "BEAR_SNAPSHOT_REGION's file name must be at most 200 bytes, got 201"),
])
def test_bad_plugin_settings_name_the_variable(environ: dict[str, str], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        PluginConfig.from_environ(environ)


def test_the_redis_configuration_is_shared_and_typed() -> None:
    config = RedisConfig.from_environ({"BEAR_REDIS_URL": "rediss://cache:6380/0", "BEAR_REDIS_PASSWORD": "s3cret",
                                       "BEAR_REDIS_TLS_CA_FILE": "/etc/ca.pem", "BEAR_REDIS_TIMEOUT_S": "0.5"})
    assert config.uses_tls and not config.embedded and config.timeout_s == 0.5
    assert "s3cret" not in config.describe() and config.describe() == "rediss://cache:6380 with TLS"


def test_blank_text_settings_count_as_unset_as_for_every_other_service() -> None:
    """(QA: BEAR_INSTANCE_ID="   " became the instance's id; BEAR_POOL, BEAR_MODEL, the region alike.)"""
    blank = {name: "   " for name in ("BEAR_SNAPSHOT_REGION", "BEAR_INSTANCE_ID", "BEAR_POOL", "BEAR_MODEL",
                                       "BEAR_INSTANCE_ENDPOINT", "BEAR_SNAPSHOTTER_ENDPOINT",
                                       "BEAR_SNAPSHOTTER_GRPC_HOST", "BEAR_REDIS_PASSWORD")}
    sidecar = SnapshotterConfig.from_environ(blank)
    assert (sidecar.region, sidecar.instance_id, sidecar.pool, sidecar.model, sidecar.endpoint,
            sidecar.advertised_endpoint) == ("bear-snapshot", socket.gethostname(), "default", "", "", "")
    # (QA: a blank host was taken as a host name, and a blank password sent to Redis as one.)
    assert sidecar.grpc_host == "[::]" and sidecar.redis.password is None
    assert PluginConfig.from_environ({"BEAR_SNAPSHOT_REGION": " "}).region == "bear-snapshot"
    assert SnapshotterConfig.from_environ({"BEAR_POOL": " small "}).pool == "small"


@pytest.mark.parametrize("name", ["BEAR_SNAPSHOT_REGION", "BEAR_INSTANCE_ID", "BEAR_POOL", "BEAR_MODEL",
                                  "BEAR_INSTANCE_ENDPOINT", "BEAR_SNAPSHOTTER_GRPC_HOST"])
def test_a_text_setting_that_is_not_utf8_is_refused_naming_it(name: str) -> None:
    """A byte of the environment that is no UTF-8 reaches Python as a lone surrogate. (QA: in the host, a traceback
    when the server bound; in the model, a sidecar that ran on without ever registering the instance.)"""
    text = "http://ab\udcffc:8000" if name == "BEAR_INSTANCE_ENDPOINT" else "ab\udcffc"
    with pytest.raises(ValueError, match=f"{name}.* is not UTF-8 text"):
        SnapshotterConfig.from_environ({"BEAR_INSTANCE_ID": "pod-1", name: text})


@pytest.mark.parametrize("address", ["http://10.0.0.7:50071", "10.0.0.7", "10.0.0.7:0"])
def test_the_advertised_address_must_be_a_grpc_address(address: str) -> None:
    with pytest.raises(ValueError, match="BEAR_SNAPSHOTTER_ENDPOINT"):
        SnapshotterConfig.from_environ({"BEAR_SNAPSHOTTER_ENDPOINT": address})
    assert SnapshotterConfig.from_environ({"BEAR_SNAPSHOTTER_ENDPOINT": "[fd00::7]:50071"}).advertised_endpoint


def test_a_flag_replaces_a_bad_variable_before_it_is_read() -> None:
    """(QA: BEAR_SNAPSHOTTER_GRPC_PORT=abc with --grpc-port 0 was refused for the variable.)"""
    import argparse

    from bear.snapshotter.serve import add_arguments, config_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    environ = {"BEAR_SNAPSHOTTER_GRPC_PORT": "abc", "BEAR_INSTANCE_ENDPOINT": "10.0.0.7:8000",
               "BEAR_REDIS_URL": "http://nope", "BEAR_SNAPSHOTTER_METRICS_PORT": "x", "BEAR_INSTANCE_ID": "pod-1"}
    config = config_from(parser.parse_args(["--grpc-port", "0", "--endpoint", "http://10.0.0.7:8000", "--redis-url",
                                            "redis://r:6379/0", "--metrics-port", "off"]), environ)
    assert (config.grpc_port, config.endpoint, config.redis.url, config.metrics_port) == (
        0, "http://10.0.0.7:8000", "redis://r:6379/0", None)
    with pytest.raises(ValueError, match="BEAR_SNAPSHOTTER_GRPC_PORT"):
        config_from(parser.parse_args([]), environ)


@pytest.mark.parametrize("environ, names", [
    ({"BEAR_SNAPSHOT_RING_STEPS": "1000000"}, "BEAR_SNAPSHOT_RING_STEPS must be in"),
    ({"BEAR_SNAPSHOT_MAX_ID_BYTES": "1048576"}, "BEAR_SNAPSHOT_MAX_ID_BYTES must be in"),
])
def test_plugin_settings_that_would_make_a_region_of_gigabytes_are_refused(environ: dict[str, str],
                                                                           names: str) -> None:
    with pytest.raises(ValueError, match=names):
        PluginConfig.from_environ(environ)
