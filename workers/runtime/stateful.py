"""A stage with keyed state (sequences, joins): the one way such a stage holds state.

Its state lives in a :class:`pipeline.state.KeyedStateStore` checkpointed to a
compacted topic co-partitioned with its inputs (checked at start). On assignment
the store restores the partitions before any of their records is handled; state
records that do not decode are dead-lettered here and their keys start fresh.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiokafka.structs import TopicPartition

from pipeline.kafka.ordering import Slot
from pipeline.kafka.out_record import Outputs, OutRecord
from pipeline.kafka.records import ConsumedRecord
from pipeline.state import KeyedStateStore, RestoreReport, StateCodec, StateLimits
from workers.runtime.dead_letters import corrupt_state_records
from workers.runtime.event_time import EventTimeClock
from workers.runtime.stream_stage import StreamStage

S = TypeVar("S")

YIELD_EVERY_S = 0.005
"""How long a stateful stage's consume loop may hold the event loop between records."""


class StatefulStage(StreamStage, abc.ABC):
    states: KeyedStateStore[Any]
    clock: EventTimeClock  # windows and idle timeouts run in event time

    _yielded_at = 0.0

    def accept(self, record: ConsumedRecord, slot: Slot[Outputs]) -> Awaitable[None]:
        return self._handled(record, slot)

    async def _handled(self, record: ConsumedRecord, slot: Slot[Outputs]) -> None:
        """:meth:`handle`, then, once every :data:`YIELD_EVERY_S`, the loop runs once: a handler
        that does not suspend would hold it through a whole fetch (up to 1,000 records), and
        with it the outbox, the deliveries and the after-acks checkpoints of every line."""
        await self.handle(record, slot)
        if (now := time.monotonic()) - self._yielded_at >= YIELD_EVERY_S:
            self._yielded_at = now
            await asyncio.sleep(0)

    def passing(self, record: ConsumedRecord) -> None:
        # Every record moves its partition's event time and read position, also one
        # dead-lettered before it is handled (unreadable, keyless): were it the last of
        # its partition, the partition would look behind forever, and no window close.
        self.clock.observe(record)

    def keyed_state(
        self, topic: str, codec: StateCodec[S], *, ttl_s: float, max_keys: int | None
    ) -> KeyedStateStore[S]:
        """This stage's keyed state, checkpointed to ``topic`` (see :mod:`pipeline.state`)."""
        return KeyedStateStore(
            kafka=self.kafka, topic=topic, codec=codec, limits=StateLimits(ttl_s, max_keys), committed_only=self.io.exactly_once
        )

    async def restore_states(self, partitions: list[TopicPartition]) -> RestoreReport:
        """Load the states of ``partitions``; dead-letter (and count) records that do not decode."""
        report = await self.states.restore(tp.partition for tp in partitions)
        letters = corrupt_state_records(self.io.stage, self.io.dead_letter_topic, report)
        if letters:
            self.metrics.state_corrupt.labels(self.io.stage).inc(len(letters))
            await self.produce_unowned_of([(corrupt[2], letter) for corrupt, letter in zip(report.corrupt, letters, strict=True)])
        return report

    async def produce_unowned_of(self, outputs: list[tuple[int, OutRecord]]) -> None:
        """:meth:`produce_all_unowned` of outputs that come from several input partitions, each
        group with its partition (under exactly-once, they join their partitions' transactions)."""
        grouped: dict[int, list[OutRecord]] = {}
        for partition, out in outputs:
            grouped.setdefault(partition, []).append(out)
        await asyncio.gather(*[self.produce_all_unowned(records, partition) for partition, records in grouped.items()])

    def copartitioned_topics(self) -> list[str]:
        return [*super().copartitioned_topics(), self.states.topic]
