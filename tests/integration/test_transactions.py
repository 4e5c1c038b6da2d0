"""Exactly-once delivery's two broker-side rules, each against a real broker.

- A unit's next owner fences the previous one by producer epoch: the outbox of a worker that
  lost its partitions (a zombie our membership lease did not stop) can neither commit its
  transaction nor its offsets, and a read_committed reader never sees its outputs. This test
  drives the stage's own :class:`pipeline.kafka.transactions.TransactionalOutbox` directly, with
  no lease at all, so what fences is the broker alone.
- A broker without transactions (Tansu) makes ``delivery: exactly_once`` a one-line error at
  start, not a silent downgrade to at-least-once.

The chaos runs (librdkafka, kill -9, three topologies) are in tests/integration/test_exactly_once.py.
"""

from __future__ import annotations

import asyncio
import gc
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import ProducerFenced
from aiokafka.structs import ConsumerRecord, TopicPartition

from pipeline.kafka import transactions
from pipeline.kafka.clients import ensure_topics, make_consumer, make_producer
from pipeline.kafka.outbox import Outbox, OutRecord
from pipeline.kafka.transactions import TRANSACTION_TIMEOUT_MS, TransactionalOutbox, UnitOutbox
from pipeline.settings import KafkaSettings
from tests.helpers.cli import run_cli
from tests.helpers.topology_process import write_topology

pytestmark = [pytest.mark.kafka]


def _record(topic: str, offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(topic, 0, offset, 0, 0, b"k", f"in-{offset}".encode(), None, 1, 8, [])


@dataclass
class _Worker:
    """One worker's transactional outbox (no membership lease) and its clients."""

    outbox: TransactionalOutbox
    consumer: AIOKafkaConsumer
    plain: AIOKafkaProducer

    async def stop(self) -> None:
        await self.outbox.close_partitions()  # its unit producers stop
        await self.consumer.stop()
        await self.plain.stop()


async def _worker(settings: KafkaSettings, group: str) -> _Worker:
    consumer = make_consumer(settings, group_id=group)
    await consumer.start()
    plain = make_producer(settings)
    await plain.start()

    async def start_producer(unit: str) -> AIOKafkaProducer:
        producer = make_producer(
            settings,
            enable_idempotence=True,
            transactional_id=f"{group}.{unit}",
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
        )
        await producer.start()
        return producer

    outbox = TransactionalOutbox(
        start_producer,
        lambda producer: UnitOutbox(producer, consumer, group_id=group),
        Outbox(plain, consumer),  # outputs of no unit: none here
        by_partition=False,
    )
    return _Worker(outbox, consumer, plain)


async def _read_committed(settings: KafkaSettings, topic: str) -> list[bytes]:
    consumer = make_consumer(settings, topic, group_id=None)  # read_committed, as every reader of ours
    await consumer.start()
    try:
        end = (await consumer.end_offsets([TopicPartition(topic, 0)]))[TopicPartition(topic, 0)]
        values: list[bytes] = []
        while (await consumer.position(TopicPartition(topic, 0))) < end:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                values += [r.value or b"" for r in records]
        return values
    finally:
        await consumer.stop()


async def test_the_next_owner_of_a_unit_fences_the_previous_one_by_producer_epoch(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    suffix = uuid.uuid4().hex[:8]
    source, sink, group = f"eos-in-{suffix}", f"eos-out-{suffix}", f"eos-{suffix}"
    await ensure_topics(settings, [source, sink], partitions=1)
    tp = TopicPartition(source, 0)

    zombie_worker = await _worker(settings, group)
    zombie = zombie_worker.outbox
    monkeypatch.setattr(transactions, "COMMIT_INTERVAL_S", 3600.0)  # frozen: its loop never gets to commit
    await zombie.open_partitions([tp])
    monkeypatch.undo()
    for offset in range(3):  # three records answered; the transaction is not committed yet
        slot = zombie.track(_record(source, offset))
        zombie.complete(slot, OutRecord(topic=sink, key=b"k", value=f"zombie-{offset}".encode(), headers=[]))
    await zombie.emit_ready()
    assert await zombie.flush(10) is True  # delivered (acknowledged) inside the open transaction

    owner_worker = await _worker(settings, group)
    owner = owner_worker.outbox
    await owner.open_partitions([tp])  # same transactional.id: InitProducerId bumps the epoch
    slot = owner.track(_record(source, 0))
    owner.complete(slot, OutRecord(topic=sink, key=b"k", value=b"owner-0", headers=[]))
    await owner.commit()  # waits for the output's acknowledgement, commits it with offset 1

    with pytest.raises(ProducerFenced):
        await asyncio.wait_for(zombie.commit(), 30)  # the zombie's commit: refused by the broker

    assert await _read_committed(settings, sink) == [b"owner-0"], "only the owner's committed output is visible"
    committed = await owner_worker.consumer.committed(tp)
    assert committed == 1, f"the group's offset is the owner's (1), not the zombie's 3: {committed}"

    await owner_worker.stop()
    await zombie_worker.stop()
    gc.collect()  # aiokafka's own future of the refused request is collected (and logged) here


def test_exactly_once_on_a_broker_without_transactions_is_a_one_line_error(
    tansu_env: dict[str, str], tmp_path: Path
) -> None:
    topology = write_topology(tmp_path, partitions=1, extra={"delivery": "exactly_once"})
    result = run_cli(tansu_env, "run", str(topology.path), "--http-port", "0", timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]  # after the start-up log lines: the reason, in one
    assert line.startswith("error: stage classify: delivery: exactly_once needs a broker that serves transactions"), line
    assert "refused InitProducerId" in line and "delivery: at_least_once" in line, line
