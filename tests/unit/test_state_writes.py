"""A key's state records reach the changelog in decision order, whichever partition line
carries them (pipeline/kafka/state_writes.py). The case: a join's two branches arrive on
two input topics; the first branch's pending checkpoint is held up in its line while the
second branch's done marker leaves. Written after it, the stale pending state would be the
one a restore brings back (the broker kill -9 test on Apache Kafka, 2026-11-28)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.structs import TopicPartition

from pipeline.kafka.outbox import Outbox, OutRecord
from pipeline.kafka.state_writes import StateWrites

SCORE, CLASSIFY = TopicPartition("score.out", 1), TopicPartition("classify.out", 1)


class Producer:
    """Stand-in for AIOKafkaProducer.send: every delivery waits until the test acks it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, asyncio.Future[None]]] = []

    async def send(self, topic: str, *, value: bytes | None, **_: Any) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sent.append((topic, value, fut))
        return fut

    def values(self, topic: str) -> list[bytes | None]:
        return [value for t, value, _ in self.sent if t == topic]

    async def ack(self, *values: bytes) -> None:
        for _topic, value, fut in self.sent:
            if value in values and not fut.done():
                fut.set_result(None)
        await asyncio.sleep(0.01)


class Consumer:
    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, int]] = []

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.commits.append({tp: meta.offset for tp, meta in offsets.items()})


def record(tp: TopicPartition, offset: int) -> Any:
    return type("Rec", (), {"topic": tp.topic, "partition": tp.partition, "offset": offset, "key": b"k", "value": b"v"})


def state(value: str, version: int) -> OutRecord:
    return OutRecord(
        topic="join.state", key=b"ens-12", value=value.encode(), headers=[], partition=1,
        after_acks=True, counts_as_result=False, version=version,
    )  # fmt: skip


def result(value: str) -> OutRecord:
    return OutRecord(topic="results", key=b"ens-12", value=value.encode(), headers=[])


def test_an_older_write_of_a_key_is_superseded_once_a_newer_one_was_sent() -> None:
    async def scenario() -> None:
        writes = StateWrites()
        newer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        assert writes.superseded(state("pending", 1)) is None
        writes.sent(state("done", 2), newer)
        assert writes.superseded(state("pending", 1)) is newer
        assert writes.superseded(state("later", 3)) is None
        other = OutRecord(topic="join.state", key=b"ens-13", value=b"x", headers=[], version=0)
        assert writes.superseded(other) is None  # another key
        assert writes.superseded(result("r")) is None  # not a state record

    asyncio.run(scenario())


def test_a_pending_checkpoint_held_up_in_its_line_is_not_written_after_the_done_marker() -> None:
    async def scenario() -> None:
        producer, consumer = Producer(), Consumer()
        box = Outbox(producer, consumer, batch_sends=False)  # type: ignore[arg-type]
        before = box.track(record(SCORE, 7))  # an earlier record of the score line, still working
        pending = box.track(record(SCORE, 8))  # score arrives first: pending {score}
        done = box.track(record(CLASSIFY, 8))  # classify second: the result and the done marker
        box.complete(pending, (state("pending {score}", 1),))
        box.complete(done, (result("joined"), state("done", 2)))
        await box.emit_ready()
        await producer.ack(b"joined")
        assert producer.values("join.state") == [b"done"]
        box.complete(before, ())  # the score line moves on: its pending checkpoint is due now
        await box.emit_ready()
        await asyncio.sleep(0.01)
        assert producer.values("join.state") == [b"done"]  # superseded: never written after it
        await box.commit()
        assert consumer.commits[-1] == {SCORE: 8}  # not past the pending one: the marker is not durable yet
        await producer.ack(b"done")
        await box.commit()
        assert consumer.commits[-1] == {SCORE: 9, CLASSIFY: 9}

    asyncio.run(scenario())
