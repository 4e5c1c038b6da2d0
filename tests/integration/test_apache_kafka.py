"""Apache Kafka (KRaft) as the embedded broker: what Tansu cannot do, against the real broker.

The jars come from ``scripts/install.sh --test``; without them every test here fails and
says so (the fixture turns the stack's error into a failure: nothing is skipped). Each
fixture prints the start-up time and the resident memory of each node's JVM, which
docs/apache-kafka.md quotes.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord, TopicPartition

from pipeline.embedded.stack import EmbeddedStack
from pipeline.errors import PipelineError
from pipeline.kafka.topic_partitions import topic_partitions
from tests.helpers.cli import ok, run_cli
from tests.helpers.kafka_io import fill_two_partitions

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CLUSTER_START_BUDGET_S = 90  # three JVMs on two shared cores; measured ~25-40 s (see the docs page)


def _report(config: pytest.Config, line: str) -> None:
    """Show ``line`` in the test output even when output is captured (the figures are the point)."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        print(line, flush=True)


def _start(tmp_path: Path, brokers: int, config: pytest.Config) -> EmbeddedStack:
    stack = EmbeddedStack(services=("kafka",), broker="kafka", brokers=brokers, log_dir=tmp_path / "logs")
    try:
        stack.start()
    except PipelineError as exc:
        pytest.fail(f"Apache Kafka did not start: {exc}")
    assert stack.kafka is not None
    _report(config, f"\n{stack.kafka.summary()}")
    return stack


@pytest.fixture(scope="module")
def kafka_stack(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[EmbeddedStack]:
    stack = _start(tmp_path_factory.mktemp("apache-kafka"), 1, pytestconfig)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def bootstrap(kafka_stack: EmbeddedStack) -> str:
    servers = kafka_stack.endpoints.kafka.bootstrap_servers
    assert servers
    return str(servers)


def _topic() -> str:
    return f"apache-kafka-{uuid.uuid4().hex[:8]}"


async def _create_topic(bootstrap: str, name: str, replicas: int = 1, configs: dict[str, str] | None = None) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, replicas, topic_configs=configs or {})])
    finally:
        await admin.close()


async def _read(
    bootstrap: str, topic: str, count: int, *, group: str | None = None, isolation: str = "read_uncommitted"
) -> tuple[list[ConsumerRecord[bytes, bytes]], AIOKafkaConsumer]:
    """``count`` records from the start of ``topic`` (waits up to 30 s); returns the started consumer too."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation,
    )
    await consumer.start()
    records: list[ConsumerRecord[bytes, bytes]] = []
    deadline = time.monotonic() + 30
    while len(records) < count and time.monotonic() < deadline:
        for batch in (await consumer.getmany(timeout_ms=500)).values():
            records.extend(batch)
    return records, consumer


async def test_produce_consume_and_commit_a_group_offset(bootstrap: str) -> None:
    topic = _topic()
    await _create_topic(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(10):
            await producer.send_and_wait(topic, f"r{i}".encode(), key=b"k")
    finally:
        await producer.stop()
    records, consumer = await _read(bootstrap, topic, 10, group="apache-kafka-group")
    try:
        assert [r.value for r in records] == [f"r{i}".encode() for i in range(10)]
        partition = TopicPartition(topic, 0)
        await consumer.commit({partition: 10})
        assert await consumer.committed(partition) == 10
    finally:
        await consumer.stop()


async def test_idempotent_producer_gets_a_producer_id(bootstrap: str) -> None:
    """``enable_idempotence`` starts with InitProducerId, which Tansu does not serve."""
    topic = _topic()
    await _create_topic(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        sent = await asyncio.gather(*[await producer.send(topic, f"i{i}".encode()) for i in range(20)])
        assert producer._txn_manager is not None and producer._txn_manager.producer_id >= 0
    finally:
        await producer.stop()
    assert [m.offset for m in sent] == list(range(20))
    records, consumer = await _read(bootstrap, topic, 20)
    await consumer.stop()
    assert [r.value for r in records] == [f"i{i}".encode() for i in range(20)]


async def test_read_committed_consumer_sees_committed_transactions_only(bootstrap: str) -> None:
    topic = _topic()
    await _create_topic(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tx-{uuid.uuid4().hex[:8]}")
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(3):
                await producer.send(topic, f"committed-{i}".encode())
        await producer.begin_transaction()
        await producer.send(topic, b"aborted")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, b"after-abort")
    finally:
        await producer.stop()
    records, consumer = await _read(bootstrap, topic, 4, isolation="read_committed")
    try:
        extra = await consumer.getmany(timeout_ms=1000)
    finally:
        await consumer.stop()
    values = [r.value for r in records] + [r.value for batch in extra.values() for r in batch]
    assert values == [b"committed-0", b"committed-1", b"committed-2", b"after-abort"]


async def test_a_killed_broker_restarts_with_its_log_and_offsets(
    kafka_stack: EmbeddedStack, bootstrap: str, pytestconfig: pytest.Config
) -> None:
    """kill -9 and start again on the same ports: the log is on disk, so records and commits survive
    (Tansu loses both unless its log is in S3). ``start()`` returns once the broker answers again."""
    topic = _topic()
    await _create_topic(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(topic, f"kept-{i}".encode())
    finally:
        await producer.stop()
    records, consumer = await _read(bootstrap, topic, 5, group="restart-group")
    try:
        await consumer.commit({TopicPartition(topic, 0): 3})
    finally:
        await consumer.stop()
    broker = kafka_stack.process("kafka-broker")
    broker.kill()
    started = time.monotonic()
    broker.start()  # blocks the loop on purpose: nothing else runs in this test meanwhile
    restart = time.monotonic() - started
    _report(pytestconfig, f"1 node: restart after kill -9 answered in {restart:.1f}s")
    records, consumer = await _read(bootstrap, topic, 5, group="restart-group-2")
    try:
        assert [r.value for r in records] == [f"kept-{i}".encode() for i in range(5)]
    finally:
        await consumer.stop()
    check = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id="restart-group", enable_auto_commit=False)
    await check.start()
    try:
        assert await check.committed(TopicPartition(topic, 0)) == 3
    finally:
        await check.stop()
    assert restart < 120


def test_single_node_start_up_figures(kafka_stack: EmbeddedStack, pytestconfig: pytest.Config) -> None:
    kafka = kafka_stack.kafka
    assert kafka is not None and kafka.startup_seconds is not None
    rss = kafka.rss()
    _report(pytestconfig, f"1 node: start-up {kafka.startup_seconds:.1f}s, RSS {rss[0] / 2**20:.0f} MiB")
    assert len(rss) == 1 and 50 * 2**20 < rss[0] < 2**30  # -Xmx512m plus the JVM's own


def test_three_node_cluster_takes_acks_all_writes_with_min_isr_2(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    """RF 3 and ``min.insync.replicas=2``: an acks=all write needs a second replica's copy."""
    started = time.monotonic()
    stack = _start(tmp_path, 3, pytestconfig)
    try:
        kafka = stack.kafka
        assert kafka is not None and kafka.startup_seconds is not None
        rss = kafka.rss()
        _report(pytestconfig, f"3 nodes: start-up {kafka.startup_seconds:.1f}s, RSS MiB {[round(r / 2**20) for r in rss]}")
        assert len(rss) == 3
        assert time.monotonic() - started < CLUSTER_START_BUDGET_S
        bootstrap = str(stack.endpoints.kafka.bootstrap_servers)
        assert len(bootstrap.split(",")) == 3
        asyncio.run(_replicated_round_trip(bootstrap))
    finally:
        stack.stop()


async def _replicated_round_trip(bootstrap: str) -> None:
    topic = _topic()
    await _create_topic(bootstrap, topic, replicas=3, configs={"min.insync.replicas": "2"})
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        # create_topics returns once the controller has the topic; the brokers learn it a moment later.
        deadline = time.monotonic() + 15
        while True:
            [described] = await admin.describe_topics([topic])
            if described["partitions"] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        [partition] = described["partitions"]
        assert sorted(partition["replicas"]) == [1, 2, 3]
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        sent = [await producer.send_and_wait(topic, f"rf3-{i}".encode()) for i in range(10)]
    finally:
        await producer.stop()
    assert [m.offset for m in sent] == list(range(10))
    records, consumer = await _read(bootstrap, topic, 10)
    await consumer.stop()
    assert [r.value for r in records] == [f"rf3-{i}".encode() for i in range(10)]


def test_a_topic_read_by_assignment_is_found(bootstrap: str, tmp_path: Path) -> None:
    """Apache Kafka lists no topic for a metadata request that names none (Tansu lists them
    all), so a consumer that assigns partitions itself must ask for the topic's metadata:
    ``pipeline consume --partition --offset`` reported such a topic missing and read nothing
    (as would ``pipeline replay`` and ``pipeline top``), found running the suite on this broker."""
    topic = _topic()

    async def fill() -> tuple[set[int] | None, set[int] | None]:
        await fill_two_partitions(bootstrap, topic)
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await consumer.start()
        try:
            return await topic_partitions(consumer, topic), await topic_partitions(consumer, f"{topic}-absent")
        finally:
            await consumer.stop()

    assert asyncio.run(fill()) == ({0, 1}, None)
    env = {**os.environ, "PIPELINE_STATE_DIR": str(tmp_path)}
    args = ["--topic", topic, "--partition", "1", "--offset", "3", "--max-messages", "2", "--json", "--timeout", "10"]
    out = ok(run_cli(env, "consume", "-b", bootstrap, *args))
    records = [line for line in map(json.loads, out.stdout.splitlines()) if "offset" in line]
    assert [(r["partition"], r["offset"]) for r in records] == [(1, 3), (1, 4)], out.stdout
