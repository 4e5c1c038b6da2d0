"""Per-partition ordering and commit bookkeeping for at-least-once processing.

Every consumed record gets a :class:`Slot` in its partition's queue, in offset
order. Work on records finishes out of order (batches, retries), but outputs
leave a partition's queue strictly from the head, so results are produced in
the order requests arrived. A slot becomes *acknowledged* once the broker has
confirmed its output record (result or dead letter); the committable offset of
a partition is the offset of its first unacknowledged slot. A crash therefore
replays everything not yet acknowledged and loses nothing.

Pure bookkeeping: no I/O, no asyncio, unit-tested on its own.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from aiokafka.structs import TopicPartition

T = TypeVar("T")


class SlotTrace(Protocol[T]):
    """What traces a slot (``pipeline.observability.record_trace.RecordTrace``): told when
    the slot gets its output (and may stamp it) and when the broker acknowledged it."""

    def completed(self, output: T) -> T: ...

    def acknowledged(self) -> None: ...


@dataclass(eq=False)
class Slot(Generic[T]):
    """One consumed record's place in line: its offset and, once ready, its output."""

    tp: TopicPartition
    offset: int
    output: T | None = None
    emitted: bool = False
    acknowledged: bool = False
    tracked_at: float = field(default_factory=time.monotonic)
    size: int = 0
    """Bytes the consumed record holds (key and value): backpressure counts bytes too."""
    """When the record was consumed (monotonic): the watchdog's age of an unfinished record."""
    trace: SlotTrace[T] | None = None
    """The record's spans when tracing is on (None: off)."""

    @property
    def ready(self) -> bool:
        return self.output is not None


@dataclass
class _PartitionLine(Generic[T]):
    slots: deque[Slot[T]] = field(default_factory=deque)
    next_emit: int = 0  # index into `slots` of the first slot not yet emitted
    commit_point: int | None = None  # offset after the last acknowledged head slot
    committed: int | None = None  # what was last committed


class OrderedOffsets(Generic[T]):
    """Slots of every assigned partition; tells what may be emitted and committed."""

    def __init__(self) -> None:
        self._lines: dict[TopicPartition, _PartitionLine[T]] = {}
        self._bytes = 0

    def add(self, tp: TopicPartition, offset: int, size: int = 0) -> Slot[T]:
        line = self._lines.setdefault(tp, _PartitionLine())
        if line.slots and offset <= line.slots[-1].offset:
            raise ValueError(f"{tp}: offset {offset} is not after {line.slots[-1].offset}")
        slot: Slot[T] = Slot(tp, offset, size=size)
        line.slots.append(slot)
        self._bytes += size
        return slot

    def pending_bytes(self) -> int:
        """Bytes of the records whose slots are not yet acknowledged (all partitions)."""
        return self._bytes

    def pending(self, tp: TopicPartition | None = None) -> int:
        """Slots not yet acknowledged, in one partition or in all."""
        if tp is not None:
            line = self._lines.get(tp)
            return len(line.slots) if line else 0
        return sum(len(line.slots) for line in self._lines.values())

    def emittable(self, tp: TopicPartition) -> Iterator[Slot[T]]:
        """Ready slots at the head of ``tp``'s line not yet emitted, in order; marks them emitted."""
        line = self._lines.get(tp)
        if line is None:
            return
        while line.next_emit < len(line.slots) and line.slots[line.next_emit].ready:
            slot = line.slots[line.next_emit]
            slot.emitted = True
            line.next_emit += 1
            yield slot

    def acknowledge(self, slot: Slot[T]) -> None:
        """The broker confirmed the slot's output; pop acknowledged slots off the head."""
        slot.acknowledged = True
        self._pop_acknowledged(slot.tp)

    def acknowledge_all(self, slots: list[Slot[T]]) -> None:
        """:meth:`acknowledge` for many slots at once (a record batch's, from any lines): the
        heads of the lines they are in are popped once, after all are marked."""
        touched: set[TopicPartition] = set()
        for slot in slots:
            slot.acknowledged = True
            touched.add(slot.tp)
        for tp in touched:
            self._pop_acknowledged(tp)

    def _pop_acknowledged(self, tp: TopicPartition) -> None:
        line = self._lines.get(tp)
        if line is None:
            return  # the partition was revoked meanwhile: its new owner replays it
        while line.slots and line.slots[0].acknowledged:
            done = line.slots.popleft()
            self._bytes -= done.size
            line.next_emit -= 1
            line.commit_point = done.offset + 1

    def committable(self) -> dict[TopicPartition, int]:
        """Per partition, the next offset to consume, where it moved since the last commit."""
        return {
            tp: line.commit_point
            for tp, line in self._lines.items()
            if line.commit_point is not None and line.commit_point != line.committed
        }

    def read_to(self, tp: TopicPartition, position: int) -> None:
        """Every record of ``tp`` before ``position`` was added: an empty line may commit up to it
        (offsets that hold no record: transaction markers, aborted records)."""
        line = self._lines.setdefault(tp, _PartitionLine())
        if not line.slots and (line.commit_point is None or position > line.commit_point):
            line.commit_point = position

    def mark_committed(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            if tp in self._lines:
                self._lines[tp].committed = offset

    def forget(self, tp: TopicPartition) -> list[Slot[T]]:
        """Drop a revoked partition's line, returning its unacknowledged slots."""
        line = self._lines.pop(tp, None)
        if line is None:
            return []
        self._bytes -= sum(slot.size for slot in line.slots)
        return list(line.slots)

    def partitions(self) -> list[TopicPartition]:
        return list(self._lines)

    def head_ages(self, now: float) -> dict[TopicPartition, float]:
        """Per line, the age (s) at ``now`` of its oldest unacknowledged slot (0 when none)."""
        ages: dict[TopicPartition, float] = {}
        for tp in self.partitions():
            head = self.oldest(tp)
            ages[tp] = 0.0 if head is None else max(0.0, now - head.tracked_at)
        return ages

    def oldest(self, tp: TopicPartition) -> Slot[T] | None:
        """The partition's oldest unacknowledged slot (its line's head), if any."""
        line = self._lines.get(tp)
        return line.slots[0] if line is not None and line.slots else None
