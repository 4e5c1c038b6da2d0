"""Construct aiokafka clients with the project's delivery defaults.

Producers use ``acks="all"`` so a result counts as delivered only when the
broker has it replicated; consumers never auto-commit (offsets are committed
by :mod:`pipeline.kafka.ordering` after outputs are acknowledged).
Idempotent production is switchable (``PIPELINE_KAFKA_IDEMPOTENCE``) because
some Kafka-protocol brokers (Tansu's memory engine) lack ``InitProducerId``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError

from pipeline.errors import EndpointUnreachable
from pipeline.settings import KafkaSettings


def _idempotence() -> bool:
    return os.environ.get("PIPELINE_KAFKA_IDEMPOTENCE", "false").lower() in ("1", "true", "yes")


def make_producer(settings: KafkaSettings, **overrides: Any) -> AIOKafkaProducer:
    kwargs: dict[str, Any] = {
        **settings.client_kwargs(),
        "acks": "all",
        "linger_ms": 2,
        "max_batch_size": 1 << 20,
        "enable_idempotence": _idempotence(),
        "request_timeout_ms": 30_000,
    }
    kwargs.update(overrides)
    return AIOKafkaProducer(**kwargs)


def make_consumer(
    settings: KafkaSettings, *topics: str, group_id: str | None, **overrides: Any
) -> AIOKafkaConsumer:
    kwargs: dict[str, Any] = {
        **settings.client_kwargs(),
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": 4 << 20,
        # A dead worker's partitions move after 10 s, not Kafka's 45 s default.
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 1_000,
        "max_poll_interval_ms": 300_000,
        "isolation_level": "read_committed",
        # How long the broker may hold an empty fetch. Apache Kafka answers as soon as data
        # arrives anyway; Tansu holds the full time, so a long wait is per-hop latency.
        "fetch_max_wait_ms": int(os.environ.get("PIPELINE_KAFKA_FETCH_MAX_WAIT_MS", "25")),
    }
    kwargs.update(overrides)
    return AIOKafkaConsumer(*topics, **kwargs)


async def ensure_topics(
    settings: KafkaSettings,
    topics: Iterable[str],
    *,
    partitions: int,
    replication_factor: int = 1,
    compacted: Iterable[str] = (),
) -> list[str]:
    """Create the topics that do not exist yet; returns the ones it created.

    ``compacted`` topics (state changelogs) get ``cleanup.policy=compact`` so
    the broker keeps the latest value per key forever, not by time.
    """
    admin = AIOKafkaAdminClient(**settings.client_kwargs(), request_timeout_ms=15_000)
    try:
        await admin.start()
    except KafkaConnectionError as exc:
        raise EndpointUnreachable(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}"
        ) from exc
    try:
        existing = set(await admin.list_topics())
        wanted = [t for t in dict.fromkeys(topics) if t not in existing]
        if not wanted:
            return []
        compact = set(compacted)
        new = [
            NewTopic(
                t,
                num_partitions=partitions,
                replication_factor=replication_factor,
                topic_configs={"cleanup.policy": "compact"} if t in compact else {},
            )
            for t in wanted
        ]
        try:
            await admin.create_topics(new)
        except TopicAlreadyExistsError:
            pass  # another worker of the same topology won the race
        except KafkaError as exc:
            raise EndpointUnreachable(f"cannot create topics {wanted}: {exc}") from exc
        return wanted
    finally:
        await admin.close()
