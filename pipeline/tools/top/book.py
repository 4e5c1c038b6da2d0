"""The latest snapshots per process, merged into one frame of per-stage rows.

Each process (snapshot key ``host:pid``) keeps its last two snapshots. The
*window* of a process is the time between them; rates, latency percentiles, mean
batch size and Triton time are over that window (what is happening now, not since
start), summed or merged over the processes serving a stage. A process seen once
has a window from its start (``process_start_time_seconds``, zero counters then).
A process that restarted under the same key (a container's pid 1) shows counters
going back: its window restarts the same way.

A process whose newest snapshot is older than ``STALE_INTERVALS`` metrics intervals
is *stale* (stopped, crashed, or cut off from Kafka): it is named in the header and
left out of the rows, whose gauges (lag, pending) would otherwise be frozen values.
Totals (requests, results, dead letters) are since each live process started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.tools.top.snapshot import Snapshot
from pipeline.tools.top.window import StageRow, Window, between, merge, since_start

__all__ = ["STALE_INTERVALS", "Frame", "ProcessStatus", "SnapshotBook", "StageRow"]

STALE_INTERVALS = 3


@dataclass(frozen=True)
class ProcessStatus:
    process: str
    age_s: float
    stale: bool
    stages: tuple[str, ...]


@dataclass(frozen=True)
class Frame:
    topology: str
    processes: tuple[ProcessStatus, ...]
    rows: tuple[StageRow, ...]
    newest_age_s: float | None
    skipped: int
    """Records on the topic that were not snapshots."""

    @property
    def stale(self) -> tuple[ProcessStatus, ...]:
        return tuple(p for p in self.processes if p.stale)


@dataclass
class SnapshotBook:
    """Snapshots of one topology's processes, as read from the metrics topic."""

    topology: str
    metrics_interval_s: float
    skipped: int = 0
    _latest: dict[str, Snapshot] = field(default_factory=dict)
    _previous: dict[str, Snapshot] = field(default_factory=dict)

    def add(self, snapshot: Snapshot | None) -> None:
        """Keep ``snapshot`` if it is this topology's and newer than its process's last one."""
        if snapshot is None:
            self.skipped += 1
            return
        if snapshot.topology != self.topology:
            return  # the metrics topic may be shared by several topologies
        last = self._latest.get(snapshot.process)
        if last is not None and snapshot.timestamp_ms <= last.timestamp_ms:
            return
        if last is not None:
            self._previous[snapshot.process] = last
        self._latest[snapshot.process] = snapshot

    def frame(self, now_ms: int) -> Frame:
        """The per-stage rows as of ``now_ms`` (wall clock, as the snapshots' timestamps)."""
        stale_after_ms = STALE_INTERVALS * self.metrics_interval_s * 1000
        statuses = []
        per_stage: dict[str, list[Window]] = {}
        for process, latest in sorted(self._latest.items()):
            windows = self._windows(latest, self._previous.get(process))
            age_ms = max(0, now_ms - latest.timestamp_ms)
            stale = age_ms > stale_after_ms
            statuses.append(ProcessStatus(process, age_ms / 1000, stale, tuple(sorted(windows))))
            if not stale:
                for stage, window in windows.items():
                    per_stage.setdefault(stage, []).append(window)
        newest = max((s.timestamp_ms for s in self._latest.values()), default=None)
        return Frame(
            topology=self.topology,
            processes=tuple(statuses),
            rows=tuple(merge(stage, windows) for stage, windows in sorted(per_stage.items())),
            newest_age_s=None if newest is None else max(0, now_ms - newest) / 1000,
            skipped=self.skipped,
        )

    @staticmethod
    def _windows(latest: Snapshot, previous: Snapshot | None) -> dict[str, Window]:
        windows = None if previous is None else between(previous, latest)
        return since_start(latest) if windows is None else windows
