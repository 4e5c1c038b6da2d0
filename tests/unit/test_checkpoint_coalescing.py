"""Coalesced checkpoints: the rule that picks the chunk carrying a stream's checkpoint, and
the outbox's side of it (held slots are produced at once but committed past only once the
checkpoint covering them is acknowledged; that checkpoint leaves only after all their
results are acknowledged). The end-to-end crash test is in
tests/integration/test_sequence_stage.py (kill -9 with ``every_chunks`` > 1)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import TopicPartition
from pydantic import ValidationError

from pipeline.kafka.checkpoint_group import CheckpointGroup
from pipeline.kafka.outbox import Outbox, OutRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.runtime.stages import build_stages
from pipeline.settings import Endpoints, KafkaSettings, TritonSettings
from pipeline.topology import load_topology
from pipeline.topology.checkpoint import MAX_EVERY_CHUNKS, CheckpointConfig
from tests.unit.test_sequence_config import CHAIN
from tests.unit.test_topology import config_error, write
from workers.sequence import SequenceStage
from workers.sequence.checkpoints import CheckpointPolicy, PendingCheckpoint, checkpoint_due

TP = TopicPartition("chunks", 0)
POLICY = CheckpointPolicy(every_chunks=4, max_interval_ms=200)


# ------------------------------------------------------------------ the rule
def due(held: int, *, since: float | None = 0.0, now: float = 0.05, ending: bool = False, more: bool = True) -> bool:
    return checkpoint_due(POLICY, held=held, held_since=since, now=now, ending=ending, more_on_hand=more)


def test_a_chunk_with_more_of_its_stream_on_hand_is_held_until_every_chunks() -> None:
    assert [due(held) for held in range(5)] == [False, False, False, True, True]


def test_nothing_more_on_hand_checkpoints_at_once() -> None:
    """A stream in real time (one chunk at a time) is checkpointed per chunk, as before."""
    assert due(0, since=None, more=False)


def test_the_end_of_a_stream_always_carries_its_checkpoint() -> None:
    assert due(0, since=None, ending=True)


def test_the_oldest_held_chunk_bounds_the_wait() -> None:
    assert not due(1, since=10.0, now=10.199)
    assert due(1, since=10.0, now=10.201)


def test_every_chunks_1_is_a_checkpoint_per_chunk() -> None:
    one = CheckpointPolicy(every_chunks=1)
    assert checkpoint_due(one, held=0, held_since=None, now=0.0, ending=False, more_on_hand=True)


async def test_pending_opens_one_group_and_take_closes_it() -> None:
    pending = PendingCheckpoint()
    assert pending.take() is None and pending.held == 0
    group = pending.join()
    assert pending.join() is group and pending.since is not None
    assert pending.take() is group and pending.group is None and pending.since is None


def test_config_defaults_and_the_digest_bound() -> None:
    assert CheckpointConfig() == CheckpointConfig(every_chunks=16, max_interval_ms=200)
    assert CheckpointPolicy() == CheckpointPolicy(**CheckpointConfig().model_dump())
    with pytest.raises(ValidationError):
        CheckpointConfig(every_chunks=MAX_EVERY_CHUNKS + 1)  # replays beyond the digests: unverifiable
    with pytest.raises(ValidationError):
        CheckpointConfig(every_chunks=0)


# ------------------------------------------------------------------ the outbox
class Producer:
    """Stand-in for AIOKafkaProducer.send: every delivery waits until the test acks it."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, asyncio.Future[None]]] = []

    async def send(self, topic: str, *, value: bytes | None, **_: Any) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sent.append((value, fut))
        return fut

    def values(self) -> list[bytes | None]:
        return [value for value, _ in self.sent]

    async def ack(self, *values: bytes) -> None:
        for value, fut in self.sent:
            if value in values and not fut.done():
                fut.set_result(None)
        await asyncio.sleep(0.01)


class Consumer:
    def __init__(self) -> None:
        self.commits: list[int] = []

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.commits.append(offsets[TP].offset)


def record(offset: int) -> Any:
    return type("Rec", (), {"topic": TP.topic, "partition": TP.partition, "offset": offset, "key": b"k", "value": b"v"})


def result(name: str) -> OutRecord:
    return OutRecord(topic="results", key=b"k", value=name.encode(), headers=[])


def checkpoint(name: str) -> OutRecord:
    return OutRecord(topic="state", key=b"k", value=name.encode(), headers=[], after_acks=True, counts_as_result=False)


def outbox() -> tuple[Outbox, Producer, Consumer]:
    producer, consumer = Producer(), Consumer()
    return Outbox(producer, consumer, batch_sends=False), producer, consumer  # type: ignore[arg-type]


async def committed(box: Outbox, consumer: Consumer) -> int | None:
    await box.commit()
    return consumer.commits[-1] if consumer.commits else None


async def test_held_results_leave_at_once_and_are_committed_only_with_their_checkpoint() -> None:
    box, producer, consumer = outbox()
    group = CheckpointGroup()
    slots = [box.track(record(i)) for i in range(3)]
    box.complete(slots[0], result("r0"), group=group)
    box.complete(slots[1], result("r1"), group=group)
    box.complete(slots[2], (result("r2"), checkpoint("c0-2")), group=group)
    await box.emit_ready()
    assert producer.values() == [b"r0", b"r1", b"r2"]  # results: no waiting for any checkpoint
    await producer.ack(b"r0", b"r2")
    assert producer.values() == [b"r0", b"r1", b"r2"]  # r1 not acknowledged: the checkpoint waits
    assert await committed(box, consumer) is None  # r0 is acknowledged, but held
    await producer.ack(b"r1")
    assert producer.values() == [b"r0", b"r1", b"r2", b"c0-2"]  # one checkpoint for three chunks
    assert await committed(box, consumer) is None
    await producer.ack(b"c0-2")
    assert await committed(box, consumer) == 3


async def test_a_group_closed_alone_sends_its_checkpoint_after_the_held_results() -> None:
    """The stream's last slot took no checkpoint (a duplicate came last): the stage closes
    the group by itself; the held slots are committed once that checkpoint is acknowledged."""
    box, producer, consumer = outbox()
    group = CheckpointGroup()
    slots = [box.track(record(i)) for i in range(3)]
    box.complete(slots[0], result("r0"), group=group)
    box.complete(slots[1], result("r1"), group=group)
    box.complete(slots[2], ())  # a dropped duplicate: no outputs, acknowledged at once
    await box.emit_ready()
    box.groups.close(group, (checkpoint("c0-1"),))
    await asyncio.sleep(0.01)
    assert producer.values() == [b"r0", b"r1"]
    await producer.ack(b"r0", b"r1")
    assert producer.values() == [b"r0", b"r1", b"c0-1"]
    assert await committed(box, consumer) is None
    await producer.ack(b"c0-1")
    assert await committed(box, consumer) == 3
    assert await box.flush(1.0)


async def test_an_ungrouped_slot_behind_a_held_one_is_not_committed_past_it() -> None:
    """Streams share a partition: another stream's chunk after a held one waits in line."""
    box, producer, consumer = outbox()
    group = CheckpointGroup()
    held, other, closer = (box.track(record(i)) for i in range(3))
    box.complete(held, result("x0"), group=group)
    box.complete(other, (result("y0"), checkpoint("y-c0")))
    await box.emit_ready()
    await producer.ack(b"x0", b"y0")
    await producer.ack(b"y-c0")
    assert await committed(box, consumer) is None  # x0 still waits for its stream's checkpoint
    box.complete(closer, (result("x1"), checkpoint("x-c1")), group=group)
    await box.emit_ready()
    await producer.ack(b"x1")
    await producer.ack(b"x-c1")
    assert await committed(box, consumer) == 3


async def test_a_handed_back_partition_drops_its_groups_and_their_checkpoint() -> None:
    box, producer, _ = outbox()
    group = CheckpointGroup()
    held, closer = box.track(record(0)), box.track(record(1))
    box.complete(held, result("r0"), group=group)
    box.complete(closer, (result("r1"), checkpoint("c0-1")), group=group)
    await box.emit_ready()
    box.forget(TP)
    await producer.ack(b"r0", b"r1")
    assert producer.values() == [b"r0", b"r1"]  # the new owner writes the checkpoint, not us


# ------------------------------------------------------------------ the topology setting
def test_a_checkpoint_beyond_the_digests_is_an_error_at_its_line(tmp_path: Path) -> None:
    sequence = "    checkpoint: {every_chunks: 65}"
    path = write(tmp_path, CHAIN.format(dali_rate=16000, sequence=sequence))
    error = config_error(path)
    assert error.startswith(f"{path}:9: stages[1].checkpoint.every_chunks:"), error


def test_the_registry_hands_the_stage_its_checkpoint_policy(tmp_path: Path) -> None:
    sequence = "    checkpoint: {every_chunks: 4, max_interval_ms: 50}"
    topology = load_topology(write(tmp_path, CHAIN.format(dali_rate=16000, sequence=sequence)))
    endpoints = Endpoints(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"), triton=TritonSettings(grpc_url="127.0.0.1:9")
    )
    (stage,) = build_stages(topology, endpoints, PipelineMetrics(), only=["vad"])
    assert isinstance(stage, SequenceStage)
    assert stage.settings.checkpoint == CheckpointPolicy(every_chunks=4, max_interval_ms=50)


def test_under_exactly_once_every_chunk_carries_its_checkpoint(tmp_path: Path) -> None:
    """A transaction commits a chunk's results with the offsets they answer, so the state that
    covers them must be in it too: coalescing (slots held past their results) is off."""
    sequence = "    checkpoint: {every_chunks: 4, max_interval_ms: 50}"
    doc = CHAIN.format(dali_rate=16000, sequence=sequence) + "delivery: exactly_once\n"
    topology = load_topology(write(tmp_path, doc))
    endpoints = Endpoints(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"), triton=TritonSettings(grpc_url="127.0.0.1:9")
    )
    stages = build_stages(topology, endpoints, PipelineMetrics())
    assert [s.io.exactly_once for s in stages] == [True, True], "every stage of the topology commits in transactions"
    (stage,) = [s for s in stages if isinstance(s, SequenceStage)]
    assert stage.settings.checkpoint.every_chunks == 1
