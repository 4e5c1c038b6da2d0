"""The ordered outbox: results leave in arrival order; offsets follow acknowledgements.

A stage hands every consumed record to :meth:`Outbox.track` and later
completes its slot with the output record (a result or a dead letter). The
outbox produces ready outputs from the head of each partition's line, in
order, and commits a partition's offset only past records whose outputs the
broker has acknowledged. That is the whole at-least-once argument: a crash
before the acknowledgement replays the record; nothing is committed early.

With a ``fence`` (:mod:`pipeline.kafka.membership`), nothing is produced or committed
while the worker's group membership is unconfirmed (a resumed zombie): outputs wait,
and those of partitions handed back meanwhile are dropped, for their new owner redoes them.

How one output leaves (its reply topic; rewritten and sent again when the broker refuses it)
is :mod:`pipeline.kafka.output_sender`; when offsets may go to the broker, :mod:`pipeline.kafka.commits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, TopicPartition

from pipeline.kafka.after_acks import AfterAcks
from pipeline.kafka.checkpoint_group import CheckpointGroup, CheckpointGroups
from pipeline.kafka.claim_checks import ClaimChecks
from pipeline.kafka.commits import commit_acknowledged
from pipeline.kafka.membership import POLL_S, LineFence, MembershipLease
from pipeline.kafka.ordering import OrderedOffsets, Slot, SlotTrace
from pipeline.kafka.out_record import Outputs, OutRecord, OversizeHandler, ReplyRedirect
from pipeline.kafka.output_sender import OutputSender, send_record
from pipeline.kafka.record_batches import RecordBatches
from pipeline.kafka.state_writes import StateWrites

# The outbox's vocabulary (out_record.py) and send_record (output_sender.py): imported from here.
__all__ = [
    "OnAcknowledged",
    "OutRecord",
    "Outbox",
    "Outputs",
    "OversizeHandler",
    "ReplyRedirect",
    "SlotTracer",
    "StageOutbox",
    "send_record",
]

log = logging.getLogger(__name__)

OnAcknowledged = Callable[[Sequence[OutRecord]], None]
"""Told the outputs the broker acknowledged: one slot's, or a whole record batch's."""


class SlotTracer(Protocol):
    """Starts a consumed record's trace (``pipeline.observability.record_trace.RecordTracer``)."""

    def consumed(self, record: Any) -> SlotTrace[Outputs]: ...


class CheckpointCloser(Protocol):
    def close(self, group: CheckpointGroup, checkpoint: Sequence[Any]) -> None: ...


class StageOutbox(Protocol):
    """What a stage asks of its outbox: :class:`Outbox`, or under exactly-once delivery the
    :class:`pipeline.kafka.transactions.TransactionalOutbox` of one outbox per transaction."""

    @property
    def groups(self) -> CheckpointCloser: ...
    def track(self, record: ConsumerRecord[bytes, bytes], tracer: SlotTracer | None = None) -> Slot[Outputs]: ...
    def complete(self, slot: Slot[Outputs], output: OutRecord | Outputs, *, group: CheckpointGroup | None = None) -> None: ...
    def complete_all(self, slots: Sequence[Slot[Outputs]], outputs: Sequence[OutRecord]) -> None: ...
    def pending(self, tp: TopicPartition | None = None) -> int: ...
    def read_to(self, tp: TopicPartition, position: int) -> None: ...
    def pending_bytes(self) -> int: ...
    def oldest_unfinished(self, now: float | None = None) -> dict[TopicPartition, float]: ...
    def raise_if_failed(self) -> None: ...
    async def send_unowned(self, records: list[OutRecord], partition: int | None = None) -> list[asyncio.Future[Any]]: ...
    async def run(self, stop: asyncio.Event, commit_interval_s: float = 0.2) -> None: ...
    async def flush(self, timeout_s: float) -> bool: ...
    async def commit(self, partitions: list[TopicPartition] | None = None) -> None: ...
    def forget(self, tp: TopicPartition) -> int: ...
    async def open_partitions(self, partitions: list[TopicPartition]) -> None: ...
    async def close_partitions(self, partitions: list[TopicPartition] | None = None) -> None: ...


class Outbox:
    """Ordered emission and safe commits for one consumer's partitions."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        consumer: AIOKafkaConsumer,
        *,
        on_acknowledged: OnAcknowledged | None = None,
        oversize: OversizeHandler | None = None,
        fence: MembershipLease | None = None,
        replies: ReplyRedirect | None = None,
        batch_sends: bool = True,
    ) -> None:
        self._producer = producer
        # Plain outputs into one open record batch per destination partition (else a send() each).
        self._batches = RecordBatches(producer, self._batch_delivered, self._batch_sent) if batch_sends else None
        self._emitting = asyncio.Lock()
        self._fence = LineFence(fence)
        self._claims = ClaimChecks(oversize, self._claimed)  # oversized outputs, to the S3 store first
        self._consumer = consumer
        self._offsets: OrderedOffsets[Outputs] = OrderedOffsets()
        self._on_ack = on_acknowledged
        self._delivery: set[asyncio.Future[Any]] = set()
        # How each output leaves: its reply topic, claim checks and the resend of refused ones.
        self._sender = OutputSender(
            producer, oversize=oversize, replies=replies, delivery=self._delivery, delivered=self._delivered
        )
        self._writes = StateWrites()  # a key's checkpoints in decision order, whichever line carries them
        self._after_acks = AfterAcks(self._sender.send, self._fence, self._sender.send_record, self._writes)
        self.groups = CheckpointGroups(lambda slot: self._acknowledge_all([slot]), self._after_acks, self._delivery)
        self._changed = asyncio.Event()
        self._failure: BaseException | None = None

    # ------------------------------------------------------------------ tracking
    def track(self, record: ConsumerRecord[bytes, bytes], tracer: SlotTracer | None = None) -> Slot[Outputs]:
        """The record's slot in its partition's line (with its trace when ``tracer`` is given)."""
        size = len(record.key or b"") + len(record.value or b"")
        slot = self._offsets.add(TopicPartition(record.topic, record.partition), record.offset, size)
        if tracer is not None:
            slot.trace = tracer.consumed(record)
        return slot

    def complete(self, slot: Slot[Outputs], output: OutRecord | Outputs, *, group: CheckpointGroup | None = None) -> None:
        """Give a slot its outputs (possibly none); they are produced once everything before is
        (in a ``group``, committed past only with the group's checkpoint: ``CheckpointGroups``)."""
        if slot.output is not None or self._claims.holds(slot):
            return  # first answer wins (e.g. a deadline fired while the batch returned)
        outputs = (output,) if isinstance(output, OutRecord) else tuple(output)
        self.groups.register(slot, outputs, group)
        self._ready(slot, outputs)
        self._changed.set()

    def complete_all(self, slots: Sequence[Slot[Outputs]], outputs: Sequence[OutRecord]) -> None:
        """:meth:`complete` for one batch's slots, one output each and in no checkpoint group (a
        stateless stage's results): one pass and one wake-up of the emitter for the batch."""
        for slot, out in zip(slots, outputs, strict=True):
            if slot.output is None and not self._claims.holds(slot):  # first answer wins
                self._ready(slot, (out,))
        self._changed.set()

    def _ready(self, slot: Slot[Outputs], outputs: Outputs) -> None:
        """The slot's outputs, carrying its record span's traceparent, ready to leave (or first
        rewritten as claim checks, when one is too large)."""
        self._claims.place(slot, outputs if slot.trace is None else slot.trace.completed(outputs))

    def _claimed(self, failure: BaseException | None) -> None:
        if failure is not None:
            self._failure = failure
        self._changed.set()

    def pending(self, tp: TopicPartition | None = None) -> int:
        return self._offsets.pending(tp)

    def read_to(self, tp: TopicPartition, position: int) -> None:
        """Every record of ``tp`` before the consumer's ``position`` was tracked (:meth:`OrderedOffsets.read_to`)."""
        self._offsets.read_to(tp, position)

    def pending_bytes(self) -> int:
        return self._offsets.pending_bytes()

    def oldest_unfinished(self, now: float | None = None) -> dict[TopicPartition, float]:
        """Per partition line, the age (s) of its oldest record not yet acknowledged (0 when
        none): a line's head that does not move is a wedged partition (the watchdog's input)."""
        return self._offsets.head_ages(time.monotonic() if now is None else now)

    def raise_if_failed(self) -> None:
        if (failure := self._failure or self.groups.failure) is not None:
            raise failure

    # ------------------------------------------------------------------ emission
    async def emit_ready(self) -> None:
        """Produce the outputs of every ready slot at the head of its partition's line."""
        async with self._emitting:  # one pass at a time (a rebalance's flush meets the run loop's)
            if self._fence.closed():
                return  # held in their lines: sent once membership is confirmed, else dropped by forget()
            batches = self._batches
            if batches is not None:
                batches.new_pass()
            for tp in self._offsets.partitions():
                if batches is None:
                    for slot in self._offsets.emittable(tp):
                        await self._emit_alone(slot)
                else:
                    await self._emit_batched(list(self._offsets.emittable(tp)), batches)

    async def send_unowned(self, records: list[OutRecord], partition: int | None = None) -> list[asyncio.Future[Any]]:
        """Hand outputs no slot owns (an expiry, an idle close, a tombstone; of input ``partition``)
        to the producer, a state record only if no newer write of its key went before it; their deliveries."""
        producer = self._producer
        return [
            await self._writes.write(
                r, functools.partial(producer.send, r.topic, value=r.value, key=r.key, headers=r.headers, partition=r.partition)
            )
            for r in records
        ]

    async def _emit_batched(self, run: list[Slot[Outputs]], batches: RecordBatches) -> None:
        """A partition line's ready run, in order: each plain output (one record for its slot)
        appended to its destination partition's open batch, placed for the whole run at once;
        the others sent alone (redirected to their reply topics first, if any, either way)."""
        if not run:
            return
        if self._sender.redirects:  # no coroutine per record where no output can ask for one
            for slot in run:
                await self._sender.redirect(slot)
        plain = [_plain(slot.output) for slot in run]
        placed = batches.place([out for out in plain if out is not None])
        places = iter(placed)
        for slot, out in zip(run, plain, strict=True):
            partition = next(places) if out is not None else None
            if out is not None and partition is not None:
                if batches.append(out, slot, partition) or await batches.start(out, slot, partition):
                    continue
            await self._emit_alone(slot, redirected=True)
            batches.after_alone({o.topic for o in slot.output or ()})

    def _batch_sent(self, delivery: asyncio.Future[Any]) -> None:
        self._delivery.add(delivery)
        delivery.add_done_callback(self._delivery.discard)

    def _batch_delivered(self, exc: BaseException | None, slots: list[Slot[Outputs]]) -> None:
        """A record batch's answer. Acknowledged, with no slot in a checkpoint group or being
        sent again (a stateless stage's every batch): its slots are settled together, the
        commit bookkeeping and the counts once per batch; otherwise slot by slot."""
        if exc is None and self.groups.empty() and not self._sender.resending():
            self._acknowledge_all(slots)
            return
        for slot in slots:
            self._settle(slot, exc)

    async def _emit_alone(self, slot: Slot[Outputs], *, redirected: bool = False) -> None:
        """Hand the slot's outputs to the producer one by one (after-acks ones once the rest
        are acknowledged); the slot is acknowledged when all are."""
        assert slot.output is not None
        split = next((i for i, out in enumerate(slot.output) if out.after_acks), len(slot.output))
        now, later = slot.output[:split], slot.output[split:]
        sent = [await self._sender.send(out, slot, i, redirected=redirected) for i, out in enumerate(now)]
        done: asyncio.Future[Any]
        if later:
            done = self._after_acks.send(slot, [*sent, *self.groups.covered(slot)], split)  # in slot order
        elif sent:
            # One output (the common case) needs no gather: watch its own future.
            done = sent[0] if len(sent) == 1 else asyncio.gather(*sent)
        else:
            self.groups.acknowledge(slot)
            return
        self._delivery.add(done)
        done.add_done_callback(functools.partial(self._delivered, slot=slot))

    def _delivered(self, fut: asyncio.Future[Any], slot: Slot[Outputs]) -> None:
        self._delivery.discard(fut)
        if not fut.cancelled():
            self._settle(slot, fut.exception())

    def _settle(self, slot: Slot[Outputs], exc: BaseException | None) -> None:
        """The broker took the slot's outputs (``exc`` None) or refused them."""
        if self._sender.resend(slot, exc):
            return  # sent once more, rewritten: settled again by that delivery
        if exc is not None:
            # aiokafka already retried; an undeliverable output must not be committed past.
            log.error("output for %s@%d not delivered: %s", slot.tp, slot.offset, exc)
            self._failure = exc
            self.groups.failed(slot, exc)
            return
        self.groups.acknowledge(slot)

    def _acknowledge_all(self, slots: list[Slot[Outputs]]) -> None:
        """The broker has these slots' outputs: commit bookkeeping, traces and counts."""
        self._offsets.acknowledge_all(slots)
        for slot in slots:
            if slot.trace is not None:
                slot.trace.acknowledged()
        if self._on_ack is not None:
            self._on_ack([out for slot in slots for out in slot.output or ()])
        self._changed.set()

    async def run(self, stop: asyncio.Event, commit_interval_s: float = 0.2) -> None:
        """Emit as outputs become ready and commit periodically, until ``stop``."""
        last_commit = time.monotonic()
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=commit_interval_s)
            self._changed.clear()
            await self.emit_ready()
            if time.monotonic() - last_commit >= commit_interval_s:
                await self.commit()
                last_commit = time.monotonic()

    async def flush(self, timeout_s: float) -> bool:
        """Emit every ready slot that can leave (in order) and wait for its delivery.

        Slots the stage never completed (work handed back unfinished) stay
        pending and block the slots behind them; they are replayed by whoever
        consumes the partition next. True when nothing is left in flight.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            await self.emit_ready()
            held = self.pending() > 0 and self._fence.closed()  # outputs wait for the lease
            if held and self._fence.hopeless():
                return False  # nothing more leaves before the partitions are handed back
            waiting = {*self._delivery, *self._claims.running()}
            if not waiting and not held:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            timeout = min(remaining, POLL_S) if held else remaining
            await (asyncio.wait(waiting, timeout=timeout) if waiting else asyncio.sleep(timeout))

    async def commit(self, partitions: list[TopicPartition] | None = None) -> None:
        """Commit each partition (of ``partitions``; None: all) past its acknowledged outputs."""
        await commit_acknowledged(self._consumer, self._offsets, self._fence, partitions)

    async def open_partitions(self, partitions: list[TopicPartition]) -> None:
        """Partitions were assigned, before their state is restored (:mod:`pipeline.kafka.transactions`)."""

    async def close_partitions(self, partitions: list[TopicPartition] | None = None) -> None:
        """Partitions (None: all) were handed back and forgotten, or the stage closes."""

    def forget(self, tp: TopicPartition) -> int:
        """Drop a revoked partition's unfinished slots (its next owner replays them)."""
        self._claims.forget(tp)
        self.groups.forget(tp)
        return self._fence.handed_back(self._offsets.forget(tp))


def _plain(outputs: Outputs | None) -> OutRecord | None:
    """A slot's output when it is one record that may share a batch (none sent after acks)."""
    if outputs is None or len(outputs) != 1 or outputs[0].after_acks:
        return None
    return outputs[0]
