"""What one process reports about one stage, picked out of its snapshot.

Counters and histograms only grow while a process lives, so the difference between
two snapshots of one process is what happened in between (:meth:`StageTotals.minus`);
gauges (lag, pending) are read as they are. The names are the series of
:class:`pipeline.observability.metrics.PipelineMetrics`; a stage kind that never
touches one (a DALI stage has no Triton call) simply reports zero for it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from pipeline.tools.top.histogram import Buckets
from pipeline.tools.top.snapshot import Snapshot

REQUESTS = "pipeline_requests_total"
RESULTS = "pipeline_results_total"
DEAD_LETTERS = "pipeline_dead_letters_total"
GROUP_LAG = "pipeline_consumer_group_lag"
PENDING = "pipeline_pending_requests"
BATCH = "pipeline_batch_size"
TRITON = "pipeline_triton_request_duration_seconds"
LATENCY = "pipeline_end_to_end_latency_seconds"
UPSTREAM_STATE = "pipeline_upstream_state"
_STATE_ORDER = ("caught-up", "behind", "gone")
"""A join's branch over several processes: the worst state any of them sees."""


def _worse(a: str | None, b: str) -> str:
    return b if a is None or _STATE_ORDER.index(b) > _STATE_ORDER.index(a) else a


@dataclass(frozen=True)
class Mean:
    """A histogram's ``_sum`` and ``_count``: their ratio is the mean observation."""

    total: float = 0.0
    count: float = 0.0

    def __add__(self, other: Mean) -> Mean:
        return Mean(self.total + other.total, self.count + other.count)

    def minus(self, earlier: Mean) -> Mean:
        return Mean(self.total - earlier.total, self.count - earlier.count)

    def value(self) -> float | None:
        return self.total / self.count if self.count > 0 else None


@dataclass(frozen=True)
class StageTotals:
    """One stage's numbers in one snapshot (or a difference of two, or a sum over processes)."""

    requests: float = 0.0
    results: float = 0.0
    dead_letters: dict[str, float] = field(default_factory=dict)
    lag: float = 0.0
    pending: float = 0.0
    batch: Mean = field(default_factory=Mean)
    triton: Mean = field(default_factory=Mean)
    latency: Buckets = field(default_factory=Buckets)
    branches: dict[str, str] = field(default_factory=dict)
    """A join's branches (a sequence stage's upstream: "input") -> behind, caught-up or gone."""

    def __add__(self, other: StageTotals) -> StageTotals:
        dead: dict[str, float] = defaultdict(float, self.dead_letters)
        for error_class, count in other.dead_letters.items():
            dead[error_class] += count
        branches = dict(self.branches)
        for branch, state in other.branches.items():
            branches[branch] = _worse(branches.get(branch), state)
        return StageTotals(
            requests=self.requests + other.requests,
            results=self.results + other.results,
            dead_letters=dict(dead),
            lag=self.lag + other.lag,
            pending=self.pending + other.pending,
            batch=self.batch + other.batch,
            triton=self.triton + other.triton,
            latency=self.latency + other.latency,
            branches=branches,
        )

    def minus(self, earlier: StageTotals) -> StageTotals:
        """Counters and histograms since ``earlier``; gauges (lag, pending) as they are now."""
        return StageTotals(
            requests=self.requests - earlier.requests,
            results=self.results - earlier.results,
            dead_letters={k: v - earlier.dead_letters.get(k, 0.0) for k, v in self.dead_letters.items()},
            lag=self.lag,
            pending=self.pending,
            batch=self.batch.minus(earlier.batch),
            triton=self.triton.minus(earlier.triton),
            latency=self.latency.minus(earlier.latency),
            branches=self.branches,
        )

    def went_back(self, earlier: StageTotals) -> bool:
        """A counter smaller than before: the process restarted under the same key."""
        return self.requests < earlier.requests or self.results < earlier.results or (
            self.latency.total < earlier.latency.total
        )


def stage_totals(snapshot: Snapshot) -> dict[str, StageTotals]:
    """Per stage label, that stage's totals in ``snapshot``."""
    acc: dict[str, _Acc] = defaultdict(_Acc)
    for sample in snapshot.samples:
        stage = sample.labels.get("stage")
        if stage is not None:
            acc[stage].add(sample.name, sample.labels, sample.value)
    return {stage: a.totals() for stage, a in acc.items()}


@dataclass
class _Acc:
    """Sums samples of one stage as they stream past (several models, groups, error classes)."""

    scalars: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    dead_letters: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    latency: list[tuple[float, float]] = field(default_factory=list)
    branches: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        if name == UPSTREAM_STATE:
            if value >= 1 and labels.get("state") in _STATE_ORDER:
                self.branches[labels.get("branch", "?")] = labels["state"]
        elif name == DEAD_LETTERS:
            self.dead_letters[labels.get("error_class", "?")] += value
        elif name == f"{LATENCY}_bucket":
            self.latency.append((float(labels.get("le", "+Inf")), value))
        else:
            self.scalars[name] += value

    def totals(self) -> StageTotals:
        s = self.scalars
        return StageTotals(
            requests=s[REQUESTS],
            results=s[RESULTS],
            dead_letters=dict(self.dead_letters),
            lag=s[GROUP_LAG],
            pending=s[PENDING],
            batch=Mean(s[f"{BATCH}_sum"], s[f"{BATCH}_count"]),
            triton=Mean(s[f"{TRITON}_sum"], s[f"{TRITON}_count"]),
            latency=Buckets.from_pairs(self.latency),
            branches=dict(self.branches),
        )
