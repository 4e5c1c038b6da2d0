"""Exactly-once delivery (``delivery: exactly_once``): a stage's outputs and the input offsets
they answer commit in one Kafka transaction, so a read_committed reader sees each output once.

**Units.** The transaction is per *unit*: an input partition, or, for a stage reading several
co-partitioned topics (a join: the range assignor gives one worker partition ``p`` of every
input), partition ``p`` of all of them, so a join's state and its merged result always commit
with the offsets of every branch that fed them. Each unit has its own transactional producer,
``transactional.id`` = ``<group>.<unit>``. aiokafka 0.14's ``send_offsets_to_transaction`` sends
TxnOffsetCommit v0, with no group generation (KIP-447), so a stable id per unit is what fences
a zombie: the unit's next owner starts a producer of the same id, whose InitProducerId bumps the
epoch and aborts the previous owner's open transaction; anything that owner sends or commits
later is refused by the broker (``ProducerFenced``), whatever our own membership lease decided.
That happens in :meth:`TransactionalOutbox.open_partitions`, before the unit's state is restored,
so a restore never waits behind (or reads) a zombie's open transaction.

**Commit.** A unit's outbox (:class:`UnitOutbox`) is the ordered outbox of
:mod:`pipeline.kafka.outbox` with one change, its commit: with nothing new handed to the producer
meanwhile, it waits until every output in the transaction is acknowledged, adds the offsets past
the acknowledged lines (``send_offsets_to_transaction``), commits, and begins the next. Every
output of the transaction then belongs to a record whose offset it commits: outputs leave from
the head of each line in order, and a sequence stage writes a checkpoint with every chunk under
exactly-once (coalesced checkpoints would hold slots past their outputs). A refused output, a
fenced producer or a failed commit stops the stage: its transaction is aborted (by the broker's
timeout or the next owner's start) and the records are replayed.

Outputs no input record owns (a join's expiries, a stream's idle close) join the transaction
of the unit of the partition they come from; a shadow model's copies have no unit and leave
through the stage's plain producer, at least once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, TopicPartition

from pipeline.kafka.checkpoint_group import CheckpointGroup
from pipeline.kafka.ordering import Slot
from pipeline.kafka.out_record import Outputs, OutRecord
from pipeline.kafka.outbox import Outbox, SlotTracer

log = logging.getLogger(__name__)

COMMIT_INTERVAL_S = 0.1
"""How often a unit commits its transaction: a result is visible downstream (read_committed)
only then, so each hop adds up to this much latency (Kafka Streams' exactly-once default)."""

TRANSACTION_TIMEOUT_MS = 20_000
"""The broker aborts a unit's transaction left open this long (a worker killed with nobody
taking its partitions over): read_committed readers of its outputs wait at most this."""


def unit_of(tp: TopicPartition, *, by_partition: bool) -> str:
    """The transaction unit of an input partition (see the module docstring)."""
    return str(tp.partition) if by_partition else f"{tp.topic}.{tp.partition}"


class UnitOutbox(Outbox):
    """One unit's ordered outbox, whose commit is its producer's transaction."""

    def __init__(
        self, producer: AIOKafkaProducer, consumer: AIOKafkaConsumer, *, group_id: str, **options: Any
    ) -> None:
        super().__init__(producer, consumer, **options)
        self._group_id = group_id

    async def send_unowned(self, records: list[OutRecord], partition: int | None = None) -> list[asyncio.Future[Any]]:
        """Into the open transaction, which does not commit before they are acknowledged."""
        async with self._emitting:
            futures = await super().send_unowned(records, partition)
            for fut in futures:
                self._delivery.add(fut)
                fut.add_done_callback(self._delivery.discard)
            return futures

    async def commit(self, partitions: list[TopicPartition] | None = None) -> None:
        """Commit the transaction with the offsets past its acknowledged outputs (``partitions``:
        the unit commits as one), then begin the next one."""
        async with self._emitting:  # nothing joins the transaction while it commits
            if self._fence.closed():
                return  # maybe a zombie: its transaction stays open; the unit's next owner aborts it
            while self._delivery:
                await asyncio.wait(set(self._delivery))
            if self._fence.closed():
                return  # the lease closed while the outputs were delivered: nothing commits late
            self.raise_if_failed()
            if self._sender.resending():
                raise RuntimeError("an output refused inside a transaction: the stage stops, the transaction aborts")
            committable = self._offsets.committable()
            producer = self._producer
            if committable:
                await producer.send_offsets_to_transaction(committable, self._group_id)
            await producer.commit_transaction()  # an empty one costs no request
            self._offsets.mark_committed(committable)
            await producer.begin_transaction()


#: Starts the transactional producer of a unit (its ``transactional.id`` suffix); the caller
#: has not begun a transaction yet.
StartProducer = Callable[[str], Awaitable[AIOKafkaProducer]]
#: Builds a unit's outbox around its producer.
NewOutbox = Callable[[AIOKafkaProducer], UnitOutbox]


@dataclass
class _Unit:
    producer: AIOKafkaProducer
    outbox: UnitOutbox
    partitions: set[TopicPartition] = field(default_factory=set)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class TransactionalOutbox:
    """The stage's outbox under exactly-once: one :class:`UnitOutbox` per transaction unit,
    each committing on its own; records and slots go to the unit of their partition."""

    def __init__(
        self, start_producer: StartProducer, new_outbox: NewOutbox, plain: Outbox, *, by_partition: bool
    ) -> None:
        self._start_producer = start_producer
        self._new_outbox = new_outbox
        self._plain = plain  # outputs of no unit (a shadow's copies), at least once
        self._by_partition = by_partition
        self._units: dict[str, _Unit] = {}
        self._of: dict[TopicPartition, UnitOutbox] = {}
        self._of_number: dict[int, UnitOutbox] = {}  # stateful stages: partition number -> unit
        self.groups = _Groups(self._of)

    # ------------------------------------------------------------------ units
    async def open_partitions(self, partitions: list[TopicPartition]) -> None:
        """Start the producers of the units these partitions open (fencing their previous
        owners), all at once, and begin their first transactions."""
        new = sorted({unit_of(tp, by_partition=self._by_partition) for tp in partitions} - set(self._units))
        started = await asyncio.gather(*[self._start_producer(unit) for unit in new], return_exceptions=True)
        if failed := [error for error in started if isinstance(error, BaseException)]:
            for producer in started:
                if isinstance(producer, AIOKafkaProducer):
                    await producer.stop()  # none left behind unclosed: the stage stops on the failure
            raise failed[0]
        for unit, producer in zip(new, started, strict=True):
            assert isinstance(producer, AIOKafkaProducer)
            await producer.begin_transaction()
            state = _Unit(producer, self._new_outbox(producer))
            state.task = asyncio.create_task(
                state.outbox.run(state.stop, COMMIT_INTERVAL_S), name=f"transaction-{unit}"
            )
            self._units[unit] = state
        for tp in partitions:
            state = self._units[unit_of(tp, by_partition=self._by_partition)]
            state.partitions.add(tp)
            self._of[tp] = self._of_number[tp.partition] = state.outbox

    async def close_partitions(self, partitions: list[TopicPartition] | None = None) -> None:
        """Close the units left with no partition (all when None): their loops and producers.
        Their transactions were committed by the hand-back (or are aborted by the broker)."""
        for tp in partitions if partitions is not None else list(self._of):
            state = self._units.get(unit_of(tp, by_partition=self._by_partition))
            if state is not None:
                state.partitions.discard(tp)
            self._of.pop(tp, None)
        for unit, state in list(self._units.items()):
            if state.partitions and partitions is not None:
                continue
            del self._units[unit]
            self._of_number = {n: o for n, o in self._of_number.items() if o is not state.outbox}
            state.stop.set()
            if state.task is not None:
                state.task.cancel()  # its work was flushed and committed by the hand-back
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await state.task
            await state.producer.stop()

    # ------------------------------------------------------------------ the outbox's face
    def track(self, record: ConsumerRecord[bytes, bytes], tracer: SlotTracer | None = None) -> Slot[Outputs]:
        return self._of[TopicPartition(record.topic, record.partition)].track(record, tracer)

    def complete(
        self, slot: Slot[Outputs], output: OutRecord | Outputs, *, group: CheckpointGroup | None = None
    ) -> None:
        unit = self._of.get(slot.tp)
        if unit is not None:  # else handed back meanwhile: its next owner redoes the record
            unit.complete(slot, output, group=group)

    def complete_all(self, slots: Sequence[Slot[Outputs]], outputs: Sequence[OutRecord]) -> None:
        by_unit: dict[UnitOutbox, tuple[list[Slot[Outputs]], list[OutRecord]]] = {}
        for slot, out in zip(slots, outputs, strict=True):
            if (unit := self._of.get(slot.tp)) is not None:
                mine, theirs = by_unit.setdefault(unit, ([], []))
                mine.append(slot)
                theirs.append(out)
        for unit, (mine, theirs) in by_unit.items():
            unit.complete_all(mine, theirs)

    def pending(self, tp: TopicPartition | None = None) -> int:
        if tp is not None:
            unit = self._of.get(tp)
            return unit.pending(tp) if unit is not None else 0
        return sum(state.outbox.pending() for state in self._units.values())

    def read_to(self, tp: TopicPartition, position: int) -> None:
        unit = self._of.get(tp)
        if unit is not None:
            unit.read_to(tp, position)

    def pending_bytes(self) -> int:
        return sum(state.outbox.pending_bytes() for state in self._units.values())

    def oldest_unfinished(self, now: float | None = None) -> dict[TopicPartition, float]:
        return {tp: age for state in self._units.values() for tp, age in state.outbox.oldest_unfinished(now).items()}

    def raise_if_failed(self) -> None:
        for state in self._units.values():
            state.outbox.raise_if_failed()
            if state.task is not None and state.task.done():
                state.task.result()  # a failed commit (fenced, refused) stops the stage
        self._plain.raise_if_failed()

    async def emit_ready(self) -> None:
        for state in list(self._units.values()):
            await state.outbox.emit_ready()

    async def send_unowned(self, records: list[OutRecord], partition: int | None = None) -> list[asyncio.Future[Any]]:
        """In the transaction of ``partition``'s unit; with no partition, through the plain producer."""
        if partition is None:
            return await self._plain.send_unowned(records)
        unit = self._of_number.get(partition)
        if unit is None:
            log.warning(
                "%d outputs of partition %d dropped: handed back meanwhile (its next owner redoes them)",
                len(records),
                partition,
            )
            return []
        return await unit.send_unowned(records)

    async def run(self, stop: asyncio.Event, commit_interval_s: float = COMMIT_INTERVAL_S) -> None:
        """Each unit runs its own loop (from :meth:`open_partitions`); this one only waits."""
        await stop.wait()

    async def flush(self, timeout_s: float) -> bool:
        done = await asyncio.gather(*[state.outbox.flush(timeout_s) for state in list(self._units.values())])
        return all(done)

    async def commit(self, partitions: list[TopicPartition] | None = None) -> None:
        units = {self._of[tp] for tp in partitions if tp in self._of} if partitions is not None else None
        for state in list(self._units.values()):
            if units is None or state.outbox in units:
                await state.outbox.commit()

    def forget(self, tp: TopicPartition) -> int:
        unit = self._of.get(tp)
        return unit.forget(tp) if unit is not None else 0


class _Groups:
    """Coalesced checkpoints (not used under exactly-once, where every chunk carries its
    checkpoint), closed in the unit of their slots."""

    def __init__(self, of: dict[TopicPartition, UnitOutbox]) -> None:
        self._of = of

    def close(self, group: CheckpointGroup, checkpoint: Sequence[Any]) -> None:
        if group.held and (unit := self._of.get(group.held[0].tp)) is not None:
            unit.groups.close(group, checkpoint)
