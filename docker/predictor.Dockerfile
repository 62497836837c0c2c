# syntax=docker/dockerfile:1
# The predictor's image: the BEAR image with a trained artifact copied in, the chart's default source of the artifact
# (predictor.artifact.source: image; the default training's ~2 MB do not fit a ConfigMap). The build context is the
# artifact's directory (`bear predictor train --out predictor/`):
#   docker build -f docker/predictor.Dockerfile --build-arg BEAR_IMAGE=REGISTRY/bear:0.1.0 \
#       -t REGISTRY/bear-predictor:0.1.0 predictor/
ARG BEAR_IMAGE=ghcr.io/bear-router/bear:0.1.0
FROM ${BEAR_IMAGE}
# Where the chart expects it (predictor.artifact.image.path).
COPY --chown=10001:10001 . /opt/bear/predictor/
ENV BEAR_PREDICTOR_MODEL_DIR=/opt/bear/predictor
