"""The outbox's plain outputs as record batches, one open batch per destination partition.

aiokafka's per-record ``send`` costs a coroutine, a partitioner call, an append and a
delivery future per record (and the outbox a callback per future); its batch API
(``create_batch`` / ``send_batch``) costs one of each per batch. So the outbox appends
each plain output (one record for its slot) to an open :class:`BatchBuilder` of its
destination partition and watches one delivery future per batch, for all its slots
(``benchmarks.stage_costs``: the outbox's CPU per record about halved).

A batch is handed to the producer when it is started and stays open there, taking the
records of this and later passes, until aiokafka's sender builds it (after ``linger_ms``,
once the previous request to the broker is answered) or it is full; an append that
fails starts the next batch. That is exactly how aiokafka fills the batches of ``send``,
so batches are as large, with no extra wait, and nothing else is needed: an append to an
open batch is in the request built from it, and only then.

Order: a partition line's outputs are appended in slot order. An output the outbox sends
alone (several outputs to a slot, after-acks ones, over :data:`BATCHABLE_BYTES`, an unknown
topic: ``add`` returns False) goes through ``send``, which may open a newer batch for its
partition; so after it the outbox calls :meth:`RecordBatches.after_alone` and later plain
outputs of that topic start new batches, queued behind it. (aiokafka 0.14 has in fact built
the older batch by then: ``send`` waits for a full batch to be drained. This does not rely on it.) The destination partition is
the one ``send`` would pick (the producer's own partitioner on the record key).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.structs import TopicPartition

from pipeline.kafka.key_partitions import key_partitions
from pipeline.kafka.ordering import Slot

#: Outputs larger than this (key and value) are sent alone: a large record should neither
#: fill a shared batch nor, refused by the broker, take its batch-mates down with it.
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


#: Told once per batch when the broker answered: the error (None: acknowledged) and its slots.
OnDelivered = Callable[[BaseException | None, list[Slot[Any]]], None]


@dataclass(eq=False)
class _Open:
    builder: BatchBuilder
    riders: list[Slot[Any]] = field(default_factory=list)


def _not_taken(builder: BatchBuilder) -> bool:
    """Whether aiokafka's sender has not yet taken ``builder`` out of its queue.

    An idempotent producer numbers a batch's records (base sequence, count) when the sender
    takes the batch, before it builds it; a record appended after that lies outside the
    numbered range, and the broker refuses the partition's next batch with
    OutOfOrderSequenceNumber (seen on Apache Kafka 4.4 as soon as idempotence was on). The
    numbering shows on the inner builder as a producer id (-1 until then; always -1 without
    idempotence, where an append until the build is safe). A built batch has no inner builder.
    aiokafka 0.14 internals (``BatchBuilder._builder.producer_id``), pinned by name in
    tests/unit/test_record_batch_numbering.py.
    """
    inner = getattr(builder, "_builder", None)
    return inner is not None and inner.producer_id < 0


class RecordBatches:
    """The open batch of each destination partition, kept across the outbox's passes."""

    def __init__(self, producer: AIOKafkaProducer, on_delivered: OnDelivered, on_sent: Callable[[Any], None]) -> None:
        self._producer = producer
        self._on_delivered = on_delivered
        self._on_sent = on_sent  # the delivery future, for the outbox's flush to wait on
        self._open: dict[TopicPartition, _Open] = {}
        self._layouts: dict[str, tuple[list[int], list[int]]] = {}  # topic -> (all, available) partitions
        # Keys are placed by Kafka's murmur2 rule in bulk only where the producer's partitioner is aiokafka's.
        self._default_rule = type(getattr(producer, "_partitioner", None)) is DefaultPartitioner

    def new_pass(self) -> None:
        """Partition layouts are read again (metadata may have changed between passes)."""
        self._layouts.clear()

    def place(self, outs: Sequence[Batchable]) -> list[int | None]:
        """The destination partition of each of this pass's outputs, in order; None where
        one must be sent alone (too large for a shared batch, or a topic not known here).

        Keyed outputs are placed together: Kafka's murmur2 over all their keys at once
        (:mod:`pipeline.kafka.key_partitions`) where the producer partitions by the default
        rule, which is aiokafka's own partitioner unless one was configured."""
        placed: list[int | None] = [None] * len(outs)
        keyed: dict[str, list[int]] = {}  # topic -> positions of its outputs to place by key
        for i, out in enumerate(outs):
            if len(out.key or b"") + len(out.value or b"") > BATCHABLE_BYTES:
                continue
            layout = self._layout(out.topic)
            if layout is None:
                continue  # never seen: the per-record send waits for its metadata, bounded
            if out.partition is not None:
                placed[i] = out.partition if out.partition in layout[0] else None
            elif out.key is not None and self._default_rule:
                keyed.setdefault(out.topic, []).append(i)
            else:
                # The producer's own partitioner on this pass's metadata, as send() calls it
                # (aiokafka has no public name for that choice). Pinned by
                # tests/integration/test_batch_sends.py.
                placed[i] = self._producer._partitioner(out.key, *layout)
        for topic, positions in keyed.items():
            every, _ = self._layouts[topic]
            chosen = key_partitions([outs[i].key or b"" for i in positions], every)
            for i, partition in zip(positions, chosen, strict=True):
                placed[i] = partition
        return placed

    def append(self, out: Batchable, slot: Slot[Any], partition: int) -> bool:
        """Append ``out`` (``slot``'s only output) to ``partition``'s open batch, if it has one
        the producer has not taken yet and it fits; else :meth:`start` a new one."""
        current = self._open.get(TopicPartition(out.topic, partition))
        if current is None or not _not_taken(current.builder):
            return False
        stamp = out.timestamp_ms if out.timestamp_ms and out.timestamp_ms > 0 else None
        if current.builder.append(timestamp=stamp, key=out.key, value=out.value, headers=out.headers) is None:
            return False
        current.riders.append(slot)
        return True

    async def start(self, out: Batchable, slot: Slot[Any], partition: int) -> bool:
        """Hand the producer a new batch for ``partition`` holding ``out``; False when ``out``
        does not fit an empty batch (it is sent alone)."""
        tp = TopicPartition(out.topic, partition)
        stamp = out.timestamp_ms if out.timestamp_ms and out.timestamp_ms > 0 else None
        builder = self._producer.create_batch()
        if builder.append(timestamp=stamp, key=out.key, value=out.value, headers=out.headers) is None:
            return False
        started = _Open(builder, [slot])
        self._open.pop(tp, None)
        # Queued behind the partition's earlier batches (waits while a full one is not sent).
        delivery = await self._producer.send_batch(builder, tp.topic, partition=tp.partition)
        self._open[tp] = started
        self._on_sent(delivery)
        delivery.add_done_callback(functools.partial(self._delivered, riders=started.riders))
        return True

    def after_alone(self, topics: set[str]) -> None:
        """Outputs to ``topics`` were just sent alone: later ones start new batches."""
        for tp in [tp for tp in self._open if tp.topic in topics]:
            del self._open[tp]

    def _delivered(self, delivery: Any, riders: list[Slot[Any]]) -> None:
        if not delivery.cancelled():
            self._on_delivered(delivery.exception(), riders)

    def _layout(self, topic: str) -> tuple[list[int], list[int]] | None:
        """(all, available) partitions of ``topic`` on this pass's metadata (None: unknown)."""
        layout = self._layouts.get(topic)
        if layout is None:
            cluster = self._producer.client.cluster
            known = cluster.partitions_for_topic(topic)
            if known is None:
                return None
            layout = self._layouts[topic] = (list(known), list(cluster.available_partitions_for_topic(topic)))
        return layout
