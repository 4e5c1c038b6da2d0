"""One metrics-topic record, parsed: who sent it, when, and its samples.

The record is what :func:`pipeline.observability.snapshot.publish_snapshots`
writes: ``{"topology", "process", "timestamp_ms", "metrics": {family: [sample...]}}``
where a sample is ``{"name", "labels", "value"}``. Anything else on the topic (a
record from another tool, a truncated value) is not a snapshot: :func:`parse_snapshot`
answers None and the caller counts it, rather than the view crashing on it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One Prometheus sample: ``pipeline_requests_total{stage="classify"} 12``."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Snapshot:
    """One process's metrics at one instant."""

    topology: str
    process: str
    timestamp_ms: int
    samples: tuple[Sample, ...]

    def start_time_ms(self) -> int | None:
        """When the process started (``process_start_time_seconds``; Linux only), if known."""
        for sample in self.samples:
            if sample.name == "process_start_time_seconds" and math.isfinite(sample.value):
                return int(sample.value * 1000)
        return None


def parse_snapshot(value: bytes | None) -> Snapshot | None:
    """The snapshot in a record's value, or None when the value is not one."""
    if not value:
        return None
    try:
        data = json.loads(value)
        return Snapshot(
            topology=str(data["topology"]),
            process=str(data["process"]),
            timestamp_ms=int(data["timestamp_ms"]),
            samples=tuple(_samples(data["metrics"])),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _samples(families: dict[str, Any]) -> list[Sample]:
    return [
        Sample(
            name=str(sample["name"]),
            labels={str(k): str(v) for k, v in sample["labels"].items()},
            value=float(sample["value"]),
        )
        for samples in families.values()
        for sample in samples
    ]
