# The pipeline service image: runs `pipeline run TOPOLOGY` against external
# Kafka, Triton and MinIO (see docker-compose.yaml). The embedded stack is
# not installed here: containers get real services.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY pipeline ./pipeline
COPY workers ./workers
# audio: NVIDIA DALI, for the preprocess stage of topologies/audio.yaml (docker-compose.yaml runs it).
RUN pip install ".[audio]"

COPY topologies ./topologies
COPY sample_models ./sample_models

RUN useradd --system --uid 10001 pipeline
USER pipeline
ENTRYPOINT ["pipeline"]
CMD ["--help"]
