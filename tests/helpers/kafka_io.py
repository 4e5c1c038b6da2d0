"""Produce and collect records with plain aiokafka, as any client of the pipeline would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord, RecordMetadata

from pipeline.contract.records import Record
from pipeline.settings import KafkaSettings


def _connection(bootstrap: str | KafkaSettings) -> dict[str, Any]:
    """A plaintext bootstrap string, or full client settings (TLS, SASL) as every client gets them."""
    if isinstance(bootstrap, KafkaSettings):
        return bootstrap.client_kwargs()
    return {"bootstrap_servers": bootstrap}


BURST_PER_MS = 10
"""Records per millisecond of event time in a burst: 10,000 records span one second."""


async def produce(
    bootstrap: str | KafkaSettings,
    topic: str,
    records: Sequence[Record],
    *,
    rate: float = 0.0,
    burst: bool = False,
    idempotent: bool = False,
) -> list[RecordMetadata]:
    """Send ``records`` (all acknowledged on return, their acknowledgements returned in
    order: partition, offset, and the CreateTime each was stamped with); ``rate`` > 0 paces
    them per second.
    ``burst``: stamp them as one burst, ``BURST_PER_MS`` per millisecond from now, however
    long the sending takes (a test whose premise is "all produced within a second", in event
    time, must not depend on how busy the machine is).
    ``idempotent``: a retry after a lost acknowledgement (a leader killed between writing and
    answering) is not written twice, and a partition's records keep their order across a
    change of leader (a broker that cannot, Tansu, refuses the producer)."""
    producer = AIOKafkaProducer(**_connection(bootstrap), linger_ms=5, acks="all", enable_idempotence=idempotent)
    await producer.start()
    try:
        started = time.monotonic()
        started_ms = int(time.time() * 1000)
        pending = []
        for i, record in enumerate(records):
            if rate > 0:
                delay = started + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            stamp = started_ms + i // BURST_PER_MS if burst else None
            pending.append(
                await producer.send(topic, record.value, key=record.key, headers=record.headers, timestamp_ms=stamp)
            )
        return list(await asyncio.gather(*pending))
    finally:
        await producer.stop()


@dataclass
class Collected:
    records: list[ConsumerRecord[bytes, bytes]]

    def on(self, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
        return [r for r in self.records if r.topic == topic]


async def collect(
    bootstrap: str | KafkaSettings,
    topics: Sequence[str],
    *,
    done: Callable[[list[ConsumerRecord[bytes, bytes]]], bool],
    timeout: float,
) -> Collected:
    """Read ``topics`` from the beginning until ``done(records)`` or ``timeout`` seconds."""
    consumer = AIOKafkaConsumer(
        *topics, **_connection(bootstrap), auto_offset_reset="earliest", group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    records: list[ConsumerRecord[bytes, bytes]] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not done(records):
            batch = await consumer.getmany(timeout_ms=200)
            for part in batch.values():
                records.extend(part)
    finally:
        await consumer.stop()
    return Collected(records)


def header(record: ConsumerRecord[bytes, bytes], name: str) -> str | None:
    """The last value of header ``name`` (decoded), or None."""
    value = None
    for key, raw in record.headers or ():
        if key == name:
            value = raw.decode()
    return value


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions, replication factor 1."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


async def fill_two_partitions(bootstrap: str, topic: str, per_partition: int = 6) -> None:
    """Create ``topic`` with two partitions and write ``p<partition>-<i>`` to each (key ``k``),
    ``per_partition`` records: positions a test can read back by partition and offset."""
    await create_topic(bootstrap, topic, 2)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for partition in (0, 1):
            for i in range(per_partition):
                await producer.send_and_wait(topic, f"p{partition}-{i}".encode(), key=b"k", partition=partition)
    finally:
        await producer.stop()


async def topic_names(bootstrap: str) -> set[str]:
    """Every topic the broker lists."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()
