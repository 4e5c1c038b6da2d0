"""The partitions of a topic a consumer reads by assignment, as the broker lists them now.

``AIOKafkaConsumer.topics()`` fetches the whole cluster's metadata but returns only the topic
names, and ``partitions_for_topic`` reads the consumer's own metadata, which covers only the
topics it subscribed to or was assigned. Apache Kafka answers a metadata request for no topics
with none, so a topic read by assignment (``pipeline consume --partition``, ``pipeline replay``,
``pipeline top``) is unknown there until it is assigned, and was reported missing. Tansu answers
that request with every topic, which hid it (found running the suite on Apache Kafka).
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int] | None:
    """The partition numbers of ``topic`` (None when the broker has no such topic). Reads the
    metadata the same request as ``consumer.topics()`` fetches (aiokafka 0.14's private client:
    the consumer has no public call that returns it)."""
    cluster = await consumer._client.fetch_all_metadata()
    partitions = cluster.partitions_for_topic(topic)
    return set(partitions) if partitions is not None else None
