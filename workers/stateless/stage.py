"""The stateless stage: one dynamic-batching loop for every stateless backend.

Per record: decode the Open Inference Protocol request, let the backend check
it (against the model's metadata, or the audio format), check its deadline,
and put it in the batcher. A released batch becomes one backend call (one
batched gRPC request to Triton, one DALI pipeline run); up to
``max_inflight_batches`` calls run at once. The results are split back per
request and complete their outbox slots, which produce them in arrival order
and commit past them once the broker has them.

A bad request is dead-lettered at decode/validation, before it can spoil a batch; the
failure policy of a call, and each request's outcome, are :mod:`workers.stateless.batch_runner`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.failure_policy import RetryPolicy
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.record_trace import record_trace
from pipeline.settings import KafkaSettings
from workers.runtime.stage_io import StageIO
from workers.runtime.stream_stage import StreamStage
from workers.stateless.backend import BatchBackend
from workers.stateless.batch_runner import BatchRunner, Pending, expired
from workers.stateless.batching import Batch, DynamicBatcher
from workers.stateless.call_slots import CallSlots
from workers.stateless.features import FeatureParts, assemble
from workers.stateless.intake import request_intake

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchingSettings:
    max_batch_size: int | None = None  # None: the backend's own limit
    max_queue_delay_s: float = 0.005
    hold_partial_batches: bool = False  # True: a partial batch waits max_queue_delay_s even with a call free
    max_inflight_batches: int = 4
    default_deadline_ms: int | None = None
    default_priority: int | None = None
    default_timeout_ms: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_request_bytes: int = 16 * 1024 * 1024
    max_batch_bytes: int | None = 64 * 1024 * 1024


class BatchingStage(StreamStage):
    """Dynamic batching in front of any :class:`BatchBackend`; the optional features run as
    the steps :func:`workers.stateless.features.assemble` picked for them, and only those."""

    def __init__(
        self,
        io: StageIO,
        backend: BatchBackend,
        settings: BatchingSettings,
        *,
        kafka: KafkaSettings,
        metrics: PipelineMetrics,
        parts: FeatureParts = FeatureParts(),
        tenant_of: Callable[[ConsumedRecord], str] | None = None,
    ) -> None:
        super().__init__(io, kafka, metrics)
        self.backend = backend
        self.tensor_map = parts.tensor_map
        self.settings = settings
        self.padding = parts.padding
        self.shadow = parts.shadow
        self.features = assemble(settings, parts, lanes=io.lanes, tenant_of=tenant_of)
        self.intake = request_intake(backend, settings.max_request_bytes, self.features.requests)
        self.runner = BatchRunner(
            io, backend, settings.retry, metrics, self.tensor_map, self.features.results,
            lambda slots, outputs: self.outbox.complete_all(slots, outputs), self.dead_letter, self.outcomes.retried,
        )  # fmt: skip
        self._warmup = parts.warmup
        self._batcher: DynamicBatcher[Pending] | None = None
        # Round-robin across models when batches queue (task routes); FIFO with one model.
        self._inflight = CallSlots(settings.max_inflight_batches)
        self._tasks: set[asyncio.Task[None]] = set()

    def _new_batcher(self, max_rows: int, max_elements: int | None) -> DynamicBatcher[Pending]:
        s = self.settings
        return DynamicBatcher(max_rows, s.max_queue_delay_s, s.max_batch_bytes, max_elements)

    # ------------------------------------------------------------------ setup
    async def setup(self) -> None:
        limit = await self.backend.setup()
        max_rows = self.settings.max_batch_size or limit or 1
        if limit and max_rows > limit:
            raise BadRequest(
                ErrorClass.BATCH_TOO_LARGE,
                f"stage {self.io.stage}: max_batch_size {max_rows} exceeds {self.backend.name}'s {limit}",
            )
        if self.padding is not None:
            self.padding.bind()
        max_elements = self.padding.max_batch_elements if self.padding is not None else None
        self._batcher = self._new_batcher(max_rows, max_elements)
        device = self.backend.device
        if device:
            self.metrics.device.labels(self.io.stage, device).set(1)
        if self._warmup:
            await self.backend.warmup()
        if self.shadow is not None:
            self.shadow.start(self.produce_all_unowned)
        log.info(
            "%s: %s ready (batching up to %d rows, %.1f ms delay, %d in flight)",
            self.io.stage,
            self.backend.name,
            max_rows,
            self.settings.max_queue_delay_s * 1000,
            self.settings.max_inflight_batches,
        )

    async def teardown(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.shadow is not None:
            await self.shadow.close()
        await self.backend.close()

    # ------------------------------------------------------------------ per record
    async def handle(self, record: ConsumedRecord, slot: Slot[Outputs]) -> None:
        self.queue(record, slot)

    def accept(self, record: ConsumedRecord, slot: Slot[Outputs]) -> Awaitable[None] | None:
        self.queue(record, slot)
        return None  # nothing waited for: the consume loop runs no coroutine per record

    def queue(self, record: ConsumedRecord, slot: Slot[Outputs]) -> None:
        """Decode, check and queue the record for a batch (or dead-letter it); nothing here
        waits: the batch's call is a task of its own."""
        assert self._batcher is not None
        try:
            admitted = self.intake.admit(record)
        except BadRequest as bad:
            self.dead_letter(record, slot, bad.error_class, bad.reason)
            return
        request = admitted.request
        if expired(request):
            self.dead_letter(record, slot, ErrorClass.DEADLINE_EXCEEDED, "deadline exceeded before batching")
            return
        rows = self.backend.rows(request)
        pending = Pending(
            record, slot, request, admitted.message, admitted.prepared, rows, time.monotonic(), admitted.length, admitted.tenant
        )
        if (trace := record_trace(slot)) is not None:
            trace.queued()
        size = len(record.value or b"")
        key = self.backend.batch_key(request)
        for batch in self._batcher.add(key, pending, rows, size=size, elements=admitted.elements):
            self._dispatch(batch)

    # ------------------------------------------------------------------ batches
    async def tick(self) -> None:
        assert self._batcher is not None
        for batch in self._batcher.due():
            self._dispatch(batch)
        self._release_idle()  # everything fetched is handled: a free call slot takes it now

    def _release_idle(self) -> None:
        """Work conserving (unless ``hold_partial_batches``): what is queued goes to the free
        call slots at once; batches form only while every call is busy."""
        if self._batcher is None or self.settings.hold_partial_batches:
            return
        room = self.settings.max_inflight_batches - len(self._tasks)
        for batch in self._batcher.take_for_free_calls(room) if room > 0 else ():
            self._dispatch(batch)

    def next_tick_s(self) -> float:
        due = self._batcher.next_due() if self._batcher is not None else None
        if due is None:
            return 0.05
        return max(0.0, min(0.05, due - time.monotonic()))

    async def release(self, partitions: list[Any] | None = None) -> None:
        if self._batcher is None:
            return
        for batch in self._batcher.drain():
            self._dispatch(batch)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.io.drain_timeout_s)

    async def abandon(self) -> None:
        """Shutdown past the drain bound: cancel the batches still running (waiting out an
        outage, say). Their slots stay open, so their records are never committed here."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.io.close_timeout_s)

    def _dispatch(self, batch: Batch[Pending]) -> None:
        task = asyncio.create_task(self._run_batch(batch.items), name=f"{self.io.stage}-batch")
        self._tasks.add(task)
        task.add_done_callback(self._batch_done)
        for observe in self.features.observers:
            observe(batch.items)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._release_idle()  # a call slot is free: what waited for one goes now

    async def _run_batch(self, items: list[Pending]) -> None:
        first = items[0].request
        async with self._inflight.slot((first.model_name, first.model_version)):
            gauge = self.metrics.inflight_batches.labels(self.io.stage)
            held = self.metrics.inflight_bytes.labels(self.io.stage)
            size = sum(item.slot.size for item in items)
            gauge.inc()
            held.inc(size)
            try:
                await self.runner.serve(items)
            except Exception as exc:
                log.exception("%s: batch failed unexpectedly", self.io.stage)
                for item in items:
                    self.runner.fail(item, ErrorClass.INFERENCE_FAILED, f"internal error: {exc!r}")
            finally:
                gauge.dec()
                held.dec(size)

