"""What the stages themselves saw during each step, read from the topology's metrics topic.

Bench times requests from the outside; the stages' own metrics say where the time
went (how big the batches were, how long Triton took, what the stage measured end
to end, what it dead-lettered). Every ``pipeline run`` process publishes a snapshot
every ``metrics_interval_s``; after the sweep, :func:`read_snapshots` reads the
snapshots published since the first step began into a :class:`SnapshotLog`, and
:meth:`SnapshotLog.step` turns them into one row per stage for one step with the
same code as ``pipeline top`` (:mod:`pipeline.tools.top.window`).

The window of a step, per process, is from its first snapshot at or after the
step's pipeline phase began to its last snapshot at or before that phase ended:
inside the step, so nothing of the warm-up, the step before or the next one is
counted (at the price of the up to two intervals of the step outside it; the
per-second rate is what compares with bench's own). A step shorter than two
metrics intervals may hold no such pair at all, so its stage numbers are "n/a",
said as such, rather than a number from a window that happens to be tiny.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.settings import KafkaSettings
from pipeline.tools.top.reader import MetricsReader
from pipeline.tools.top.snapshot import Snapshot
from pipeline.tools.top.window import StageRow, Window, between, merge

MIN_INTERVALS = 2
"""A step shorter than this many metrics intervals gets no stage numbers."""
READ_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class StepStages:
    """The stages' rows over one step, or why there are none (``note``)."""

    rows: tuple[StageRow, ...] = ()
    note: str | None = None

    def to_dict(self) -> list[dict[str, Any]] | None:
        """JSON-ready rows, None when not available (``note`` says why)."""
        if self.note is not None:
            return None
        return [_row_dict(row) for row in self.rows]


@dataclass
class SnapshotLog:
    """Every snapshot of one topology read back, per process, in time order."""

    topology: str
    metrics_interval_s: float
    skipped: int = 0
    _by_process: dict[str, dict[int, Snapshot]] = field(default_factory=dict)

    def add(self, snapshot: Snapshot | None) -> None:
        """Keep ``snapshot`` if it is this topology's (the metrics topic may be shared)."""
        if snapshot is None:
            self.skipped += 1
        elif snapshot.topology == self.topology:
            self._by_process.setdefault(snapshot.process, {})[snapshot.timestamp_ms] = snapshot

    def step(self, start_ms: int, end_ms: int) -> StepStages:
        """Per stage, what its processes did from ``start_ms`` to ``end_ms`` (wall clock)."""
        interval_ms = self.metrics_interval_s * 1000
        if end_ms - start_ms < MIN_INTERVALS * interval_ms:
            return StepStages(
                note=f"n/a: step shorter than {MIN_INTERVALS} metrics intervals "
                f"({MIN_INTERVALS} x {self.metrics_interval_s:g} s)"
            )
        per_stage: dict[str, list[Window]] = {}
        for process in sorted(self._by_process):
            inside = [s for t, s in sorted(self._by_process[process].items()) if start_ms <= t <= end_ms]
            windows = between(inside[0], inside[-1]) if len(inside) >= 2 else None
            for stage, window in (windows or {}).items():
                per_stage.setdefault(stage, []).append(window)
        if not per_stage:
            return StepStages(note="n/a: no process has two snapshots of one run inside the step")
        return StepStages(rows=tuple(merge(stage, windows) for stage, windows in sorted(per_stage.items())))


async def read_snapshots(
    kafka: KafkaSettings, topic: str, topology: str, metrics_interval_s: float, since_ms: int
) -> SnapshotLog:
    """The topology's snapshots published since ``since_ms``; raises when the topic cannot be read."""
    log = SnapshotLog(topology, metrics_interval_s)
    lookback_s = max(time.time() - since_ms / 1000, 0.0) + metrics_interval_s
    reader = MetricsReader(kafka, topic, lookback_s)
    await reader.start()
    try:
        await reader.catch_up(log, READ_TIMEOUT_S)
    finally:
        await reader.stop()
    return log


def _row_dict(row: StageRow) -> dict[str, Any]:
    """Counters as integers (snapshots carry every value as a float), times in milliseconds."""

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000, 3)

    return {
        "stage": row.stage,
        "processes": row.processes,
        "window_s": None if row.window_s is None else round(row.window_s, 3),
        "requests": round(row.delta.requests),
        "requests_per_s": None if row.rate is None else round(row.rate, 2),
        "results": round(row.delta.results),
        "mean_batch": None if row.mean_batch is None else round(row.mean_batch, 3),
        "triton_call_ms": None if row.triton_ms is None else round(row.triton_ms, 3),
        "latency_ms": {"p50": ms(row.p50_s), "p99": ms(row.p99_s)},
        "dead_letters": round(sum(row.delta.dead_letters.values())),
        "dead_letters_by_class": {k: round(v) for k, v in sorted(row.delta.dead_letters.items()) if v},
    }
