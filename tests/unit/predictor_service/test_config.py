"""The predictor service's settings: the artifact is required; the chart's flags and environment are understood."""

from __future__ import annotations

from pathlib import Path

import pytest

from bear.predictor.config import PredictorServiceConfig, load


def test_the_charts_settings_are_understood() -> None:
    config = load({"BEAR_PREDICTOR_GRPC_PORT": "50053", "BEAR_PREDICTOR_METRICS_PORT": "9464"}, None,
                  {"BEAR_PREDICTOR_MODEL_DIR": "/var/lib/bear/predictor", "OTEL_SDK_DISABLED": "true"})
    assert config == PredictorServiceConfig(model_dir="/var/lib/bear/predictor", grpc_port=50053, metrics_port=9464)


def test_the_artifact_is_required() -> None:
    with pytest.raises(ValueError, match="BEAR_PREDICTOR_MODEL_DIR .--model-dir. is required"):
        load({}, None, {})


def test_flags_override_the_environment_which_overrides_the_file(tmp_path: Path) -> None:
    file = tmp_path / "predictor.yaml"
    file.write_text("predictor_model_dir: /from/file\npredictor_workers: 2\npredictor_metrics_port: off\n"
                    "predictor_grpc_port: 1\n")
    config = load({"BEAR_PREDICTOR_MODEL_DIR": "/from/flag", "BEAR_PREDICTOR_GRPC_PORT": None}, str(file),
                  {"BEAR_PREDICTOR_GRPC_PORT": "2"})
    assert (config.model_dir, config.grpc_port, config.workers, config.metrics_port) == ("/from/flag", 2, 2, None)


@pytest.mark.parametrize(("environ", "message"), [
    ({"BEAR_PREDICTOR_WORKERS": "0"}, r"BEAR_PREDICTOR_WORKERS must be in \[1, 1024\] \(threads\), got 0"),
    ({"BEAR_PREDICTOR_WORKERS": "100000000"}, r"BEAR_PREDICTOR_WORKERS must be in \[1, 1024\]"),  # (QA: taken)
    ({"BEAR_PREDICTOR_MAX_PROMPT_CHARS": "-1"}, r"BEAR_PREDICTOR_MAX_PROMPT_CHARS must be in \[1, 67108864\]"),
    ({"BEAR_PREDICTOR_MAX_PROMPT_CHARS": "1000000000"}, "BEAR_PREDICTOR_MAX_PROMPT_CHARS must be in"),
    ({"BEAR_PREDICTOR_GRPC_PORT": "x"}, "BEAR_PREDICTOR_GRPC_PORT must be an integer"),
])
def test_bad_settings_are_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load({}, None, {"BEAR_PREDICTOR_MODEL_DIR": "/a", **environ})


def test_the_most_workers_are_taken() -> None:
    assert load({}, None, {"BEAR_PREDICTOR_MODEL_DIR": "/a", "BEAR_PREDICTOR_WORKERS": "1024"}).workers == 1024
