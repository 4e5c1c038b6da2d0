"""A stateless stage with tenant quotas: the plain stage with the tenant gate in front.

The builder picks this class only for a stage with ``tenants:``; a stage without them
never runs the gate (:mod:`workers.stateless.features`). Every record passes
:class:`~workers.stateless.tenancy.gate.TenantGate` before it is decoded; delayed records that come
due pass it again on the stage's tick; on a rebalance or shutdown the records it holds go
back to the delay topic. With ``fair_share`` the stage batches with its own batcher: a
batch forms when a call can start and shares its rows among the waiting tenants.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import KafkaSettings
from workers.runtime.stage_io import StageIO
from workers.stateless.backend import BatchBackend
from workers.stateless.batch_runner import Pending
from workers.stateless.batching import DynamicBatcher
from workers.stateless.features import FeatureParts
from workers.stateless.stage import BatchingSettings, BatchingStage
from workers.stateless.tenancy.gate import StageHooks, TenancySettings, TenantGate, stage_batcher


class TenantBatchingStage(BatchingStage):
    """:class:`BatchingStage` behind a tenant gate (quotas, delays, fair batches)."""

    def __init__(
        self,
        io: StageIO,
        backend: BatchBackend,
        settings: BatchingSettings,
        *,
        tenancy: TenancySettings,
        kafka: KafkaSettings,
        metrics: PipelineMetrics,
        parts: FeatureParts = FeatureParts(),
    ) -> None:
        hooks = StageHooks(
            lambda slot, output: self.outbox.complete(slot, output),
            self.dead_letter,
            lambda: self._consumer,
            lambda: self._flow.paused,
        )
        self._gate = TenantGate(tenancy, io.stage, metrics, hooks)
        self._fair = tenancy.fair_share
        tenant_of = self._gate.tenant_or_none if self._fair else None
        super().__init__(io, backend, settings, kafka=kafka, metrics=metrics, parts=parts, tenant_of=tenant_of)

    def _new_batcher(self, max_rows: int, max_elements: int | None) -> DynamicBatcher[Pending]:
        if not self._fair:
            return super()._new_batcher(max_rows, max_elements)
        return stage_batcher(max_rows, self.settings, self._tasks, fair=True, max_elements=max_elements)

    def accept(self, record: ConsumedRecord, slot: Slot[Outputs]) -> Awaitable[None] | None:
        return self.handle(record, slot)  # the gate may wait (a quota's admission)

    async def handle(self, record: ConsumedRecord, slot: Slot[Outputs]) -> None:
        if await self._gate.admit(record, slot):
            self.queue(record, slot)
        # else: delayed, dead-lettered quota-exceeded, or held until due

    async def tick(self) -> None:
        for record, slot in self._gate.due():
            await self.handle(record, slot)  # delayed and now due: the quota again
        await super().tick()

    async def release(self, partitions: list[Any] | None = None) -> None:
        self._gate.return_held(partitions)  # held delayed records go back to the delay topic
        await super().release(partitions)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        super()._batch_done(task)
        if self._fair and self._batcher is not None:
            for batch in self._batcher.due():
                self._dispatch(batch)  # fair batches form when a call can start
