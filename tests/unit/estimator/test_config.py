"""The estimator's settings: defaults, the environment the Helm chart sets, a config file under both, flags over all."""

from __future__ import annotations

from pathlib import Path

import pytest

from bear.common.config_sources import ConfigFileError
from bear.estimator.config import EstimatorConfig, load


def test_defaults_need_no_setting() -> None:
    config = load({}, None, {})
    assert config == EstimatorConfig()
    assert (config.grpc_port, config.metrics_port, config.max_snapshot_age_s) == (50052, 9464, 2.0)
    assert config.redis.embedded and config.discovery.mode == "static"


def test_the_charts_environment_is_understood() -> None:
    config = load({"BEAR_ESTIMATOR_GRPC_PORT": "50052", "BEAR_ESTIMATOR_METRICS_PORT": "9464"}, None, {
        "BEAR_MAX_SNAPSHOT_AGE_S": "1.0", "BEAR_DISCOVERY": "kubernetes", "BEAR_NAMESPACE": "bear",
        "BEAR_POOLS_FILE": "/etc/bear/pools/pools.yaml", "BEAR_REDIS_URL": "redis://bear-redis:6379/0",
        "BEAR_REDIS_TIMEOUT_S": "0.5", "OTEL_SDK_DISABLED": "true", "POD_NAME": "bear-estimator-0"})
    assert config.max_snapshot_age_s == 1.0
    assert (config.discovery.mode, config.discovery.namespace, config.discovery.pools_file) == (
        "kubernetes", "bear", "/etc/bear/pools/pools.yaml")
    assert config.redis.url == "redis://bear-redis:6379/0" and config.redis.timeout_s == 0.5


def test_units_in_the_names_are_converted() -> None:
    config = load({}, None, {"BEAR_ESTIMATOR_PREDICTOR_TIMEOUT_MS": "250", "BEAR_ESTIMATOR_DISPATCH_POLL_MS": "20"})
    assert config.predictor_timeout_s == 0.25 and config.dispatch_poll_interval_s == 0.02


def test_flags_override_the_environment_which_overrides_the_file(tmp_path: Path) -> None:
    file = tmp_path / "estimator.yaml"
    file.write_text("max_snapshot_age_s: 3\nestimator_grpc_port: 6000\nestimator_metrics_port: off\n"
                    "redis_url: redis://from-file:6379/0\npredictor_address: predictor:50053\n")
    config = load({"BEAR_ESTIMATOR_GRPC_PORT": "7000", "BEAR_MAX_SNAPSHOT_AGE_S": None}, str(file),
                  {"BEAR_MAX_SNAPSHOT_AGE_S": "4", "BEAR_REDIS_URL": "redis://from-env:6379/0"})
    assert config.grpc_port == 7000  # flag
    assert config.max_snapshot_age_s == 4.0  # environment (the flag was not given)
    assert config.redis.url == "redis://from-env:6379/0"
    assert config.metrics_port is None and config.predictor_address == "predictor:50053"  # file


def test_a_file_key_that_is_not_a_setting_is_named(tmp_path: Path) -> None:
    file = tmp_path / "estimator.yaml"
    file.write_text("max_snapshot_age: 3\n")
    with pytest.raises(ConfigFileError, match="unknown setting 'max_snapshot_age'"):
        load({}, str(file), {})


@pytest.mark.parametrize(("environ", "message"), [
    ({"BEAR_MAX_SNAPSHOT_AGE_S": "0"}, "BEAR_MAX_SNAPSHOT_AGE_S must be > 0"),
    ({"BEAR_MAX_SNAPSHOT_AGE_S": "soon"}, "BEAR_MAX_SNAPSHOT_AGE_S must be a number"),
    ({"BEAR_ESTIMATOR_GRPC_PORT": "70000"}, "BEAR_ESTIMATOR_GRPC_PORT must be a port number"),
    ({"BEAR_ESTIMATOR_METRICS_PORT": "nine"}, "BEAR_ESTIMATOR_METRICS_PORT must be an integer"),
    ({"BEAR_PREDICTOR_MODEL_DIR": "/does/not/exist"}, "BEAR_PREDICTOR_MODEL_DIR: /does/not/exist is not a dir"),
    ({"BEAR_PREDICTOR_MODEL_DIR": "/tmp/" + "a" * 300}, "BEAR_PREDICTOR_MODEL_DIR: /tmp/a+: File name too long"),
    ({"BEAR_DISCOVERY": "consul"}, "BEAR_DISCOVERY must be one of"),
    ({"BEAR_ESTIMATOR_FORGET_AFTER_S": "0.5"}, "BEAR_ESTIMATOR_FORGET_AFTER_S must be >= BEAR_ESTIMATOR_RESYNC_S"),
    ({"BEAR_PREDICTOR_ADDRESS": "https://predictor:443"}, "BEAR_PREDICTOR_ADDRESS is a gRPC address"),
])
def test_bad_settings_are_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load({}, None, environ)
