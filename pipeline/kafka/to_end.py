"""Read assigned partitions up to their ends as of now: restores, replays, catch-ups.

The end of a partition is its end offset when the read starts, or the first fetch's
high watermark when that is larger: some brokers (Tansu) answer ListOffsets with the
last batch's base offset + 1, and the rest of that batch must not be missed. A
partition is read to its end once the consumer's position reaches it, which also
steps over transaction markers and compacted gaps that carry no record.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

POLL_MS = 200


class ReadToEnd:
    """The records of ``partitions`` (assigned, positioned) from their positions to ``ends``."""

    def __init__(self, consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> None:
        self.consumer = consumer
        self.ends = ends
        """End per partition; raised by the first fetch's high watermark when larger."""
        self.done: set[TopicPartition] = set()
        """Partitions read to their end."""

    @classmethod
    async def now(cls, consumer: AIOKafkaConsumer, partitions: Iterable[TopicPartition]) -> ReadToEnd:
        return cls(consumer, dict(await consumer.end_offsets(list(partitions))))

    async def batches(
        self, poll_ms: int = POLL_MS, stop: asyncio.Event | None = None
    ) -> AsyncIterator[tuple[TopicPartition, list[Any]]]:
        """Per fetch and partition, the records fetched, until every partition is done (or
        ``stop`` is set). A fetch may go past an end: a caller that must stop there compares
        offsets with :attr:`ends`."""
        pending = {tp for tp, end in self.ends.items() if await self.consumer.position(tp) < end}
        self.done = set(self.ends) - pending
        fetched: set[TopicPartition] = set()
        while pending and not (stop is not None and stop.is_set()):
            for tp, records in (await self.consumer.getmany(*pending, timeout_ms=poll_ms)).items():
                if tp not in fetched:
                    fetched.add(tp)
                    high = self.consumer.highwater(tp)
                    if high is not None and high > self.ends[tp]:
                        self.ends[tp] = high
                if records:
                    yield tp, records
            for tp in list(pending):
                if await self.consumer.position(tp) >= self.ends[tp]:
                    pending.discard(tp)
                    self.done.add(tp)
