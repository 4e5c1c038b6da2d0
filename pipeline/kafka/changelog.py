"""Read a compacted state topic back: the latest value of every key in some partitions.

Stateful stages (sequences, joins) write each key's state to a compacted topic,
into the partition number of the input record it came from; a worker that is
assigned input partition ``p`` restores state partition ``p`` to its end
before it handles a record of ``p``.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka.structs import TopicPartition

from pipeline.kafka import continuity
from pipeline.kafka.clients import isolation_level, make_consumer
from pipeline.kafka.to_end import ReadToEnd
from pipeline.settings import KafkaSettings


async def read_changelog(
    settings: KafkaSettings, topic: str, partitions: Iterable[int], *, committed_only: bool = False
) -> dict[int, dict[bytes, bytes]]:
    """Per partition number, ``key -> latest value`` (tombstoned keys left out); with
    ``committed_only`` the records of aborted transactions are left out too."""
    wanted = [TopicPartition(topic, p) for p in partitions]
    latest: dict[int, dict[bytes, bytes]] = {tp.partition: {} for tp in wanted}
    if not wanted:
        return latest
    continuity.expect_gaps(topic)  # compaction drops whole batches
    consumer = make_consumer(settings, group_id=None, isolation_level=isolation_level(committed_only))
    await consumer.start()
    try:
        consumer.assign(wanted)
        reader = await ReadToEnd.now(consumer, wanted)
        await consumer.seek_to_beginning(*wanted)
        async for tp, records in reader.batches():
            table = latest[tp.partition]
            for record in records:
                key = record.key or b""
                if record.value is None:
                    table.pop(key, None)
                else:
                    table[key] = record.value
    finally:
        await consumer.stop()
    return latest
