"""The Dockerfiles (docker/) cannot be built here (no Docker engine); this checks what can be checked without one:
the stages, the base images, the non-root user and the entry points against pyproject.toml and the chart."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with continuation lines joined and comments dropped."""
    logical, current = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            keyword, _, rest = current.strip().partition(" ")
            logical.append((keyword.upper(), rest.strip()))
        current = ""
    return logical


def stages(steps: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for step in steps:
        if step[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(step)
    return out


def args(steps: list[tuple[str, str]]) -> dict[str, str]:
    return dict(rest.split("=", 1) for keyword, rest in steps if keyword == "ARG" and "=" in rest)


def final(stage: list[tuple[str, str]], keyword: str) -> str:
    return [rest for k, rest in stage if k == keyword][-1]


def test_the_services_image_builds_the_wheel_and_runs_bear_as_non_root() -> None:
    steps = instructions(ROOT / "docker" / "bear.Dockerfile")
    build, run = stages(steps)
    assert build[0] == ("FROM", "python:${PYTHON_VERSION}-slim-bookworm AS build")
    python = args(steps)["PYTHON_VERSION"]
    assert python == "3.11" and PYPROJECT["project"]["requires-python"] == f">={python}"
    assert any(k == "RUN" and "g++" in rest for k, rest in build)  # the C++ core is compiled
    assert any(k == "RUN" and re.search(r"pip wheel .*--wheel-dir /wheels \.$", rest) for k, rest in build)
    assert run[0] == ("FROM", "python:${PYTHON_VERSION}-slim-bookworm")
    install = next(rest for k, rest in run if k == "RUN" and "pip install" in rest)
    assert "from=build" in install and install.endswith(PYPROJECT["project"]["name"]) and "--no-index" in install
    user = final(run, "USER").split(":")[0]
    assert user.isdigit() and int(user) > 0
    assert json.loads(final(run, "ENTRYPOINT")) == ["bear"] and "bear" in PYPROJECT["project"]["scripts"]
    exposed = {int(port) for port in final(run, "EXPOSE").split()}
    assert exposed == {50051, 50052, 50053, 50071, 9464, 9465}


def test_the_vllm_image_adds_the_plugin_to_a_pinned_upstream_vllm() -> None:
    steps = instructions(ROOT / "docker" / "vllm.Dockerfile")
    build, run = stages(steps)
    assert re.fullmatch(r"v0\.3[23]\.\d+", args(steps)["VLLM_VERSION"])
    assert build[0] == ("FROM", "vllm/vllm-openai:${VLLM_VERSION} AS build")
    assert run[0] == ("FROM", "vllm/vllm-openai:${VLLM_VERSION}")
    assert any(k == "RUN" and "pip wheel" in rest and "--no-deps" in rest for k, rest in build)
    install = next(rest for k, rest in run if k == "RUN" and "pip install" in rest)
    assert "--no-deps" in install and "bear_router-" in install  # vLLM's own pins stay untouched
    user = final(run, "USER").split(":")[0]
    assert user.isdigit() and int(user) > 0
    assert json.loads(final(run, "ENTRYPOINT")) == ["vllm", "serve"]


@pytest.mark.parametrize("dockerfile", ["bear.Dockerfile", "vllm.Dockerfile"])
def test_the_build_context_keeps_every_packaged_folder(dockerfile: str) -> None:
    patterns = [line.strip() for line in (ROOT / "docker" / f"{dockerfile}.dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    needed = ["pyproject.toml", "CMakeLists.txt", "README.md", "native", "proto",  # CMake's add_subdirectory
              *PYPROJECT["tool"]["scikit-build"]["wheel"]["packages"].values()]
    for path in needed:
        assert not any(fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/") for pattern in patterns), path
    assert ".venv" in patterns and "build" in patterns


def test_the_predictor_image_puts_the_artifact_where_the_chart_reads_it() -> None:
    import yaml

    values = yaml.safe_load((ROOT / "helm" / "bear" / "values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "helm" / "bear" / "Chart.yaml").read_text())
    steps = instructions(ROOT / "docker" / "predictor.Dockerfile")
    (stage,) = stages(steps)
    assert stage[0] == ("FROM", "${BEAR_IMAGE}")
    assert args(steps)["BEAR_IMAGE"] == f"{values['image']['repository']}:{chart['appVersion']}"
    assert values["predictor"]["artifact"]["source"] == "image"  # the chart's default
    path = values["predictor"]["artifact"]["image"]["path"]
    copy = final(stage, "COPY").split()
    services_user = final(stages(instructions(ROOT / "docker" / "bear.Dockerfile"))[-1], "USER")
    assert copy == [f"--chown={services_user}", ".", f"{path}/"]
    assert final(stage, "ENV") == f"BEAR_PREDICTOR_MODEL_DIR={path}"
