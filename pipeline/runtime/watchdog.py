"""The per-partition watchdog: how long has each partition's oldest record gone unfinished?

A record is *unfinished* from the moment it is consumed until the broker has
acknowledged its outcome (result or dead letter); the outbox keeps each
partition's records in a line, so the line's head is the oldest unfinished one
(:meth:`pipeline.kafka.outbox.Outbox.oldest_unfinished`). A head that does not
move is a wedged partition, whatever the cause (a hung Triton, a stuck DALI run,
a lost task): the age is exported as
``pipeline_oldest_unfinished_record_age_seconds{stage,topic,partition}``, and an
age past the stage's ``stall_after_s`` makes ``/readyz`` answer 503, naming the
stage and partition, until the line moves again. ``pipeline_stage_ready{stage}`` is
each stage's share of that answer (1: consuming and no partition stalled), so an
alert can name the stage that took the process out of service.

Liveness is a separate question (:class:`Liveness`): a stalled partition is a
reason to take the process out of service, not to restart it (the stall is
usually outside it); a dead stage task is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.observability.metrics import PipelineMetrics
from workers.runtime.stream_stage import StreamStage


@dataclass(frozen=True)
class Stall:
    """One partition whose oldest unfinished record is older than its stage allows."""

    stage: str
    topic: str
    partition: int
    age_s: float
    limit_s: float

    def describe(self) -> str:
        return (
            f"stage {self.stage}: partition {self.topic}-{self.partition} has a record "
            f"unfinished for {self.age_s:.1f}s (limit {self.limit_s:g}s)"
        )


class Watchdog:
    """Ages of the oldest unfinished record per stage and partition; the gauge and the stalls."""

    def __init__(self, stages: Sequence[StreamStage], metrics: PipelineMetrics) -> None:
        self._stages = stages
        self._gauge = metrics.oldest_unfinished_age
        self._ready = metrics.stage_ready
        self._labelled: set[tuple[str, str, str]] = set()

    def check(self) -> list[Stall]:
        """Refresh the gauge (dropping partitions no longer held) and return the stalls."""
        stalls: list[Stall] = []
        seen: set[tuple[str, str, str]] = set()
        for stage in self._stages:
            limit = stage.io.stall_after_s
            stalled = False
            for tp, age in sorted(stage.oldest_unfinished().items()):
                labels = (stage.io.stage, tp.topic, str(tp.partition))
                self._gauge.labels(*labels).set(age)
                seen.add(labels)
                if age > limit:
                    stalled = True
                    stalls.append(Stall(stage.io.stage, tp.topic, tp.partition, age, limit))
            self._ready.labels(stage.io.stage).set(1 if stage.ready and not stalled else 0)
        for labels in self._labelled - seen:
            with contextlib.suppress(KeyError):
                self._gauge.remove(*labels)
        self._labelled = seen
        return stalls

    async def run(self, stop: asyncio.Event, interval_s: float = 1.0) -> None:
        """Refresh the gauge every ``interval_s`` (scrapes and ``/readyz`` refresh it too)."""
        while not stop.is_set():
            self.check()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)


class Liveness:
    """Alive unless a task that should run until shutdown has ended before it was asked to.

    A stuck event loop cannot answer at all: the health endpoints are served on it,
    so the probe's own timeout is what fails (Kubernetes counts a timeout as a failure).
    """

    def __init__(self, stop: asyncio.Event) -> None:
        self._stop = stop
        self._tasks: list[asyncio.Task[None]] = []

    def watch(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        self._tasks.extend(tasks)

    def problems(self) -> list[str]:
        if self._stop.is_set():
            return []  # shutting down: tasks end on purpose while they drain
        problems = []
        for task in self._tasks:
            if not task.done():
                continue
            if task.cancelled():
                problems.append(f"task {task.get_name()} was cancelled")
            else:
                exc = task.exception()
                problems.append(f"task {task.get_name()} ended" + (f": {exc!r}" if exc else ""))
        return problems
