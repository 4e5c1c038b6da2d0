"""Outputs that leave only after the earlier outputs of their slot are acknowledged.

A state checkpoint (``OutRecord.after_acks``) must never be visible before the results it
accounts for, or a restore could run ahead of what was produced. Per partition line they
are serialised in slot order, each sent once its own slot's results are acknowledged and
the previous slot's checkpoints are *enqueued* (the producer keeps a partition's order,
so waiting for their acknowledgement would only serialise the round trips).

They are also what a zombie must never write late: a checkpoint landing after the new
owner's rolls the key back in the compacted changelog. So before they are handed to the
producer they pass the outbox's membership fence (:class:`pipeline.kafka.membership.LineFence`):
they wait while the lease is unconfirmed and are dropped if their partition is handed back.
Kept apart from :class:`pipeline.kafka.outbox.Outbox`, which calls :meth:`AfterAcks.send`.

Coalesced checkpoints (:mod:`pipeline.kafka.checkpoint_group`) wait for more than their own
slot's results: ``sent`` then also holds the results of the group's held slots; a group
closed with no slot to carry its checkpoint goes through :meth:`AfterAcks.send_alone`, in
the same per-line order.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.structs import TopicPartition

from pipeline.kafka.membership import LineFence
from pipeline.kafka.ordering import Slot
from pipeline.kafka.state_writes import StateWrites

#: The outbox's send of ``slot.output[index]``: (output, slot, index) -> its delivery future.
SendOne = Callable[[Any, Slot[Any], int], Awaitable[asyncio.Future[Any]]]
#: The producer's send of one record no slot carries: output -> its delivery future.
SendRecord = Callable[[Any], Awaitable[asyncio.Future[Any]]]


@dataclass(eq=False)
class _Step:
    """One slot's after-acks outputs, waiting in its partition line."""

    sent: list[asyncio.Future[Any]]  # acknowledged first
    rest: Callable[[], Awaitable[list[asyncio.Future[Any]]]]  # then these are handed to the producer
    done: asyncio.Future[None]  # resolved once they are acknowledged (or dropped by the fence)


class AfterAcks:
    """Sends the after-acks tail of slots, per partition line in slot order.

    Each line has one pump: a task that takes the line's steps in order while there are any,
    so a line of ready steps is sent in one pass (a chained task per slot advanced one slot
    per loop turn: a join restarted under load waited 14 s for its first transaction commit)."""

    def __init__(self, send: SendOne, fence: LineFence, send_record: SendRecord, writes: StateWrites) -> None:
        self._send = send
        self._send_record = send_record
        self._fence = fence
        self._writes = writes  # a key's state records in decision order across lines
        self._lines: dict[TopicPartition, deque[_Step]] = {}
        self._pumps: dict[TopicPartition, asyncio.Task[None]] = {}
        self._failed: dict[TopicPartition, BaseException] = {}  # a line that failed fails what follows

    def send(self, slot: Slot[Any], sent: list[asyncio.Future[Any]], split: int) -> asyncio.Future[None]:
        """Send ``slot.output[split:]`` once ``sent`` (the slot's outputs before ``split``, and
        those of the slots its checkpoint covers) are acknowledged. The future resolves when
        they are acknowledged, or dropped by the fence; it fails with whatever failed."""

        async def rest() -> list[asyncio.Future[Any]]:
            assert slot.output is not None
            if not await self._fence.admitted(slot, len(slot.output) - split):
                return []
            delivered = []
            for i, out in enumerate(slot.output):
                if i >= split:
                    delivered.append(await self._writes.write(out, functools.partial(self._send, out, slot, i)))
            return delivered

        return self._queue(slot.tp, sent, rest)

    def send_alone(
        self, anchor: Slot[Any], records: list[Any], sent: list[asyncio.Future[Any]]
    ) -> asyncio.Future[None]:
        """Send ``records`` (a group's checkpoint with no slot to ride on) once ``sent`` are
        acknowledged, in ``anchor``'s line order and through the fence as ``anchor``'s outputs."""

        async def rest() -> list[asyncio.Future[Any]]:
            admitted = await self._fence.admitted(anchor, len(records))
            return (
                [await self._writes.write(out, functools.partial(self._send_record, out)) for out in records]
                if admitted
                else []
            )

        return self._queue(anchor.tp, sent, rest)

    def _queue(
        self,
        tp: TopicPartition,
        sent: list[asyncio.Future[Any]],
        rest: Callable[[], Awaitable[list[asyncio.Future[Any]]]],
    ) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if (failure := self._failed.get(tp)) is not None:
            done.set_exception(failure)
            return done
        self._lines.setdefault(tp, deque()).append(_Step(sent, rest, done))
        if tp not in self._pumps:
            self._pumps[tp] = asyncio.create_task(self._pump(tp), name=f"after-acks-{tp.topic}-{tp.partition}")
        return done

    async def _pump(self, tp: TopicPartition) -> None:
        """The line's steps in order: each once its ``sent`` are acknowledged, handed to the
        producer before the next is looked at (the producer keeps a partition's order, so the
        next need not wait for their acknowledgement)."""
        line = self._lines[tp]
        try:
            while line:
                step = line[0]
                try:
                    if all(f.done() for f in step.sent):
                        for f in step.sent:
                            f.result()  # raises what failed (a cancelled one leaves the line waiting, as gather does)
                    else:
                        await asyncio.gather(*step.sent)
                    delivered = await step.rest()
                except Exception as exc:  # noqa: BLE001 - recorded; the stage stops on it
                    self._fail(tp, exc)
                    return
                line.popleft()
                _resolve_when_acknowledged(step.done, delivered)
        finally:
            del self._pumps[tp]

    def _fail(self, tp: TopicPartition, exc: BaseException) -> None:
        """A step failed: it and every later one of the line fail with it, now and to come."""
        self._failed[tp] = exc
        line = self._lines.pop(tp, deque())
        for step in line:
            if not step.done.done():
                step.done.set_exception(exc)


def _resolve_when_acknowledged(done: asyncio.Future[None], delivered: list[asyncio.Future[Any]]) -> None:
    if not delivered:
        done.set_result(None)
        return

    def settle(acks: asyncio.Future[Any]) -> None:
        if done.done():
            return
        if acks.cancelled():
            done.cancel()
        elif (exc := acks.exception()) is not None:
            done.set_exception(exc)
        else:
            done.set_result(None)

    asyncio.gather(*delivered).add_done_callback(settle)
