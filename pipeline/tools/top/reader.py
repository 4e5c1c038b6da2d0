"""Read a topology's metrics topic into a :class:`~pipeline.tools.top.book.SnapshotBook` (or any sink).

A plain consumer with no group: it assigns itself every partition of the topic and
commits nothing, so watching moves no offsets. It starts ``lookback_s`` back in
time (the broker's timestamp index, ``ListOffsets`` by time), enough for each live
process's last two snapshots: a rate is there from the first frame, and the topic's
older history (it is never compacted) is not read.

Tansu answers a time past the last record with offset 0 and timestamp -1 where
Apache Kafka answers no offset; both mean "nothing that recent": start at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Protocol

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from pipeline.errors import ConfigError
from pipeline.kafka.clients import make_consumer
from pipeline.kafka.to_end import ReadToEnd
from pipeline.kafka.topic_partitions import topic_partitions
from pipeline.settings import KafkaSettings
from pipeline.tools.connect import start_client
from pipeline.tools.top.snapshot import Snapshot, parse_snapshot

CONNECT_TIMEOUT_S = 10.0
_POLL_MS = 200


class SnapshotSink(Protocol):
    """Where parsed records go: ``pipeline top``'s :class:`~pipeline.tools.top.book.SnapshotBook`
    keeps each process's last two, ``pipeline bench``'s log keeps them all; None = not a snapshot."""

    def add(self, snapshot: Snapshot | None) -> None: ...


@dataclass
class MetricsReader:
    """The consumer of one metrics topic, positioned ``lookback_s`` back."""

    settings: KafkaSettings
    topic: str
    lookback_s: float
    _consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        """Connect, assign every partition and seek; a topic that does not exist is a one-line error."""
        consumer = make_consumer(self.settings, group_id=None)
        await start_client(consumer, self.settings, CONNECT_TIMEOUT_S)
        self._consumer = consumer
        try:
            partitions = await topic_partitions(consumer, self.topic)
            if not partitions:
                raise ConfigError(f"metrics topic {self.topic} does not exist: has the topology run yet?")
            tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            consumer.assign(tps)
            since_ms = int((time.time() - self.lookback_s) * 1000)
            found = await consumer.offsets_for_times({tp: since_ms for tp in tps})
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                hit = found.get(tp)
                consumer.seek(tp, hit.offset if hit is not None and hit.timestamp >= 0 else ends[tp])
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def catch_up(self, book: SnapshotSink, timeout_s: float) -> None:
        """Read until every partition's end as of now (or ``timeout_s``): the ``--once`` frame."""
        consumer = self._require()
        reader = await ReadToEnd.now(consumer, consumer.assignment())

        async def read() -> None:
            async for _, records in reader.batches(_POLL_MS):
                for record in records:
                    book.add(parse_snapshot(record.value))

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(read(), timeout_s)

    async def read_for(self, book: SnapshotSink, seconds: float, stop: asyncio.Event) -> None:
        """Read whatever arrives for ``seconds``, or until ``stop``."""
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            await self._fetch(book, max(1, min(_POLL_MS, int(remaining * 1000))))

    async def _fetch(self, book: SnapshotSink, timeout_ms: int) -> None:
        batches = await self._require().getmany(timeout_ms=timeout_ms)
        for records in batches.values():
            for record in records:
                book.add(parse_snapshot(record.value))

    def _require(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("MetricsReader.start() first")
        return self._consumer
