"""pipeline/kafka/topic_partitions.py reads the cluster's metadata through the consumer's
private client (aiokafka 0.14, pinned in pyproject.toml): this fails by name if an upgrade
moves it. The behaviour itself (a topic read by assignment is found on Apache Kafka) is
tests/integration/test_apache_kafka.py's."""

from __future__ import annotations

import inspect

from aiokafka import AIOKafkaConsumer
from aiokafka.cluster import ClusterMetadata
from aiokafka.protocol.metadata import MetadataResponse_v0

from pipeline.kafka.topic_partitions import topic_partitions


async def test_the_consumers_client_fetches_the_whole_clusters_metadata() -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
    assert inspect.iscoroutinefunction(consumer._client.fetch_all_metadata)
    assert list(inspect.signature(consumer._client.fetch_all_metadata).parameters) == []


async def test_partitions_come_from_the_fetched_metadata_and_an_unknown_topic_is_none() -> None:
    metadata = ClusterMetadata()
    metadata.update_metadata(
        MetadataResponse_v0(
            brokers=[(1, "127.0.0.1", 9092)],
            topics=[(0, "in", [(0, 0, 1, [1], [1]), (0, 1, 1, [1], [1])])],
        )
    )
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")

    async def fetch_all_metadata() -> ClusterMetadata:
        return metadata

    consumer._client.fetch_all_metadata = fetch_all_metadata
    assert await topic_partitions(consumer, "in") == {0, 1}
    assert await topic_partitions(consumer, "missing") is None
