"""The outbox appends to an open record batch only until aiokafka's sender numbers it.

An idempotent producer gives a batch its base sequence when the sender takes it; records
appended later are outside that range and the broker refuses what follows
(OutOfOrderSequenceNumber, seen on Apache Kafka 4.4). pipeline/kafka/record_batches.py reads
the numbering off aiokafka 0.14's private builder; this fails by name if an upgrade moves it.
"""

from __future__ import annotations

from aiokafka import AIOKafkaProducer

from pipeline.kafka.record_batches import _not_taken


async def test_a_batch_is_open_to_appends_until_the_sender_numbers_it() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", enable_idempotence=True)  # never started
    builder = producer.create_batch()
    assert hasattr(builder, "_builder") and hasattr(builder._builder, "producer_id"), (
        "aiokafka's BatchBuilder no longer keeps _builder.producer_id: review pipeline/kafka/record_batches.py"
    )
    assert builder.append(timestamp=None, key=b"k", value=b"v", headers=[]) is not None
    assert _not_taken(builder)
    builder._set_producer_state(producer_id=7, producer_epoch=0, base_sequence=0)  # what the sender does
    assert not _not_taken(builder), "numbered: later records must start a new batch"
    built = producer.create_batch()
    built._build()
    assert not _not_taken(built)
