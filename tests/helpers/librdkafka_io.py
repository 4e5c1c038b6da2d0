"""Produce and read records with librdkafka (confluent-kafka), a client that shares no code with us.

A test of the pipeline's delivery guarantees should not judge them with the pipeline's own
Kafka client (aiokafka): here requests go in through librdkafka's idempotent producer, and
outputs are read back by librdkafka's consumer, whose ``isolation.level`` is librdkafka's own
reading of the transaction protocol (each fetch's aborted-transaction list, the last stable
offset). ``read_committed`` shows only what committed transactions wrote (and plain records);
``read_uncommitted`` shows every record the log holds, aborted ones included.

Records read come back as aiokafka ``ConsumerRecord``s, so the fault campaign's comparison
and audit (tests/helpers/fault_compare.py, outcome_audit.py) take them unchanged.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Literal

from aiokafka.structs import ConsumerRecord
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from pipeline.contract.records import Record

Isolation = Literal["read_committed", "read_uncommitted"]
Rec = ConsumerRecord[bytes, bytes]

OFFSET_BEGINNING = -2
"""librdkafka's logical offset for a partition's first record (``confluent_kafka.OFFSET_BEGINNING``)."""


class PacedProducer(threading.Thread):
    """Sends ``records`` to ``topic`` evenly over ``seconds`` (0: at once) from a thread, with
    librdkafka's idempotent producer (``acks=all``): a retried send is not written twice, so
    every request is on the input topic exactly once. :meth:`join` waits for every delivery;
    :attr:`errors` then holds each failed delivery's error.

    ``partitioner``: librdkafka's default, ``consistent_random``, places a key by CRC32, not
    by Java's murmur2 (``murmur2_random`` would); the stages keep a request's partition number
    for their outputs to a next stage, so either way each intermediate partition has one writer."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        records: Sequence[Record],
        *,
        seconds: float,
        partitioner: str = "consistent_random",
    ) -> None:
        super().__init__(name=f"librdkafka-produce-{topic}", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.records = records
        self.seconds = seconds
        self.partitioner = partitioner
        self.delivered = 0
        self.errors: list[str] = []
        self.undelivered = 0
        """Still queued when the final flush gave up."""

    def run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": "exactly-once-test-requests",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "partitioner": self.partitioner,
            }
        )
        rate = len(self.records) / self.seconds if self.seconds > 0 else 0.0
        started = time.monotonic()
        for i, record in enumerate(self.records):
            if rate > 0:
                _serve_until(producer, started + i / rate)
            self._send(producer, record)
        self.undelivered = producer.flush(120)

    def _send(self, producer: Producer, record: Record) -> None:
        while True:
            try:
                producer.produce(
                    self.topic, value=record.value, key=record.key, headers=list(record.headers), on_delivery=self._ack
                )
                producer.poll(0)
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)

    def _ack(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            self.delivered += 1
        else:
            self.errors.append(str(error))


def _serve_until(producer: Producer, when: float) -> None:
    """Serve delivery callbacks until the monotonic clock reaches ``when``."""
    while (left := when - time.monotonic()) > 0:
        producer.poll(left)


def _consumer(bootstrap: str, isolation: Isolation) -> Consumer:
    """A consumer that commits nothing (its group is never joined: partitions are assigned)."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"exactly-once-test-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
        }
    )


def _partitions(consumer: Consumer, topics: Sequence[str]) -> list[TopicPartition]:
    """Every partition of ``topics`` from its first record (none of a topic nobody created)."""
    found = []
    for topic in topics:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None:
            continue
        found += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(metadata.partitions)]
    return found


def to_record(message: Message) -> Rec:
    """A librdkafka message as the aiokafka record the comparison helpers take."""
    timestamp_type, timestamp = message.timestamp()
    key, value = message.key(), message.value()
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    assert topic is not None and partition is not None and offset is not None
    return ConsumerRecord(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp=timestamp,
        timestamp_type=max(timestamp_type - 1, 0),  # librdkafka: 1 create time, 2 log append; aiokafka: 0, 1
        key=key,
        value=value,
        checksum=None,
        serialized_key_size=-1 if key is None else len(key),
        serialized_value_size=-1 if value is None else len(value),
        headers=tuple(message.headers() or ()),
    )


def read_until(
    bootstrap: str,
    topics: Sequence[str],
    done: Callable[[list[Rec]], bool],
    *,
    isolation: Isolation,
    timeout: float,
    check_every_s: float = 0.5,
) -> list[Rec]:
    """Read ``topics`` from their beginning until ``done(records)`` (asked every
    ``check_every_s``) or ``timeout`` seconds; what was read, either way."""
    consumer = _consumer(bootstrap, isolation)
    try:
        consumer.assign(_partitions(consumer, topics))
        records: list[Rec] = []
        deadline = time.monotonic() + timeout
        checked = 0.0
        while time.monotonic() < deadline:
            records += [to_record(m) for m in consumer.consume(1000, timeout=0.2) if _payload(m)]
            if time.monotonic() - checked >= check_every_s:
                if done(records):
                    break
                checked = time.monotonic()
        return records
    finally:
        consumer.close()


def read_to_end(bootstrap: str, topics: Sequence[str], *, isolation: Isolation, timeout: float = 120.0) -> list[Rec]:
    """Every record of ``topics`` up to their end as of now (each partition's high watermark).

    A ``read_committed`` reader stops at a partition's last stable offset: a transaction left
    open (neither committed nor aborted) holds it below the high watermark, and this fails
    naming each partition held and where."""
    consumer = _consumer(bootstrap, isolation)
    try:
        partitions = _partitions(consumer, topics)
        ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in partitions}
        reached = {(tp.topic, tp.partition): 0 for tp in partitions}
        consumer.assign(partitions)
        records: list[Rec] = []
        deadline = time.monotonic() + timeout
        while held := {tp: at for tp, at in reached.items() if at < ends[tp]}:
            if time.monotonic() >= deadline:
                where = ", ".join(f"{t}[{p}] at {at} of {ends[(t, p)]}" for (t, p), at in sorted(held.items()))
                raise AssertionError(f"{isolation} read of {list(topics)} not at the end in {timeout:.0f} s: {where}")
            for message in consumer.consume(1000, timeout=0.2):
                if _payload(message):
                    records.append(to_record(message))
                position = (message.topic(), message.partition())
                offset = message.offset()
                if position in reached and offset is not None:
                    # A partition's end (EOF) is reported at the offset where it ends for this
                    # isolation: the last stable offset for read_committed.
                    eof = message.error() is not None
                    reached[position] = max(reached[position], offset if eof else offset + 1)
        return records
    finally:
        consumer.close()


def _payload(message: Message) -> bool:
    """A record (not the end of a partition); any other error fails the read."""
    error = message.error()
    if error is None:
        return True
    if error.code() == KafkaError._PARTITION_EOF:
        return False
    raise KafkaException(error)
