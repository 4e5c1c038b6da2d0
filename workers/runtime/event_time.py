"""Event time per input partition: how far each partition's records have come.

Windows and idle timeouts are judged in *event time* (record timestamps), not by
when records happen to arrive: after a Triton outage, a pause, or a worker far
behind, a backlog of old records must not close joins or streams that were alive
when those records were written.

The watermark of a partition is the timestamp of the last record handled from
it, or "now" when nothing is left to read (a caught-up partition cannot bring
anything older). Right after an assignment, a partition nothing was read from
counts as behind for ``grace_ms``, so its backlog is read before it is trusted, and
after that for as long as its end is past where the group's reading starts (its
committed offset, ``reading_starts``).
A partition written by other stages is caught up only when they are too
(``upstream_position``: a join's branches, a sequence stage's input), or gone
(:mod:`pipeline.kafka.progress`): what they have not processed yet is older than
what was read. While they are behind, the partition's watermark is their *position*,
the event time of the oldest record they have left to finish, less ``late_grace_ms``
(room for records their producers stamped out of order), and never past what this
stage has read of the partition. Not what they have delivered: a stage redoing records
after a rebalance appends their outputs after later ones (issue 28). A partition the broker has not answered a fetch for
in ``stale_ms`` (unreachable, paused) is behind too: its end offset is old news, and
records stamped during the silence may be waiting there. Once the broker answers
again the partition is read for ``grace_ms`` before it is trusted, as after an
assignment: the stages upstream were cut off as well, and what they still have to
deliver is older than now. So a broker outage does not age streams or windows by
the wall clock. Messages between stages keep their request's
timestamp, so every stage of a topology judges in the same event time.
Timestamps more than ``max_future_ms`` ahead of the wall clock are clamped: one
record stamped next year must not close every window at once, nor open one that
never closes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from pipeline.kafka.records import ConsumedRecord

log = logging.getLogger(__name__)

HighWater = Callable[[TopicPartition], int | None]
FetchedAt = Callable[[TopicPartition], int | None]
"""When the broker last answered a fetch for the partition (ms, wall clock; None: never)."""

LATE_GRACE_MS = 1_000.0
"""How far out of timestamp order records of one partition may be (their producers'
clocks, a retried batch) when a behind upstream's outputs are taken as its position."""

FETCH_STALE_MS = 5_000.0
"""Fetches answer within the fetch wait (25 ms) when healthy; silence this long means
the end offset is no longer known."""


def now_ms() -> int:
    return int(time.time() * 1000)


class EventTimeClock:
    """Watermarks of the input partitions one stage consumes."""

    def __init__(
        self,
        highwater: HighWater,
        *,
        grace_ms: float,
        max_future_ms: float = 60_000,
        upstream_position: Callable[[TopicPartition], int | None] | None = None,
        fetched_at: FetchedAt | None = None,
        stale_ms: float = FETCH_STALE_MS,
        late_grace_ms: float = 0.0,
    ) -> None:
        self.highwater = highwater
        self.fetched_at = fetched_at
        self.stale_ms = stale_ms
        self.upstream_position = upstream_position
        """tp -> None while the stages writing it are not behind, else their position (ms)."""
        self.late_grace_ms = late_grace_ms
        self.grace_ms = grace_ms
        self.max_future_ms = max_future_ms
        self._event_time: dict[TopicPartition, int] = {}
        self._last_offset: dict[TopicPartition, int] = {}
        self._assigned_at: dict[TopicPartition, int] = {}
        self._trusted_from: dict[TopicPartition, int] = {}
        self._start: dict[TopicPartition, int] = {}
        self._last_watch: int | None = None

    def timestamp(self, record: ConsumedRecord) -> int:
        """The record's event time, clamped to at most ``max_future_ms`` ahead of now."""
        return min(record.timestamp, now_ms() + int(self.max_future_ms))

    def observe(self, record: ConsumedRecord) -> int:
        """A record of its partition was handled; returns its (clamped) event time."""
        tp = TopicPartition(record.topic, record.partition)
        stamp = self.timestamp(record)
        self._event_time[tp] = max(stamp, self._event_time.get(tp, stamp))
        self._last_offset[tp] = record.offset
        return stamp

    def assigned(self, partitions: Iterable[TopicPartition], starts: Mapping[TopicPartition, int] | None = None) -> None:
        """The partitions are ours from now; ``starts``: where their reading begins (the
        group's committed offset). A partition nothing was read from is behind for
        ``grace_ms``, and after that while its end is past its start: without the start, a
        join that had read nothing of a branch partition 5,035 records long took it as read
        (backlog test, 2026-11-27)."""
        at = now_ms()
        for tp in partitions:
            self._assigned_at[tp] = at
            if starts is not None and tp in starts:
                self._start[tp] = starts[tp]

    def forget(self, numbers: set[int]) -> None:
        for table in (self._event_time, self._last_offset, self._assigned_at, self._trusted_from, self._start):
            for tp in [tp for tp in table if tp.partition in numbers]:
                del table[tp]

    def watch(self, partitions: Iterable[TopicPartition]) -> None:
        """Look at the partitions' fetches now; the stage calls this every sweep, so a silence
        of the broker is noticed even while nothing asks for a watermark. A stage that could
        not sweep for ``stale_ms`` (its membership fence held it through a broker outage)
        saw nothing of that time: its partitions are read for ``grace_ms`` before trusted."""
        now = now_ms()
        unseen = self._last_watch is not None and now - self._last_watch > self.stale_ms
        self._last_watch = now
        for tp in partitions:
            if unseen:
                self._trusted_from[tp] = now + int(self.grace_ms)
            self._answering(tp, now)

    def watermark(self, partitions: Iterable[TopicPartition]) -> int:
        """Event time every one of ``partitions`` has reached (the minimum)."""
        now = now_ms()
        return min(self._mark(tp, now) for tp in partitions)

    def caught_up(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` counts as "now": read to its end, its writers caught up or gone."""
        return not self._behind(tp, now_ms())

    def explain(self, tp: TopicPartition) -> str:
        """The partition as the clock sees it (logged when a window closes on it)."""
        return (
            f"{tp.topic}[{tp.partition}]: last read {self._last_offset.get(tp)}, start {self._start.get(tp)}, "
            f"end {self.highwater(tp)}, event time {self._event_time.get(tp)}"
        )

    def _mark(self, tp: TopicPartition, now: int) -> int:
        read = now if not self._read_behind(tp, now) else self._event_time.get(tp, 0)
        position = self._upstream(tp)
        if position is None:
            return read
        return min(read, min(position, now + int(self.max_future_ms)) - int(self.late_grace_ms))

    def _upstream(self, tp: TopicPartition) -> int | None:
        return None if self.upstream_position is None else self.upstream_position(tp)

    def since_s(self, event_ms: int, partitions: Iterable[TopicPartition]) -> float:
        """Seconds of event time between ``event_ms`` and the partitions' watermark."""
        return max(0.0, (self.watermark(partitions) - event_ms) / 1000)

    def _behind(self, tp: TopicPartition, now: int) -> bool:
        return self._upstream(tp) is not None or self._read_behind(tp, now)

    def _read_behind(self, tp: TopicPartition, now: int) -> bool:
        """Whether this stage has more of ``tp`` to read (or cannot know: the broker silent)."""
        if not self._answering(tp, now):
            return True
        last = self._last_offset.get(tp)
        if last is None:
            if now - self._assigned_at.get(tp, 0) < self.grace_ms:
                return True
            # Nothing read yet: behind while the end is past where reading starts; a start
            # not known (reading_starts failed) counts as the first offset, never as "read".
            last = self._start.get(tp, 0) - 1
        high = self.highwater(tp)
        return high is not None and high > last + 1

    def _answering(self, tp: TopicPartition, now: int) -> bool:
        """Whether the broker answers fetches for ``tp`` and has for ``grace_ms`` since its
        last silence; a silence seen now is noted (the grace starts again)."""
        if self.fetched_at is None:
            return True
        at = self.fetched_at(tp)
        if at is None or now - at > self.stale_ms:
            self._trusted_from[tp] = now + int(self.grace_ms)  # silent: trusted grace_ms after it answers
            return False
        return now >= self._trusted_from.get(tp, 0)


async def reading_starts(consumer: AIOKafkaConsumer | None, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
    """Where a group's reading of ``partitions`` begins: its committed offsets, or the
    partition's beginning where it never committed (the consumers reset to the earliest).
    Unknown (no consumer, the broker not answering): left out, and the clock counts from 0."""
    if not partitions:
        return {}
    if consumer is None:
        log.warning("where reading starts on %s is unknown (no consumer yet): their ends count from offset 0", partitions)
        return {}
    try:
        starts: dict[TopicPartition, int] = {}
        for tp in partitions:
            committed = await consumer.committed(tp)
            if committed is not None and committed >= 0:
                starts[tp] = committed
        never = [tp for tp in partitions if tp not in starts]
        if never:
            starts.update(await consumer.beginning_offsets(never))
        return starts
    except KafkaError as exc:
        log.warning("where reading starts on %s is unknown (%r): their ends count from offset 0", partitions, exc)
        return {}
