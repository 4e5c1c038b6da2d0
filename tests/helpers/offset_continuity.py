"""Drive the embedded broker the way that made it skip offsets, and read through a real stage.

Several producers write one partition at once (the broker then sometimes answers a fetch
at offset X from X+1: :mod:`pipeline.kafka.continuity`), while a stage tails it. The stage
is the project's stage runtime (:class:`workers.runtime.stream_stage.StreamStage`: its consumer, its guarded
fetch, outbox and commits) with a handler that echoes each record's value, so its output
must equal its input record by record.

``PIPELINE_TEST_OFFSET_GUARD=off`` runs the same thing with aiokafka's own unpacking, to
show the loss the guard prevents (a switch of this helper only, never of the product).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiokafka.consumer.fetcher as aiokafka_fetcher
from aiokafka import AIOKafkaProducer

from pipeline.kafka import continuity
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs, OutRecord
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import KafkaSettings
from workers.runtime.stage_io import StageIO
from workers.runtime.stream_stage import StreamStage

GUARD_SWITCH = "PIPELINE_TEST_OFFSET_GUARD"


class EchoStage(StreamStage):
    """A stage whose outcome for a record is its value, key and offset, on the output topic."""

    async def handle(self, record: ConsumedRecord, slot: Slot[Outputs]) -> None:
        headers = [("source-offset", str(record.offset).encode())]
        self.outbox.complete(slot, OutRecord(self.io.output_topic, record.key, record.value, headers))


@dataclass
class Traffic:
    """What the producers wrote, per partition in offset order."""

    written: dict[int, list[bytes]] = field(default_factory=dict)


@contextlib.contextmanager
def offset_guard(enabled: bool) -> Iterator[None]:
    """The guard as the product installs it, or (``enabled=False``) aiokafka's own unpacking."""
    original = continuity.GuardedPartitionRecords.__mro__[1]
    if enabled:
        continuity.install()
        yield
        return
    install = continuity.install
    continuity.install = lambda: None  # type: ignore[assignment]
    aiokafka_fetcher.PartitionRecords = original
    try:
        yield
    finally:
        continuity.install = install  # type: ignore[assignment]
        continuity.install()


def guard_enabled() -> bool:
    return os.environ.get(GUARD_SWITCH, "on") != "off"


async def produce_concurrently(
    bootstrap: str, topic: str, *, producers: int, partitions: int, rate_per_s: float, duration_s: float
) -> Traffic:
    """``producers`` clients, producer ``i`` writing partition ``i % partitions`` at about
    ``rate_per_s`` (exponential gaps, as independent clients do), every value unique."""
    rng = random.Random(25)
    by_offset: dict[int, dict[int, bytes]] = {p: {} for p in range(partitions)}

    async def one(i: int) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
        await producer.start()
        try:
            partition, deadline, n = i % partitions, time.monotonic() + duration_s, 0
            pending: list[tuple[bytes, asyncio.Future[Any]]] = []
            while time.monotonic() < deadline:
                value = f"p{i}-{n}".encode()
                pending.append((value, await producer.send(topic, value, key=f"p{i}".encode(), partition=partition)))
                n += 1
                await asyncio.sleep(rng.expovariate(rate_per_s))
            for value, future in pending:
                by_offset[partition][(await future).offset] = value
        finally:
            await producer.stop()

    await asyncio.gather(*(one(i) for i in range(producers)))
    return Traffic({p: [values[o] for o in sorted(values)] for p, values in by_offset.items()})


def echo_stage(settings: KafkaSettings, topic: str, output: str, metrics: PipelineMetrics) -> EchoStage:
    io = StageIO(stage="echo", group_id=f"{topic}.echo", input_topic=topic, output_topic=output,
                 dead_letter_topic=f"{topic}.dlq")
    return EchoStage(io, settings, metrics)
