"""The runtime every stage kind shares: consume, backpressure, rebalance, drain.

A stage kind (stateless batching, DALI, sequences) implements three hooks:
:meth:`StreamStage.handle` (one consumed record, with its outbox slot),
:meth:`StreamStage.tick` (time passed: release due work) and
:meth:`StreamStage.release` (hand over all formed work now: shutdown or
rebalance). Everything about Kafka delivery lives here and in
:mod:`pipeline.kafka.outbox`, once.

A worker that cannot confirm its group membership (a zombie resumed after its
partitions moved, :mod:`pipeline.kafka.membership`) handles no record, makes no
time-driven decision (:meth:`StreamStage.tick`) and sends nothing until the
coordinator has answered: outputs, checkpoints and commits all pass that fence.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.structs import TopicPartition

from pipeline.contract.errors import ErrorClass
from pipeline.kafka.clients import (
    failing_in_one_line,
)
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs, OutRecord, StageOutbox
from pipeline.kafka.records import ConsumedRecord
from pipeline.kafka.static_leave import leave_on_stop
from pipeline.kafka.unreadable import UnreadableRecord, UnreadableRecords
from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.record_trace import stage_tracer
from pipeline.settings import KafkaSettings
from workers.runtime.dead_letters import dead_letter_of
from workers.runtime.fencing import StageFence
from workers.runtime.flow_control import FlowControl
from workers.runtime.lag import ConsumerLag
from workers.runtime.lanes import LaneScheduler
from workers.runtime.outcomes import StageOutcomes
from workers.runtime.stage_clients import open_clients
from workers.runtime.stage_io import StageIO

log = logging.getLogger(__name__)

HEAVY_RECORD_BYTES = 256 * 1024

S = TypeVar("S")


def _in_one_line(stage: StreamStage, work: Awaitable[None]) -> Awaitable[None]:
    """``work``, its Kafka failures (an outage, an ACL's refusal) raised as one line naming the stage."""
    return failing_in_one_line(work, f"stage {stage.io.stage}", settings=stage.kafka, reads=stage.io.input_topics)


async def _closing_on_failure(stage: StreamStage, work: Awaitable[None]) -> None:
    """``work``; if it fails, the stage's clients are closed before the failure goes on (a
    stage refused at start never ran, so nothing of it would close them)."""
    try:
        await work
    except BaseException:
        await stage._close(clean=False)
        raise


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, stage: StreamStage) -> None:
        self._stage = stage

    # aiokafka logs and swallows listener errors; a stage must not run on with
    # unrestored state or un-handed-back work, so errors stop it instead.
    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self._stage._owned.difference_update(revoked)
        self._stage.fence.revocations += 1
        try:
            await self._hand_back(list(revoked))
        except Exception as exc:
            self._stage.fail(exc)
            raise

    async def _hand_back(self, partitions: list[TopicPartition]) -> None:
        """Finish what the stage holds for ``partitions``, commit it, let them go."""
        stage = self._stage
        if stage._outbox is None or not partitions:
            return
        await stage.release(partitions)  # completes (or abandons) the stage's work on them
        await stage.outbox.flush(stage.io.drain_timeout_s)
        await stage.outbox.commit(partitions)
        dropped = sum(stage.outbox.forget(tp) for tp in partitions)
        await stage.outbox.close_partitions(partitions)
        stage._fetch.forget(partitions)
        await stage.forget(partitions)
        log.info("%s: handed back %s (%d unfinished, replayed by next owner)", stage.io.stage, partitions, dropped)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("%s: assigned %s", self._stage.io.stage, sorted(map(str, assigned)))
        try:
            with self._stage.fence.restoring():
                if self._stage._outbox is not None:
                    await self._stage._outbox.open_partitions(list(assigned))  # before any state is read
                await self._stage.restore(list(assigned))
        except Exception as exc:
            self._stage.fail(exc)
            raise
        self._stage._owned.update(assigned)


class StreamStage(abc.ABC):
    """Consume ``io.input_topic`` as group ``io.group_id``; outputs go through the outbox."""

    def __init__(self, io: StageIO, kafka: KafkaSettings, metrics: PipelineMetrics) -> None:
        self.io, self.kafka, self.metrics = io, kafka, metrics
        self.ready = False
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._outbox: StageOutbox | None = None
        self._flow = FlowControl(io.stage, metrics, max_pending=io.max_pending, max_pending_bytes=io.max_pending_bytes)
        self.lag = ConsumerLag(io.stage, io.group_id, metrics)
        self._fatal: BaseException | None = None
        self.outcomes = StageOutcomes(io.stage, metrics)
        # Partitions whose records may be handled: assigned *and* restored. aiokafka calls the
        # rebalance listener from its coordinator task while the fetcher keeps fetching, so records
        # arriving before restore finishes or after a revocation wait, or are left to the next owner.
        self._owned: set[TopicPartition] = set()
        self.fence = StageFence(self.fail)
        self._fetch = UnreadableRecords(  # no crash loop on undecodable records, no move past a skipped offset
            kafka, max_fetch_bytes=io.limits.consumer_kwargs()["fetch_max_bytes"], on_gap=functools.partial(_count_gap, metrics, io.stage)
        )
        self._traces = stage_tracer(io.stage, io.group_id)  # None: tracing off
        self._lanes = LaneScheduler(io.stage, io.lanes, metrics) if io.lanes else None

    def fail(self, exc: BaseException) -> None:
        """Stop the stage: an error happened where it cannot be handled (a rebalance callback)."""
        self._fatal = exc

    # ------------------------------------------------------------------ hooks
    async def setup(self) -> None:
        """Connect to what the stage needs (Triton, DALI) before consuming."""

    async def teardown(self) -> None:
        """Release what :meth:`setup` acquired."""

    @abc.abstractmethod
    async def handle(self, record: ConsumedRecord, slot: Slot[Outputs]) -> None:
        """Process one record; complete ``slot`` now or later (never drop it)."""

    def accept(self, record: ConsumedRecord, slot: Slot[Outputs]) -> Awaitable[None] | None:
        """What the consume loop runs per record: :meth:`handle`'s coroutine (awaited under
        the fence's guard), or None from a stage that takes the record without waiting (the
        stateless stage only queues it for a batch: no coroutine per record)."""
        return self.handle(record, slot)

    async def tick(self) -> None:
        """Called at least every few milliseconds: release work that is due."""

    def next_tick_s(self) -> float:
        """How long the consume loop may wait for records before :meth:`tick` is due."""
        return 0.05

    def passing(self, record: ConsumedRecord) -> None:
        """Every record read from an input, before its outcome (unreadable ones too)."""

    async def release(self, partitions: list[TopicPartition] | None = None) -> None:
        """Finish (or abandon) all work on these partitions (all when None), within
        ``io.drain_timeout_s``: shutdown or rebalance. Abandoned records are replayed."""

    async def restore(self, partitions: list[TopicPartition]) -> None:
        """Partitions were assigned: load their state before their records are handled."""

    async def forget(self, partitions: list[TopicPartition]) -> None:
        """Partitions were handed back: drop their in-memory state."""

    async def abandon(self) -> None:
        """Shutdown, after the drain bound: stop whatever work is still running (a call
        waiting out an outage). Its records stay uncommitted, so the next owner replays
        them. Default: forget every owned partition (stages cancel their work there)."""
        await self.forget(list(self._owned))

    # ------------------------------------------------------------------ helpers for stages
    @property
    def outbox(self) -> StageOutbox:
        assert self._outbox is not None, "stage not started"
        return self._outbox

    def dead_letter(
        self, record: ConsumedRecord, slot: Slot[Outputs], error_class: ErrorClass | str, reason: str
    ) -> None:
        """Send the record, byte for byte, to the dead-letter topic with the reason."""
        out = dead_letter_of(record, stage=self.io.stage, topic=self.io.dead_letter_topic, error_class=error_class, reason=reason)
        self.outbox.complete(slot, out)
        log.info("%s: dead letter %s@%d: %s: %s", self.io.stage, record.topic, record.offset, out.error_class, reason)

    def oldest_unfinished(self) -> dict[TopicPartition, float]:
        """Per partition, the age (s) of its oldest record without an acknowledged outcome."""
        return self._outbox.oldest_unfinished() if self._outbox is not None else {}

    def copartitioned_topics(self) -> list[str]:
        """Topics whose partition ``p`` must be read together with input partition ``p``
        (checked at start): the inputs; stateful stages add their state topic."""
        return list(self.io.input_topics)

    async def refresh_lag(self) -> None:
        """Lag from the brokers' end offsets: a paused consumer fetches nothing, its lag still moves."""
        if self._consumer is not None:
            await self.lag.refresh(self._consumer, set(self._owned))

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's end offset as last fetched (None before the first fetch)."""
        return self._consumer.highwater(tp) if self._consumer is not None else None

    def fetched_at(self, tp: TopicPartition) -> int | None:
        """When the broker last answered a fetch for the partition (ms; None before the first)."""
        return self._consumer.last_poll_timestamp(tp) if self._consumer is not None else None

    async def produce_all_unowned(self, records: list[OutRecord], partition: int | None = None) -> None:
        """Produce outputs no input record owns (an expiry, an idle close, a tombstone; of input
        ``partition``, whose transaction they join under exactly-once): all handed to the producer
        first, then awaited together (one round trip), once the membership fence lets them
        (:meth:`StageFence.admit_unowned`)."""
        await self.fence.admit_unowned(self.io.stage, len(records))
        futures = await self.outbox.send_unowned(records, partition)  # a state record never after a newer one
        outcomes = await asyncio.gather(*futures, return_exceptions=True)  # all retrieved: none "never retrieved"
        if failed := [r for r in outcomes if isinstance(r, BaseException)]:
            raise failed[0]
        self.outcomes.acknowledged(records)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await self.setup()
        clients = await open_clients(self.io, self.kafka, self.metrics, self.outcomes, self.fence, _Rebalance(self))
        self._producer, self._consumer, self._outbox = clients.producer, clients.consumer, clients.outbox
        await _closing_on_failure(self, _in_one_line(self, self._consumer.start()))  # the first assignment
        self.ready = True

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop``; then finish, commit and close, in any state within
        ``drain_timeout_s`` + five ``close_timeout_s`` (a Triton outage included): what is
        not finished by then is abandoned uncommitted and replayed by the next owner."""
        if self._consumer is None:
            await self.start()
        outbox_stop = asyncio.Event()
        emitter = asyncio.create_task(self.outbox.run(outbox_stop), name=f"{self.io.stage}-outbox")
        try:
            await _in_one_line(self, self._consume(stop, emitter))
        finally:
            self.ready = False
            try:
                await asyncio.wait_for(self._drain(), timeout=self.io.drain_timeout_s)
            except (asyncio.TimeoutError, Exception) as exc:  # noqa: BLE001 - shutting down regardless
                log.warning("%s: drain incomplete (%r); unfinished records stay uncommitted", self.io.stage, exc)
            await self._bounded(self.abandon(), "abandon")
            outbox_stop.set()
            await self._bounded(asyncio.gather(emitter, return_exceptions=True), "outbox stop")
            if not emitter.done():
                emitter.cancel()
            await self._close(clean=stop.is_set())

    async def _bounded(self, work: Awaitable[object], what: str) -> None:
        await bounded(work, self.io.close_timeout_s, f"{self.io.stage}: {what}")

    async def _consume(self, stop: asyncio.Event, emitter: asyncio.Task[None]) -> None:
        consumer = self._consumer
        assert consumer is not None
        while not stop.is_set():
            if emitter.done():
                emitter.result()  # surfaces an outbox failure
            self.outbox.raise_if_failed()
            if self._fatal is not None:
                raise self._fatal
            if await self.fence.held():
                continue  # maybe a zombie: handle nothing, decide nothing, until the coordinator answers
            room = self._flow.update(consumer, self.outbox.pending(), self.outbox.pending_bytes())
            if self._lanes is not None:
                await self._lanes.apply(consumer, self._owned, self._flow.paused)
            # Poll even while paused: it keeps the group membership alive (max.poll.interval).
            batch = await self._fetch.getmany(
                consumer,
                timeout_ms=int(max(self.next_tick_s(), 0.001) * 1000),
                max_records=min(max(room, 1), 1000),
            )
            revocations = self.fence.revocations  # the batch belongs to the assignment of now
            for tp, records in batch.items():
                if not await self._may_handle(consumer, tp):
                    continue  # revoked meanwhile: its next owner consumes these records
                taken = await self._take(tp, records, revocations)
                self.outcomes.consumed(taken)
                if self._lanes is not None:
                    self._lanes.consumed(tp, taken)
                if records:
                    self.lag.observe(consumer, tp, records[-1].offset)
            if len(batch) < len(self._owned):  # some partition answered nothing: maybe at its end
                await _read_to_positions(consumer, self.outbox, self._owned - batch.keys())
            await self.fence.guard(self.tick())

    async def _take(self, tp: TopicPartition, records: list[ConsumedRecord], revocations: int) -> int:
        """Give one partition's fetched records, in order, to the stage; how many it took
        (fewer when the partition was revoked meanwhile: its next owner has the rest)."""
        stage = self.io.stage
        taken = 0
        for record in records:
            if tp not in self._owned or self.fence.revocations != revocations:
                break  # revoked while we were handling this batch (even if assigned again)
            slot = self.outbox.track(record, self._traces)
            taken += 1
            self.passing(record)
            if isinstance(record, UnreadableRecord):
                self.metrics.unreadable_records.labels(stage, record.cause).inc()
                self.dead_letter(record, slot, ErrorClass.UNREADABLE_RECORD, record.reason)
                continue
            try:
                if (waiting := self.accept(record, slot)) is not None:
                    await self.fence.guard(waiting)
            except Exception as exc:
                log.exception("%s: unexpected error on %s@%d", stage, tp, record.offset)
                self.dead_letter(record, slot, ErrorClass.INFERENCE_FAILED, f"internal error: {exc!r}")
            if slot.size > HEAVY_RECORD_BYTES:
                # Decoding ~16 MiB of JSON holds the loop ~0.5 s (json.loads keeps the GIL,
                # so a thread would not help): let heartbeats and the outbox run between.
                await asyncio.sleep(0)
        return taken

    async def _may_handle(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> bool:
        """Wait while ``tp`` is assigned but still being restored; False once it is not ours."""
        while tp not in self._owned:
            if tp not in consumer.assignment() or self._fatal is not None:
                return False
            await asyncio.sleep(0.01)
        return True

    async def _drain(self) -> None:
        """Release (at most two thirds of the bound, so flush and commit keep some), flush, commit."""
        if self._outbox is None:
            return
        started = time.monotonic()
        try:
            await asyncio.wait_for(self.release(None), timeout=self.io.drain_timeout_s * 2 / 3)
        except asyncio.TimeoutError:
            log.warning("%s: work still running after %.1fs of drain", self.io.stage, self.io.drain_timeout_s * 2 / 3)
        left = self.io.drain_timeout_s - (time.monotonic() - started)
        await self.outbox.flush(max(left, 0.0))
        await self.outbox.commit()

    async def _close(self, clean: bool) -> None:
        """Close consumer, producer and backend, each within ``close_timeout_s``; on a clean
        stop a static member then leaves its group (:mod:`pipeline.kafka.static_leave`)."""
        if self._consumer is not None:
            await self._bounded(self._consumer.stop(), "consumer close")
            if clean and (leave := leave_on_stop(self.kafka, self.io.group_id)) is not None:
                await self._bounded(leave, "leave group")
        if self._outbox is not None:
            await self._bounded(self._outbox.close_partitions(), "transactional producers close")
        if self._producer is not None:
            await self._bounded(self._producer.stop(), "producer close")
        await self._bounded(self.teardown(), "teardown")


async def _read_to_positions(consumer: AIOKafkaConsumer, outbox: StageOutbox, owned: set[TopicPartition]) -> None:
    """Partitions the last fetch brought nothing for: one with nothing unfinished may commit up
    to the consumer's position, past offsets that hold no record (a transaction's commit
    marker, aborted records), so a group that read a transactional topic to its end has no lag
    left. Partitions with records are skipped: the next record's commit covers a marker, so a
    stage under load pays nothing here."""
    assigned = consumer.assignment()
    for tp in owned:
        if tp in assigned and not outbox.pending(tp):
            outbox.read_to(tp, await consumer.position(tp))


def _count_gap(metrics: PipelineMetrics, stage: str, tp: TopicPartition, _expected: int, _answered: int, absent: bool) -> None:
    """A fetch answered past an offset (``absent``: a hole in the log, moved past): counted."""
    labels = (stage, tp.topic, str(tp.partition))
    metrics.offsets_skipped.labels(*labels).inc()
    if absent:
        metrics.offsets_absent.labels(*labels).inc()


async def bounded(work: Awaitable[object], timeout_s: float, what: str) -> None:
    """Await one shutdown step for at most ``timeout_s``; log and go on otherwise."""
    try:
        await asyncio.wait_for(work, timeout=timeout_s)
    except (asyncio.TimeoutError, Exception) as exc:  # noqa: BLE001 - shutting down regardless
        log.warning("%s did not finish in %.1fs (%r)", what, timeout_s, exc)
