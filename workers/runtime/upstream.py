"""A stage's watch on the groups upstream of it: polled while it has something to decide.

A join asks whether a missing branch can still deliver; a sequence stage whether a quiet
stream's next chunk can still come from the stage before it. Both ask the same
:class:`~pipeline.kafka.progress.UpstreamProgress` (behind until proven caught up or
gone), on the same cadence, and publish the same gauge, so an operator reads one rule
for both (docs/streaming.md, "Behind until proven gone").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from pipeline.kafka.progress import BranchState, UpstreamProgress
from pipeline.observability.metrics import PipelineMetrics
from workers.runtime.event_time import LATE_GRACE_MS, EventTimeClock, FetchedAt, HighWater

log = logging.getLogger(__name__)

POLL_S = 0.5
"""How often, while there is something to decide, the upstream groups are asked."""


class UpstreamWatch:
    """Polls ``progress`` at most every ``every_s`` and keeps ``pipeline_upstream_state``."""

    def __init__(
        self,
        progress: UpstreamProgress,
        *,
        stage: str,
        metrics: PipelineMetrics,
        every_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.progress = progress
        self.stage = stage
        self.metrics = metrics
        self.every_s = every_s
        self.clock = clock
        self._last_poll: float | None = None
        self._polling: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.progress.start()

    async def stop(self) -> None:
        if self._polling is not None:
            self._polling.cancel()
            await asyncio.gather(self._polling, return_exceptions=True)
            self._polling = None
        await self.progress.stop()

    def state(self, branch: str, tp: TopicPartition) -> BranchState:
        return self.progress.state(branch, tp.partition)

    def poll(self, consumer: AIOKafkaConsumer | None, partitions: Iterable[TopicPartition]) -> None:
        """Ask the broker again, in the background, when ``every_s`` has passed since the last
        poll began and it has answered. A poll is six or more round trips to the broker
        (memberships, commits, ends, the fetches past a short listed end): awaited in the
        stage's sweep it held every record behind it, each half second. Until it answers,
        the states of the poll before stand (or "behind", before the first one)."""
        now = self.clock()
        if consumer is None or (self._polling is not None and not self._polling.done()):
            return
        if self._last_poll is not None and now - self._last_poll < self.every_s:
            return
        self._last_poll = now
        self._polling = asyncio.get_running_loop().create_task(self._poll(consumer, {tp.partition for tp in partitions}))

    async def settled(self) -> None:
        """Until the poll in flight, if any, has answered (tests, and a stage that must decide now)."""
        if self._polling is not None:
            await asyncio.gather(self._polling, return_exceptions=True)

    async def _poll(self, consumer: AIOKafkaConsumer, numbers: set[int]) -> None:
        try:
            await self.progress.poll(consumer, numbers)
        except Exception:  # a background task: its error must be seen, and the states stand
            log.exception("%s: polling the upstream groups failed", self.stage)
            return
        self.publish()

    def publish(self) -> None:
        for branch, state in self.progress.summary().items():
            label = branch or "input"
            for each in BranchState:
                self.metrics.upstream_state.labels(self.stage, label, each.value).set(1 if each is state else 0)


def highwater_or_end(highwater: HighWater, progress: UpstreamProgress) -> HighWater:
    """The fetcher's high watermark, or the last poll's end of the partition when that is
    further: on the embedded broker both can be short of the log, and the poll reads past
    its listed end (:func:`pipeline.kafka.progress.fetched_ends`)."""

    def end(tp: TopicPartition) -> int | None:
        ends = [e for e in (highwater(tp), progress.end(tp)) if e is not None]
        return max(ends) if ends else None

    return end


def watched_clock(
    progress: UpstreamProgress,
    highwater: HighWater,
    *,
    stage: str,
    metrics: PipelineMetrics,
    grace_ms: float,
    fetched_at: FetchedAt,
    branch_of: Callable[[TopicPartition], str] = lambda _tp: "",
) -> tuple[UpstreamWatch, EventTimeClock]:
    """The watch on ``progress`` and an event-time clock whose partitions are behind while
    the branch writing them (``branch_of``) is: the one rule joins and sequence stages share.
    Without upstream groups the clock judges the stage's own reading alone."""
    watch = UpstreamWatch(progress, stage=stage, metrics=metrics)
    position = (lambda tp: progress.position(branch_of(tp), tp.partition)) if progress.branches else None
    clock = EventTimeClock(
        highwater_or_end(highwater, progress),
        grace_ms=grace_ms,
        fetched_at=fetched_at,
        upstream_position=position,
        late_grace_ms=LATE_GRACE_MS,
    )
    return watch, clock
