"""The router's settings: defaults, flags over the environment over the file, and errors that name the setting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bear.router.config import RouterConfig, load


def test_defaults_match_the_charts_ports_and_the_issue() -> None:
    config = load({}, environ={})
    assert (config.grpc_port, config.metrics_port, config.default_policy, config.fallback_policy) == (
        50051, 9464, "bear", "shortest-queue")
    assert (config.estimator_address, config.predictor_address) == ("localhost:50052", "localhost:50053")
    assert config.predictor_timeout_s == config.estimator_timeout_s == 0.1


def test_flags_over_environment_over_file(tmp_path: Path) -> None:
    file = tmp_path / "router.yaml"
    file.write_text("default_policy: score\nrouter_predictor_timeout_ms: 70\nrouter_metrics_port: off\n"
                    "estimator_address: file:1\n")
    environ = {"BEAR_DEFAULT_POLICY": "lmdeploy", "BEAR_ESTIMATOR_ADDRESS": "env:2"}
    config = load({"BEAR_ESTIMATOR_ADDRESS": "flag:3", "BEAR_ROUTER_GRPC_PORT": None}, str(file), environ)
    assert (config.default_policy, config.estimator_address, config.predictor_timeout_s) == ("lmdeploy", "flag:3",
                                                                                             0.07)
    assert config.metrics_port is None and config.grpc_port == 50051


@pytest.mark.parametrize(("value", "streams"), [("", True), ("on", True), ("OFF", False), ("false", False),
                                               ("1", True), ("no", False)])
def test_call_streams_switch(value: str, streams: bool) -> None:
    assert load({}, environ={"BEAR_ROUTER_CALL_STREAMS": value}).call_streams is streams
    assert load({"BEAR_ROUTER_CALL_STREAMS": value or None}, environ={}).call_streams is streams  # --call-streams


def test_upstream_streams_from_the_environment_or_the_file(tmp_path: Path) -> None:
    assert load({}, environ={}).upstream_streams == 1
    assert load({}, environ={"BEAR_ROUTER_UPSTREAM_STREAMS": " 12 "}).upstream_streams == 12
    file = tmp_path / "router.yaml"
    file.write_text("router_upstream_streams: 3\n")
    assert load({}, str(file), environ={}).upstream_streams == 3


@pytest.mark.parametrize(("value", "services"), [
    ("", set()), ("none", set()), ("predictor", {"predictor"}), (" Estimator ", {"estimator"}),
    ("predictor, estimator", {"predictor", "estimator"}), ("estimator,predictor,", {"predictor", "estimator"})])
def test_in_process_services(value: str, services: set[str], tmp_path: Path) -> None:
    assert load({}, environ={"BEAR_ROUTER_IN_PROCESS": value}).in_process == services
    assert load({"BEAR_ROUTER_IN_PROCESS": value or None}, environ={}).in_process == services  # --in-process
    file = tmp_path / "router.yaml"
    file.write_text(f"router_in_process: '{value}'\n")
    assert load({}, str(file), environ={}).in_process == services


def test_the_charts_environment_is_understood() -> None:
    config = load({}, environ={"BEAR_ESTIMATOR_ADDRESS": "bear-estimator:50052",
                               "BEAR_PREDICTOR_ADDRESS": "bear-predictor:50053", "BEAR_DEFAULT_POLICY": "bear",
                               "BEAR_DISCOVERY": "kubernetes", "BEAR_NAMESPACE": "ns",
                               "BEAR_POOLS_FILE": "/etc/bear/pools/pools.yaml", "BEAR_REDIS_URL": "redis://r:6379/0",
                               "OTEL_SDK_DISABLED": "true"})
    assert (config.discovery.mode, config.discovery.namespace, config.redis.url) == ("kubernetes", "ns",
                                                                                     "redis://r:6379/0")


def test_policy_parameters_are_json() -> None:
    config = load({}, environ={"BEAR_ROUTER_POLICY_PARAMS": '{"bear": {"safety": 1.2, "fallback": "shed"}}'})
    assert config.policy_params == {"bear": {"safety": 1.2, "fallback": "shed"}}
    for text in ("{bear", "[" * 100_000, '{"bear": {"safety": ' + "1" * 5000 + "}}"):  # deep; > 4300 digits
        with pytest.raises(ValueError, match="BEAR_ROUTER_POLICY_PARAMS: not valid JSON"):
            load({}, environ={"BEAR_ROUTER_POLICY_PARAMS": text})
    with pytest.raises(ValueError, match="BEAR_ROUTER_POLICY_PARAMS: the key 'bear' is given twice"):
        load({}, environ={"BEAR_ROUTER_POLICY_PARAMS": '{"bear": {}, "bear": {"safety": 1.2}}'})
    with pytest.raises(ValueError, match="BEAR_ROUTER_POLICY_PARAMS must map"):
        load({}, environ={"BEAR_ROUTER_POLICY_PARAMS": '{"bear": 1}'})


@pytest.mark.parametrize(("environ", "message"), [
    ({"BEAR_ROUTER_GRPC_PORT": "x"}, "BEAR_ROUTER_GRPC_PORT must be an integer"),
    ({"BEAR_ROUTER_ESTIMATOR_TIMEOUT_MS": "-1"}, "BEAR_ROUTER_ESTIMATOR_TIMEOUT_MS must be > 0, got -1.0"),
    ({"BEAR_ROUTER_REFRESH_S": "1e300"}, r"BEAR_ROUTER_REFRESH_S must be at most 86400 \(a day\), got 1e\+300"),
    ({"BEAR_ROUTER_FORGET_AFTER_S": "86401"}, "BEAR_ROUTER_FORGET_AFTER_S must be at most 86400"),
    ({"BEAR_ROUTER_FALLBACK_SNAPSHOT_AGE_S": "1e9"}, "BEAR_ROUTER_FALLBACK_SNAPSHOT_AGE_S must be at most 86400"),
    ({"BEAR_ROUTER_UPSTREAM_STREAMS": "0"}, r"BEAR_ROUTER_UPSTREAM_STREAMS must be in \[1, 64\], got 0"),
    ({"BEAR_ROUTER_UPSTREAM_STREAMS": "65"}, r"BEAR_ROUTER_UPSTREAM_STREAMS must be in \[1, 64\], got 65"),
    ({"BEAR_ROUTER_UPSTREAM_STREAMS": "2.5"}, "BEAR_ROUTER_UPSTREAM_STREAMS must be an integer"),
    ({"BEAR_ROUTER_GRPC_PORT": "70000"}, "BEAR_ROUTER_GRPC_PORT must be a port number"),
    ({"BEAR_ROUTER_PREDICTOR_TIMEOUT_MS": "0"}, "BEAR_ROUTER_PREDICTOR_TIMEOUT_MS must be > 0"),
    ({"BEAR_ROUTER_ESTIMATOR_TIMEOUT_MS": "1e13"}, "BEAR_ROUTER_ESTIMATOR_TIMEOUT_MS must be at most 60000"),
    ({"BEAR_ROUTER_REDIS_TIMEOUT_MS": "60001"}, "BEAR_ROUTER_REDIS_TIMEOUT_MS must be at most 60000"),
    ({"BEAR_SHUTDOWN_GRACE_S": "inf"}, r"BEAR_SHUTDOWN_GRACE_S must be in \[0, 3600\] seconds"),
    ({"BEAR_SHUTDOWN_GRACE_S": "-1"}, r"BEAR_SHUTDOWN_GRACE_S must be in \[0, 3600\] seconds"),
    ({"BEAR_LAMBDA_PER_MICRO_USD": "-1"}, "BEAR_LAMBDA_PER_MICRO_USD must be in"),
    ({"BEAR_LAMBDA_PER_MICRO_USD": "1e300"}, "BEAR_LAMBDA_PER_MICRO_USD must be in"),
    ({"BEAR_ROUTER_TOKENIZER": "gpt"}, "BEAR_ROUTER_TOKENIZER must be one of qwen, pretokens"),
    ({"BEAR_ROUTER_MAX_TTFT_SLO_MS": "nan"}, "BEAR_ROUTER_MAX_TTFT_SLO_MS must be > 0"),
    # the replay's horizon (factor × target + 1 s) must stay finite: 1e308 made every Route fall back
    ({"BEAR_ROUTER_MAX_TTFT_SLO_MS": "1e308"}, "BEAR_ROUTER_MAX_TTFT_SLO_MS must be at most 8.64e"),
    ({"BEAR_ROUTER_HORIZON_FACTOR": "1e308"}, "BEAR_ROUTER_HORIZON_FACTOR must be at most 1000"),
    ({"BEAR_ROUTER_MAX_PROMPT_BYTES": "0"}, r"BEAR_ROUTER_MAX_PROMPT_BYTES must be in \[1, 268435456\]"),
    ({"BEAR_ROUTER_MAX_PROMPT_BYTES": "4000000000"}, "BEAR_ROUTER_MAX_PROMPT_BYTES must be in"),
    ({"BEAR_ROUTER_CALL_STREAMS": "maybe"}, r"BEAR_ROUTER_CALL_STREAMS must be true or false \(on or off\), got 'maybe'"),
    # a URL or a missing port is no gRPC address: the router would run degraded for good
    ({"BEAR_ESTIMATOR_ADDRESS": "http://bear-estimator:50052"}, "BEAR_ESTIMATOR_ADDRESS is a gRPC address"),
    ({"BEAR_PREDICTOR_ADDRESS": "bear-predictor"}, "BEAR_PREDICTOR_ADDRESS must be host:port"),
    ({"BEAR_PREDICTOR_ADDRESS": "::::"}, "BEAR_PREDICTOR_ADDRESS must be host:port"),
    ({"BEAR_ESTIMATOR_ADDRESS": "h\udcff:5"}, "BEAR_ESTIMATOR_ADDRESS is not UTF-8 text"),  # an undecodable byte
    ({"BEAR_ROUTER_IN_PROCESS": "predictor,redis"}, "BEAR_ROUTER_IN_PROCESS: unknown service 'redis'; name predictor, "
                                                    "estimator, both"),
    ({"BEAR_ROUTER_IN_PROCESS": "none,estimator"}, "BEAR_ROUTER_IN_PROCESS: none stands alone"),
])
def test_bad_settings_name_the_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load({}, environ=environ)


def test_an_unknown_file_setting_is_named(tmp_path: Path) -> None:
    file = tmp_path / "router.yaml"
    file.write_text("defualt_policy: bear\n")
    with pytest.raises(ValueError, match="unknown setting 'defualt_policy'"):
        load({}, str(file), {})


def test_policies_are_checked_when_the_router_is_built() -> None:
    from bear.router.main import build_policies

    policies, fallback = build_policies(RouterConfig(policy_params={"bear": {"safety": 1.5}}))
    assert policies["bear"].safety == 1.5 and fallback.name == "shortest-queue"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="BEAR_DEFAULT_POLICY: unknown policy 'nope'"):
        build_policies(RouterConfig(default_policy="nope"))
    with pytest.raises(ValueError, match="has no parameter 'speed'"):
        build_policies(RouterConfig(policy_params={"bear": {"speed": 1}}))
    with pytest.raises(ValueError, match="BEAR_ROUTER_POLICY_PARAMS: unknown policy 'nope'"):
        build_policies(RouterConfig(policy_params={"nope": {}}))


@pytest.mark.parametrize(("params", "message"), [
    ({"bear": {"safety": "x"}}, "BEAR_ROUTER_POLICY_PARAMS: policy 'bear': parameter 'safety' must be a number, "
                                "got 'x'"),
    ({"bear": {"safety": True}}, "BEAR_ROUTER_POLICY_PARAMS: policy 'bear': parameter 'safety' must be a number"),
    ({"bear": {"fallback": 3}}, "BEAR_ROUTER_POLICY_PARAMS: policy 'bear': parameter 'fallback' must be a string"),
    ({"bear": {"safety": -1}}, "BEAR_ROUTER_POLICY_PARAMS: policy 'bear': safety must be a positive number"),
    ({"vllm-sr": {"window": 2.5}}, "BEAR_ROUTER_POLICY_PARAMS: policy 'vllm-sr': parameter 'window' must be an "
                                   "integer"),
    ({"score": {"cost_weight_per_micro_usd": "x"}}, "parameter 'cost_weight_per_micro_usd' must be a number or null"),
    ({"shortest-queue": {"speed": 1}}, "BEAR_ROUTER_POLICY_PARAMS: policy 'shortest-queue' has no parameter 'speed'"),
])
def test_policy_parameters_of_the_wrong_type_name_the_variable_the_policy_and_the_parameter(
        params: dict[str, dict[str, object]], message: str) -> None:
    from bear.router.main import build_policies

    with pytest.raises(ValueError, match=re.escape(message)):
        build_policies(RouterConfig(policy_params=params))


def test_policy_parameters_of_the_right_types_build() -> None:
    from bear.router.main import build_policies

    policies, _ = build_policies(RouterConfig(policy_params={
        "bear": {"safety": 2, "fallback": "shed"}, "score": {"cost_weight_per_micro_usd": None},
        "vllm-sr": {"window": 10}}))
    assert policies["bear"].safety == 2 and policies["vllm-sr"].window == 10  # type: ignore[attr-defined]
