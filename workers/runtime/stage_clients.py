"""A stage's Kafka clients and outbox, built the one way every stage kind uses.

One producer and one consumer per stage. A stage reading several co-partitioned topics
(a join) gets the range assignor, so partition ``p`` of each goes to one worker. The
outbox between them is given the stage's size limits (oversize outputs become
claim-check dead letters), its membership fence, and its reply-topic redirect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from pipeline.deadletter.oversize import OversizeOutputs
from pipeline.errors import ConfigError
from pipeline.kafka.clients import detect_idempotence, make_consumer, make_producer
from pipeline.kafka.outbox import Outbox, StageOutbox
from pipeline.kafka.replies import stage_replies
from pipeline.kafka.transactions import TRANSACTION_TIMEOUT_MS, TransactionalOutbox, UnitOutbox
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import KafkaSettings
from workers.runtime.fencing import StageFence
from workers.runtime.outcomes import StageOutcomes
from workers.runtime.stage_io import StageIO


@dataclass(frozen=True)
class StageClients:
    producer: AIOKafkaProducer
    consumer: AIOKafkaConsumer
    outbox: StageOutbox


async def open_clients(
    io: StageIO,
    kafka: KafkaSettings,
    metrics: PipelineMetrics,
    outcomes: StageOutcomes,
    fence: StageFence,
    listener: ConsumerRebalanceListener,
) -> StageClients:
    """Start the producer and subscribe the consumer (``listener`` sees rebalances); the
    caller starts the consumer once it holds it. aiokafka's ``start()`` of a subscribed
    consumer waits for the first assignment, so the listener's ``restore`` runs inside it:
    a stage that stored its consumer only after the start restored without one (no reading
    starts: a join took an unread branch partition as read, and expired 3,307 windows of a
    backlog, CI of 2026-11-27)."""
    idempotent = await detect_idempotence(kafka)  # idempotent producers wherever the broker serves them
    if io.exactly_once and not idempotent:
        raise ConfigError(
            f"stage {io.stage}: delivery: exactly_once needs a broker that serves transactions, and Kafka at "
            f"{kafka.bootstrap_servers} refused InitProducerId (Tansu does); use delivery: at_least_once there"
        )
    producer = make_producer(kafka, limits=io.limits)
    await producer.start()
    extra: dict[str, object] = {}
    if io.more_input_topics:
        # Range gives a worker the same partition numbers of every topic (co-partitioning).
        extra["partition_assignment_strategy"] = (RangePartitionAssignor,)
    if kafka.group_instance_id:
        extra["group_instance_id"] = kafka.group_instance_id  # static membership (KIP-345)
    consumer = make_consumer(kafka, group_id=io.group_id, limits=io.limits, **extra)
    oversize = OversizeOutputs(
        stage=io.stage,
        dead_letter_topic=io.dead_letter_topic,
        limits=io.limits,
        store=io.claim_checks,
        on_claim_check=lambda outcome: metrics.claim_checks.labels(io.stage, outcome).inc(),
    )
    lease = fence.watch(consumer, io.stage, metrics)

    def options(producer: AIOKafkaProducer) -> dict[str, Any]:
        return dict(
            on_acknowledged=outcomes.acknowledged, oversize=oversize, fence=lease,
            replies=stage_replies(producer, io.stage, io.output_topic, io.reply_prefix, metrics),
            batch_sends=kafka.batch_sends,
        )  # fmt: skip

    plain = Outbox(producer, consumer, **options(producer))
    outbox: StageOutbox = plain
    if io.exactly_once:

        async def start_producer(unit: str) -> AIOKafkaProducer:
            unit_producer = make_producer(
                kafka, limits=io.limits, enable_idempotence=True,
                transactional_id=f"{io.group_id}.{unit}", transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            )  # fmt: skip
            try:
                await unit_producer.start()  # InitProducerId: the unit's previous owner is fenced
            except BaseException:
                await unit_producer.stop()
                raise
            return unit_producer

        outbox = TransactionalOutbox(
            start_producer,
            lambda unit_producer: UnitOutbox(unit_producer, consumer, group_id=io.group_id, **options(unit_producer)),
            plain,
            by_partition=bool(io.more_input_topics),
        )
    consumer.subscribe(io.input_topics, listener=listener)
    return StageClients(producer, consumer, outbox)
