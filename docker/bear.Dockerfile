# syntax=docker/dockerfile:1
# The BEAR services image: `bear serve router|estimator|predictor|snapshotter` (the snapshotter runs as the sidecar of
# every vLLM pod). Built from the repository root:
#   docker build -f docker/bear.Dockerfile -t ghcr.io/bear-router/bear:0.1.0 .
ARG PYTHON_VERSION=3.11

# Build: BEAR's wheel with its C++ core (scikit-build-core fetches CMake and pybind11; g++ 12 compiles C++20), and a
# wheel of every dependency, so the runtime stage needs no compiler and no network.
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# Run: the wheels in a slim Python, as an unprivileged user. libgomp1 is LightGBM's OpenMP runtime.
FROM python:${PYTHON_VERSION}-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin bear
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels bear-router
ENV PYTHONUNBUFFERED=1 HOME=/tmp
USER 10001:10001
# gRPC: router 50051, estimator 50052, predictor 50053, snapshotter 50071; Prometheus /metrics: 9464, snapshotter 9465.
EXPOSE 50051 50052 50053 50071 9464 9465
ENTRYPOINT ["bear"]
CMD ["--help"]
