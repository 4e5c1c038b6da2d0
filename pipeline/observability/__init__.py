"""Observability: Prometheus metrics, the metrics-topic snapshot, health endpoints, tracing."""
