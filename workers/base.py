"""The runtime every stage kind shares: consume, backpressure, rebalance, drain.

A stage kind (stateless batching, DALI, sequences) implements three hooks:
:meth:`StreamStage.handle` (one consumed record, with its outbox slot),
:meth:`StreamStage.tick` (time passed: release due work) and
:meth:`StreamStage.release` (hand over all formed work now: shutdown or
rebalance). Everything about Kafka delivery lives here and in
:mod:`pipeline.kafka.outbox`, once.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.structs import TopicPartition

from pipeline.contract.errors import ErrorClass, one_line
from pipeline.contract.records import dead_letter_headers
from pipeline.kafka.clients import make_consumer, make_producer
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outbox, Outputs, OutRecord
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import KafkaSettings
from pipeline.state import KeyedStateStore, StateCodec, StateLimits

log = logging.getLogger(__name__)

S = TypeVar("S")

@dataclass(frozen=True)
class StageIO:
    """Where a stage reads and writes, and how much it may hold."""

    stage: str
    group_id: str
    input_topic: str
    output_topic: str
    dead_letter_topic: str
    max_pending: int = 4096
    drain_timeout_s: float = 20.0
    emit_requests: bool = False
    """True when the output feeds another stage: outputs are encoded as its requests."""
    more_input_topics: tuple[str, ...] = ()
    """Joins read several co-partitioned topics; partition p of each goes to one worker."""

    @property
    def input_topics(self) -> list[str]:
        return [self.input_topic, *self.more_input_topics]


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, stage: StreamStage) -> None:
        self._stage = stage

    # aiokafka logs and swallows listener errors; a stage must not run on with
    # unrestored state or un-handed-back work, so errors stop it instead.
    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self._stage._owned.difference_update(revoked)
        try:
            await self._stage.hand_back(list(revoked))
        except Exception as exc:
            self._stage.fail(exc)
            raise

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("%s: assigned %s", self._stage.io.stage, sorted(map(str, assigned)))
        try:
            await self._stage.restore(list(assigned))
        except Exception as exc:
            self._stage.fail(exc)
            raise
        self._stage._owned.update(assigned)


class StreamStage(abc.ABC):
    """Consume ``io.input_topic`` as group ``io.group_id``; outputs go through the outbox."""

    def __init__(self, io: StageIO, kafka: KafkaSettings, metrics: PipelineMetrics) -> None:
        self.io = io
        self.kafka = kafka
        self.metrics = metrics
        self.ready = False
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._outbox: Outbox | None = None
        self._paused = False
        self._fatal: BaseException | None = None
        # Labelled children looked up once: a label lookup per record costs microseconds.
        self._requests_total = metrics.requests.labels(io.stage)
        self._results_total = metrics.results.labels(io.stage)
        self._end_to_end = metrics.end_to_end.labels(io.stage)
        self._pending_gauge = metrics.pending_requests.labels(io.stage)
        # Partitions whose records may be handled: assigned *and* restored. aiokafka
        # calls the rebalance listener from its coordinator task while the fetcher
        # keeps fetching, so records can arrive before restore finishes or after a
        # revocation; they wait, or are left to the partition's next owner.
        self._owned: set[TopicPartition] = set()

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

    async def tick(self) -> None:
        """Called at least every few milliseconds: release work that is due."""

    def next_tick_s(self) -> float:
        """How long the consume loop may wait for records before :meth:`tick` is due."""
        return 0.05

    async def release(self, partitions: list[TopicPartition] | None = None) -> None:
        """Finish (or abandon) all work on these partitions (all when None), within
        ``io.drain_timeout_s``: shutdown or rebalance. Abandoned records are replayed."""

    async def restore(self, partitions: list[TopicPartition]) -> None:
        """Partitions were assigned: load their state before their records are handled."""

    async def forget(self, partitions: list[TopicPartition]) -> None:
        """Partitions were handed back: drop their in-memory state."""

    # ------------------------------------------------------------------ helpers for stages
    def keyed_state(
        self, topic: str, codec: StateCodec[S], *, ttl_s: float, max_keys: int | None
    ) -> KeyedStateStore[S]:
        """This stage's keyed state, checkpointed to ``topic`` (see :mod:`pipeline.state`)."""
        return KeyedStateStore(kafka=self.kafka, topic=topic, codec=codec, limits=StateLimits(ttl_s, max_keys))

    @property
    def outbox(self) -> Outbox:
        assert self._outbox is not None, "stage not started"
        return self._outbox

    def dead_letter(
        self, record: ConsumedRecord, slot: Slot[Outputs], error_class: ErrorClass | str, reason: str
    ) -> None:
        """Send the record, byte for byte, to the dead-letter topic with the reason."""
        error = ErrorClass(error_class)
        headers = dead_letter_headers(
            list(record.headers or ()),
            stage=self.io.stage,
            error_class=error,
            reason=one_line(reason),
            now_ms=int(time.time() * 1000),
        )
        self.outbox.complete(
            slot,
            OutRecord(
                topic=self.io.dead_letter_topic,
                key=record.key,
                value=record.value,
                headers=headers,
                dead_letter=True,
                error_class=error.value,
                request_timestamp_ms=record.timestamp,
            ),
        )
        log.info("%s: dead letter %s@%d: %s: %s", self.io.stage, record.topic, record.offset, error.value, reason)

    async def produce_all_unowned(self, records: list[OutRecord]) -> None:
        """Produce outputs no input record owns (an expiry, an idle close, a tombstone):
        all handed to the producer first, then awaited together (one round trip)."""
        assert self._producer is not None
        futures = [
            await self._producer.send(r.topic, value=r.value, key=r.key, headers=r.headers, partition=r.partition)
            for r in records
        ]
        await asyncio.gather(*futures)
        for record in records:
            self._acknowledged(record)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await self.setup()
        self._producer = make_producer(self.kafka)
        await self._producer.start()
        extra: dict[str, object] = {}
        if self.io.more_input_topics:
            # Range gives a worker the same partition numbers of every topic (co-partitioning).
            extra["partition_assignment_strategy"] = (RangePartitionAssignor,)
        self._consumer = make_consumer(self.kafka, group_id=self.io.group_id, **extra)
        self._outbox = Outbox(self._producer, self._consumer, on_acknowledged=self._acknowledged)
        self._consumer.subscribe(self.io.input_topics, listener=_Rebalance(self))
        await self._consumer.start()
        self.ready = True

    def _acknowledged(self, out: OutRecord) -> None:
        if not out.counts_as_result:
            return
        if out.dead_letter:
            self.metrics.dead_letters.labels(self.io.stage, out.error_class or "unknown").inc()
        else:
            self._results_total.inc()
        if out.request_timestamp_ms:
            latency = time.time() - out.request_timestamp_ms / 1000
            self._end_to_end.observe(max(latency, 0.0))

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop``; then hand over and commit everything (bounded by drain_timeout_s)."""
        if self._consumer is None:
            await self.start()
        outbox_stop = asyncio.Event()
        emitter = asyncio.create_task(self.outbox.run(outbox_stop), name=f"{self.io.stage}-outbox")
        try:
            await self._consume(stop, emitter)
        finally:
            self.ready = False
            await self._drain()
            outbox_stop.set()
            await asyncio.gather(emitter, return_exceptions=True)
            await self._close()

    async def _consume(self, stop: asyncio.Event, emitter: asyncio.Task[None]) -> None:
        consumer = self._consumer
        assert consumer is not None
        stage = self.io.stage
        while not stop.is_set():
            if emitter.done():
                emitter.result()  # surfaces an outbox failure
            self.outbox.raise_if_failed()
            if self._fatal is not None:
                raise self._fatal
            room = self.io.max_pending - self.outbox.pending()
            self._pending_gauge.set(self.outbox.pending())
            if room <= 0:
                self._pause(consumer)
            elif self._paused and room >= self.io.max_pending // 2:
                self._resume(consumer)
            # Poll even while paused: it keeps the group membership alive (max.poll.interval).
            batch = await consumer.getmany(
                timeout_ms=int(max(self.next_tick_s(), 0.001) * 1000),
                max_records=min(max(room, 1), 1000),
            )
            for tp, records in batch.items():
                if not await self._may_handle(consumer, tp):
                    continue  # revoked meanwhile: its next owner consumes these records
                for record in records:
                    if tp not in self._owned:
                        break  # revoked while we were handling this batch
                    slot = self.outbox.track(record)
                    self._requests_total.inc()
                    try:
                        await self.handle(record, slot)
                    except Exception as exc:
                        log.exception("%s: unexpected error on %s@%d", stage, tp, record.offset)
                        self.dead_letter(record, slot, ErrorClass.INFERENCE_FAILED, f"internal error: {exc!r}")
                if records:
                    self._observe_lag(consumer, tp, records[-1].offset)
            await self.tick()

    async def _may_handle(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> bool:
        """Wait while ``tp`` is assigned but still being restored; False once it is not ours."""
        while tp not in self._owned:
            if tp not in consumer.assignment() or self._fatal is not None:
                return False
            await asyncio.sleep(0.01)
        return True

    def _observe_lag(self, consumer: AIOKafkaConsumer, tp: TopicPartition, last_offset: int) -> None:
        """Records between what we just fetched and the partition's end (high watermark)."""
        high = consumer.highwater(tp)
        if high is not None:
            lag = max(0, high - (last_offset + 1))
            self.metrics.consumer_lag.labels(self.io.stage, tp.topic, str(tp.partition)).set(lag)

    def _pause(self, consumer: AIOKafkaConsumer) -> None:
        if not self._paused:
            consumer.pause(*consumer.assignment())
            self._paused = True
            self.metrics.paused.labels(self.io.stage).set(1)

    def _resume(self, consumer: AIOKafkaConsumer) -> None:
        consumer.resume(*consumer.assignment())
        self._paused = False
        self.metrics.paused.labels(self.io.stage).set(0)

    async def hand_back(self, partitions: list[TopicPartition]) -> None:
        """Rebalance: finish what we hold for ``partitions``, commit it, let them go."""
        if self._outbox is None or not partitions:
            return
        await self.release(partitions)  # completes (or abandons) the stage's work on them
        await self.outbox.flush(self.io.drain_timeout_s)
        await self.outbox.commit(partitions)
        dropped = sum(self.outbox.forget(tp) for tp in partitions)
        await self.forget(partitions)
        log.info("%s: handed back %s (%d unfinished, replayed by next owner)", self.io.stage, partitions, dropped)

    async def _drain(self) -> None:
        if self._outbox is None:
            return
        await self.release(None)
        await self.outbox.flush(self.io.drain_timeout_s)
        await self.outbox.commit()

    async def _close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
        await self.teardown()
