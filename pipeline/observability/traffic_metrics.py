"""Metrics of stages with routes or a shadow: requests and latency per route, shadow outcomes.

Kept beside :class:`~pipeline.observability.metrics.PipelineMetrics` rather than in it:
only stages with ``routes`` or ``shadow`` register them, once per process registry
(several such stages in one process share the families, told apart by ``stage``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import ClassVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from pipeline.observability.metrics import _LATENCY_BUCKETS, PipelineMetrics


@dataclass(frozen=True)
class TrafficMetrics:
    route_requests: Counter
    """pipeline_route_requests_total{stage, route}: requests a route was chosen for."""
    route_latency: Histogram
    """pipeline_route_request_duration_seconds{stage, route}: one batched Triton call of a route."""
    shadow: Counter
    """pipeline_shadow_total{stage, outcome}: mirrored requests, by outcome (sent, failed, dropped)."""

    _made: ClassVar[weakref.WeakKeyDictionary[CollectorRegistry, TrafficMetrics]] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, metrics: PipelineMetrics) -> TrafficMetrics:
        """The families on ``metrics``' registry, registered on first use."""
        registry = metrics.registry
        made = cls._made.get(registry)
        if made is None:
            made = cls._made[registry] = cls(
                route_requests=Counter(
                    "pipeline_route_requests_total",
                    "Requests a stage sent to each of its routes (weighted by key, or by task header).",
                    ["stage", "route"],
                    registry=registry,
                ),
                route_latency=Histogram(
                    "pipeline_route_request_duration_seconds",
                    "Duration of one batched Triton call, per route.",
                    ["stage", "route"],
                    buckets=_LATENCY_BUCKETS,
                    registry=registry,
                ),
                shadow=Counter(
                    "pipeline_shadow_total",
                    "Requests mirrored to a stage's shadow model, by outcome: sent (its result reached the "
                    "shadow topic), failed (shadow model unavailable, call or send failed), dropped (shadow "
                    "calls all busy, or shutdown). Best effort: never delays the main result.",
                    ["stage", "outcome"],
                    registry=registry,
                ),
            )
        return made
