# syntax=docker/dockerfile:1
# The pipeline service image: runs `pipeline run TOPOLOGY` against external Kafka, Triton and
# MinIO (see docker-compose.yaml). The embedded stack is not installed here: containers get
# real services.
#
# Two stages. The builder turns the dependencies into wheels in a layer that depends on
# pyproject.toml alone, so a change to the code rebuilds only the small layers after it (about
# 1.5 GB of wheels, DALI's included, are not fetched again). The final image gets the wheels,
# no compiler and no pip cache, and runs as a non-root user.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# audio: NVIDIA DALI, for the preprocess stage of topologies/audio.yaml (docker-compose.yaml runs it).
ARG EXTRAS=audio
# 1. Dependencies only: the requirement list read from pyproject.toml (core + EXTRAS).
COPY pyproject.toml ./
RUN python - <<'PY' > requirements.txt
import os, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = [e for e in os.environ.get("EXTRAS", "").split(",") if e]
print("\n".join(project["dependencies"] + [d for e in wanted for d in project["optional-dependencies"][e]]))
PY
RUN pip wheel --wheel-dir /wheels -r requirements.txt
# 2. The code: a wheel of this project alone.
COPY README.md ./
COPY pipeline ./pipeline
COPY workers ./workers
RUN pip wheel --no-deps --wheel-dir /wheels/project .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
LABEL org.opencontainers.image.title="streaming-inference-pipeline" \
      org.opencontainers.image.description="Event-driven streaming inference: Kafka in, Triton Inference Server in the middle, Kafka out." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
WORKDIR /app
# Dependencies first (cached while pyproject.toml is unchanged), then the project's own wheel.
COPY --from=builder /src/requirements.txt /tmp/requirements.txt
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels -r /tmp/requirements.txt && rm /tmp/requirements.txt
RUN --mount=type=bind,from=builder,source=/wheels/project,target=/wheels/project \
    pip install --no-index --no-deps /wheels/project/*.whl

COPY topologies ./topologies
COPY sample_models ./sample_models

RUN useradd --system --uid 10001 pipeline
USER pipeline
ENTRYPOINT ["pipeline"]
CMD ["--help"]
