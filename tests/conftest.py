"""Fixtures shared by test folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM virtualenv's python (BEAR_VLLM_PYTHON, set by `make test`); tests that need it skip without it."""
    python = os.environ.get("BEAR_VLLM_PYTHON")
    if not python:
        pytest.skip("BEAR_VLLM_PYTHON is not set (make test sets it to the vLLM virtualenv's python)")
    if not Path(python).exists():
        pytest.fail(f"BEAR_VLLM_PYTHON={python} does not exist: run `make setup`")
    return python
