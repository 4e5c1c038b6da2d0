"""A stage holds its consumer before the consumer starts.

aiokafka's ``start()`` of a subscribed consumer returns only after the first assignment,
and calls the rebalance listener inside it; so the stage's ``restore`` runs while ``start``
is still awaited. A stage that stored its consumer after the start restored without one:
a join found no reading starts and took an unread branch partition as read (3,307 windows
of a backlog expired, CI of 2026-11-27). Only the clients are faked here: the listener,
``StreamStage.start`` and ``restore`` are the stage's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import KafkaSettings
from workers.runtime import stream_stage as base
from workers.runtime.stage_clients import StageClients
from workers.runtime.stage_io import StageIO
from workers.runtime.stream_stage import StreamStage

TP = TopicPartition("in", 0)


class _Consumer:
    def __init__(self, listener: Any) -> None:
        self.listener = listener

    async def start(self) -> None:  # as aiokafka's: the first assignment happens inside it
        await self.listener.on_partitions_assigned([TP])


class _Outbox:
    async def open_partitions(self, partitions: list[TopicPartition]) -> None:
        """The plain outbox's: nothing to open (a transactional one starts producers here)."""


class _Stage(StreamStage):
    seen: object = "not restored"

    async def handle(self, record: ConsumedRecord, slot: Slot[Outputs]) -> None:
        raise AssertionError("no records in this test")

    async def restore(self, partitions: list[TopicPartition]) -> None:
        self.seen = self._consumer


def test_restore_on_the_first_assignment_sees_the_stages_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    made: dict[str, _Consumer] = {}

    async def open_clients(*args: Any) -> StageClients:
        made["consumer"] = _Consumer(args[-1])
        return StageClients(producer=object(), consumer=made["consumer"], outbox=_Outbox())  # type: ignore[arg-type]

    monkeypatch.setattr(base, "open_clients", open_clients)
    io = StageIO(stage="s", group_id="g", input_topic="in", output_topic="out", dead_letter_topic="dl")
    stage = _Stage(io, KafkaSettings(bootstrap_servers="x:1"), PipelineMetrics())
    asyncio.run(stage.start())
    assert stage.seen is made["consumer"], "restore ran with the consumer it restores for"
    assert stage._owned == {TP} and stage.ready
