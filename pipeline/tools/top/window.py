"""What one process did between two of its snapshots, and those windows merged per stage.

Shared by ``pipeline top`` (:mod:`.book`: a process's last two snapshots, what is
happening now) and ``pipeline bench`` (:mod:`pipeline.tools.bench.stages`: the
snapshots inside one load step, what the stages saw during it), so both read
rates, percentiles, batch sizes and Triton times the same way.

Counters only grow while a process lives, so a difference is only meaningful
between two snapshots of the same process run: :func:`between` answers None when
the process restarted in between (another start time, or a counter went back).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.tools.top.histogram import quantile
from pipeline.tools.top.snapshot import Snapshot
from pipeline.tools.top.stage_totals import StageTotals, stage_totals


@dataclass(frozen=True)
class Window:
    """One process's view of one stage: its totals now and what changed over ``seconds``."""

    now: StageTotals
    delta: StageTotals
    seconds: float | None


@dataclass(frozen=True)
class StageRow:
    """One stage, over its processes' windows."""

    stage: str
    processes: int
    rate: float | None
    """Requests consumed per second over the window (None: no window yet)."""
    totals: StageTotals
    """Since each process started: requests, results, dead letters; lag and pending now."""
    delta: StageTotals
    """What changed over the window, summed over the processes (requests, dead letters...)."""
    window_s: float | None
    """The longest process window, in seconds (None: no window of known length)."""
    p50_s: float | None
    p99_s: float | None
    """End-to-end latency percentiles over the window (None: nothing finished in it)."""
    mean_batch: float | None
    triton_ms: float | None
    """Mean duration of one Triton call over the window, in milliseconds."""


def between(earlier: Snapshot, later: Snapshot) -> dict[str, Window] | None:
    """Per stage, what ``later``'s process did since ``earlier``; None when it restarted in between."""
    now = stage_totals(later)
    before = stage_totals(earlier)
    if earlier.start_time_ms() != later.start_time_ms() or any(
        totals.went_back(before[stage]) for stage, totals in now.items() if stage in before
    ):
        return None
    seconds = (later.timestamp_ms - earlier.timestamp_ms) / 1000
    return {stage: Window(t, t.minus(before.get(stage, StageTotals())), seconds) for stage, t in now.items()}


def since_start(latest: Snapshot) -> dict[str, Window]:
    """Per stage, everything since the process started (zero counters then)."""
    start = latest.start_time_ms()
    seconds = None if start is None else (latest.timestamp_ms - start) / 1000
    return {stage: Window(t, t, seconds) for stage, t in stage_totals(latest).items()}


def merge(stage: str, windows: list[Window]) -> StageRow:
    """One row for ``stage``: counters and histograms added up over its processes' windows."""
    now = sum((w.now for w in windows), StageTotals())
    delta = sum((w.delta for w in windows), StageTotals())
    rates = [w.delta.requests / w.seconds for w in windows if w.seconds is not None and w.seconds > 0]
    seconds = [w.seconds for w in windows if w.seconds is not None]
    triton_s = delta.triton.value()
    return StageRow(
        stage=stage,
        processes=len(windows),
        rate=sum(rates) if rates else None,
        totals=now,
        delta=delta,
        window_s=max(seconds) if seconds else None,
        p50_s=quantile(0.5, delta.latency),
        p99_s=quantile(0.99, delta.latency),
        mean_batch=delta.batch.value(),
        triton_ms=None if triton_s is None else triton_s * 1000,
    )
