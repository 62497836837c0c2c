# syntax=docker/dockerfile:1
# vLLM's OpenAI-compatible server with BEAR's scheduler plugin, for the chart's pool pods:
#   docker build -f docker/vllm.Dockerfile -t ghcr.io/bear-router/vllm-bear:0.1.0 .
# The chart starts it as `vllm serve MODEL --scheduler-cls bear.snapshotter.plugin.AsyncSnapshotScheduler
# --async-scheduling ...` with BEAR_SNAPSHOT_REGION set. The plugin needs only vLLM, the standard library and BEAR's
# own pure-Python modules, so BEAR is installed without dependencies: vLLM's pinned versions stay as they are.
ARG VLLM_VERSION=v0.32.0

# Build BEAR's wheel with the image's own Python (the wheel's tag must match it).
FROM vllm/vllm-openai:${VLLM_VERSION} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN python3 -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM vllm/vllm-openai:${VLLM_VERSION}
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python3 -m pip install --no-cache-dir --no-deps /wheels/bear_router-*.whl \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin bear
# An unprivileged user with a passwd entry (PyTorch's compile cache asks for the user name); the chart mounts
# writable /cache and /tmp and points HF_HOME, VLLM_CACHE_ROOT and friends there.
ENV HOME=/tmp
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["vllm", "serve"]
