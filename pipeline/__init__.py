"""Event-driven streaming inference pipelines: Kafka in, Triton Inference Server in the middle, Kafka out."""

__version__ = "0.1.0"
