"""One emit pass's outputs as one record batch per destination partition.

aiokafka's per-record ``send`` costs a coroutine, a partitioner call, an append and a
delivery future per record (and the outbox a callback per future); its batch API
(``create_batch`` / ``send_batch``) costs one of each per batch. ``benchmarks.stage_costs``
measured the per-record path at several times the batch path per record, the largest
single cost of the stateless stage's hot path. So the outbox appends the outputs of every
slot ready in one pass to a :class:`BatchBuilder` per destination partition and hands each
builder to the producer once, with one delivery future for all its slots.

Order: a partition line's outputs are appended in slot order, and a builder leaves
before any output the outbox sends alone (``flush``), so a destination partition receives
them in the order the per-record path would give. The destination partition is the one
``send`` would pick (the producer's own partitioner on the record key). Anything this
module declines (``add`` returns False: a record too large to share a batch, an unknown
topic) goes the per-record way, with its size checks and claim checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.structs import TopicPartition

from pipeline.kafka.ordering import Slot

#: Outputs larger than this (key and value) are sent alone: a large record should
#: neither fill a shared batch nor, refused by the broker, take its batch-mates down with it.
BATCHABLE_BYTES = 64 * 1024


class Batchable(Protocol):
    """What an output record offers (``pipeline.kafka.outbox.OutRecord``)."""

    @property
    def topic(self) -> str: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> list[tuple[str, bytes]]: ...
    @property
    def partition(self) -> int | None: ...
    @property
    def timestamp_ms(self) -> int | None: ...


#: Told of each builder handed to the producer: its delivery future and the slots it carries.
OnSent = Callable[["asyncio.Future[Any]", list[Slot[Any]]], None]


@dataclass(eq=False)
class _Open:
    builder: BatchBuilder
    riders: list[Slot[Any]] = field(default_factory=list)


class RecordBatches:
    """The builders of one emit pass, one per destination partition."""

    def __init__(self, producer: AIOKafkaProducer, on_sent: OnSent) -> None:
        self._producer = producer
        self._on_sent = on_sent
        self._open: dict[TopicPartition, _Open] = {}
        self._layouts: dict[str, tuple[list[int], list[int]]] = {}  # topic -> (all, available) partitions

    async def add(self, out: Batchable, slot: Slot[Any]) -> bool:
        """Append ``out`` (``slot``'s only output) to its partition's builder; False when
        it must be sent alone instead."""
        if _size(out) > BATCHABLE_BYTES:
            return False
        partition = await self._partition(out)
        if partition is None:
            return False
        tp = TopicPartition(out.topic, partition)
        stamp = out.timestamp_ms if out.timestamp_ms and out.timestamp_ms > 0 else None
        for _ in range(2):
            open_ = self._open.get(tp)
            if open_ is None:
                open_ = self._open[tp] = _Open(self._producer.create_batch())
            if open_.builder.append(timestamp=stamp, key=out.key, value=out.value, headers=out.headers) is not None:
                open_.riders.append(slot)
                return True
            await self._send(tp)  # full: it leaves now, the record starts the next one
        return False

    async def flush(self) -> None:
        """Hand every open builder to the producer (before an output sent alone, and at the
        end of the pass)."""
        for tp in list(self._open):
            await self._send(tp)

    async def _send(self, tp: TopicPartition) -> None:
        open_ = self._open.pop(tp)
        if not open_.riders:
            return
        open_.builder.close()  # or a per-record send() to this partition could join it
        delivery = await self._producer.send_batch(open_.builder, tp.topic, partition=tp.partition)
        self._on_sent(delivery, open_.riders)

    async def _partition(self, out: Batchable) -> int | None:
        """The partition ``send`` would choose for ``out`` (None: topic unknown here)."""
        layout = self._layouts.get(out.topic)
        if layout is None:
            cluster = self._producer.client.cluster
            known = cluster.partitions_for_topic(out.topic)
            if known is None:
                return None  # never seen: the per-record send waits for its metadata, bounded
            layout = self._layouts[out.topic] = (list(known), list(cluster.available_partitions_for_topic(out.topic)))
        if out.partition is not None:
            return out.partition if out.partition in layout[0] else None
        # The producer's own partitioner on the metadata of this pass, as send() calls it (aiokafka
        # has no public name for that choice). Pinned by tests/integration/test_batch_sends.py.
        partition: int = self._producer._partitioner(out.key, *layout)
        return partition


def _size(out: Batchable) -> int:
    """Key and value: headers are bounded by the consumed record's own limit."""
    return len(out.key or b"") + len(out.value or b"")
