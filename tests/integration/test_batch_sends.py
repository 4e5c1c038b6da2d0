"""The outbox's record batches (aiokafka's batch API) against the real broker.

The outbox appends the outputs ready in one pass to one record batch per destination
partition instead of one ``send`` each (``pipeline/kafka/record_batches.py``). What
consumers see must not change: every output once, on the partition ``send`` would have
picked for its key, and a partition line's outputs in slot order, also when plain
outputs mix with ones sent alone (over 64 KiB, several outputs to a slot). The same
workload runs once per mode, and the two topics read back must agree record for record.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.kafka.clients import ensure_topics, make_consumer, make_producer
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outbox, Outputs, OutRecord
from pipeline.kafka.record_batches import BATCHABLE_BYTES
from pipeline.settings import KafkaSettings
from tests.helpers.kafka_io import collect

pytestmark = [pytest.mark.kafka]

LINES = 3  # input partitions
SLOTS = 400  # per line
KEYS = 37


def _outputs(line: int, offset: int, topics: dict[str, str]) -> Outputs:
    """Slot (line, offset)'s outputs: mostly one small result; some large (sent alone),
    dead letters, two outputs, or none."""
    n = line * SLOTS + offset
    key = f"key-{n % KEYS}".encode()
    tag = f"{line}:{offset}".encode()
    headers = [("slot", tag)]
    if n % 97 == 5:
        return ()
    if n % 53 == 7:
        return (
            OutRecord(topics["out"], key, tag + b"|a", headers),
            OutRecord(topics["side"], key, tag + b"|b", headers),
        )
    if n % 41 == 3:
        return (OutRecord(topics["dead"], key, tag, headers, dead_letter=True, error_class="bad-request"),)
    if n % 29 == 11:
        return (OutRecord(topics["out"], key, tag + b"|" + b"x" * (BATCHABLE_BYTES + 1), headers),)
    return (OutRecord(topics["out"], key, tag, headers),)


async def _run_outbox(
    settings: KafkaSettings, topics: dict[str, str], *, batch_sends: bool, seed: int, max_batch_size: int
) -> Outbox:
    """Track every slot, complete them in a shuffled order with passes in between, flush."""
    producer = make_producer(settings, max_batch_size=max_batch_size)
    await producer.start()
    consumer = make_consumer(settings, group_id=None)  # never started: these tests commit nothing
    try:
        outbox = Outbox(producer, consumer, batch_sends=batch_sends)
        slots: list[tuple[Slot[Outputs], Outputs]] = []
        for line in range(LINES):
            for offset in range(SLOTS):
                record: Any = SimpleNamespace(topic=topics["in"], partition=line, offset=offset, key=b"k", value=b"v")
                slots.append((outbox.track(record), _outputs(line, offset, topics)))
        order = list(range(len(slots)))
        random.Random(seed).shuffle(order)
        for i, index in enumerate(order):
            slot, outputs = slots[index]
            outbox.complete(slot, outputs)
            if i % 50 == 0:
                # A rebalance's flush can meet the run loop's pass: both at once.
                await asyncio.gather(outbox.emit_ready(), outbox.emit_ready())
        assert await outbox.flush(30.0), "outputs still in flight after 30 s"
        outbox.raise_if_failed()
        return outbox
    finally:
        await producer.stop()
        await consumer.stop()


def _topics(mode: str) -> dict[str, str]:
    run = uuid.uuid4().hex[:8]
    return {name: f"batch-sends-{run}-{mode}-{name}" for name in ("in", "out", "side", "dead")}


# 16 KiB batches fill up: a record sent alone cannot join the open batch, so send() opens a
# newer one for it, and the next plain output must not slip into the older open batch.
@pytest.mark.parametrize("max_batch_size", [1 << 20, 16 * 1024], ids=["1MiB-batches", "16KiB-batches"])
async def test_batched_outputs_match_per_record_sends(kafka_bootstrap: str, max_batch_size: int) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    runs = {}
    for mode, batch_sends in (("batched", True), ("single", False)):
        topics = _topics(mode)
        await ensure_topics(settings, topics.values(), partitions=4)
        outbox = await _run_outbox(settings, topics, batch_sends=batch_sends, seed=7, max_batch_size=max_batch_size)
        assert outbox.pending() == 0, "every slot acknowledged"
        expected = sum(len(_outputs(line, o, topics)) for line in range(LINES) for o in range(SLOTS))
        got = await collect(
            kafka_bootstrap, [topics["out"], topics["side"], topics["dead"]],
            done=lambda recs, n=expected: len(recs) >= n, timeout=60,
        )
        assert len(got.records) == expected, f"{mode}: {len(got.records)} of {expected} outputs"
        runs[mode] = (topics, got)

    placed: dict[str, dict[tuple[str, bytes], int]] = {}
    for mode, (topics, got) in runs.items():
        kinds = {topic: name for name, topic in topics.items()}
        placed[mode] = {}
        per_destination: dict[tuple[str, int, int], list[int]] = {}
        for record in got.records:
            tag = dict(record.headers)["slot"]
            line, offset = (int(part) for part in tag.decode().split(":"))
            kind = kinds[record.topic]
            key = (kind, tag)
            assert key not in placed[mode], f"{mode}: {key} delivered twice"
            placed[mode][key] = record.partition
            assert record.key is not None
            assert record.value is not None and record.value.startswith(tag)
            per_destination.setdefault((kind, record.partition, line), []).append(offset)
        for where, offsets in per_destination.items():
            assert offsets == sorted(offsets), f"{mode}: {where} out of slot order"

    # Same outputs, each on the same partition: the batches place records as send() does.
    assert placed["batched"] == placed["single"]
    assert len({p for p in placed["batched"].values()}) == 4, "keys spread over every partition"
