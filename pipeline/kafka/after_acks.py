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
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.structs import TopicPartition

from pipeline.kafka.membership import LineFence
from pipeline.kafka.ordering import Slot
from pipeline.kafka.state_writes import StateWrites

#: The outbox's send of ``slot.output[index]``: (output, slot, index) -> its delivery future.
SendOne = Callable[[Any, Slot[Any], int], Awaitable[asyncio.Future[Any]]]
#: The producer's send of one record no slot carries: output -> its delivery future.
SendRecord = Callable[[Any], Awaitable[asyncio.Future[Any]]]


class AfterAcks:
    """Sends the after-acks tail of slots, per partition line in slot order."""

    def __init__(self, send: SendOne, fence: LineFence, send_record: SendRecord, writes: StateWrites) -> None:
        self._send = send
        self._send_record = send_record
        self._fence = fence
        self._writes = writes  # a key's state records in decision order across lines
        self._barriers: dict[TopicPartition, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

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

        return self._chain(slot, sent, rest)

    def send_alone(self, anchor: Slot[Any], records: list[Any], sent: list[asyncio.Future[Any]]) -> asyncio.Future[None]:
        """Send ``records`` (a group's checkpoint with no slot to ride on) once ``sent`` are
        acknowledged, in ``anchor``'s line order and through the fence as ``anchor``'s outputs."""

        async def rest() -> list[asyncio.Future[Any]]:
            admitted = await self._fence.admitted(anchor, len(records))
            return [await self._writes.write(out, functools.partial(self._send_record, out)) for out in records] if admitted else []

        return self._chain(anchor, sent, rest)

    def _chain(
        self, slot: Slot[Any], sent: list[asyncio.Future[Any]], rest: Callable[[], Awaitable[list[asyncio.Future[Any]]]]
    ) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        previous = self._barriers.get(slot.tp)
        enqueued: asyncio.Future[None] = loop.create_future()
        self._barriers[slot.tp] = enqueued
        done: asyncio.Future[None] = loop.create_future()
        task = asyncio.create_task(self._send_after(previous, enqueued, done, sent, rest))
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)
        return done

    async def _send_after(
        self,
        previous: asyncio.Future[None] | None,
        enqueued: asyncio.Future[None],
        done: asyncio.Future[None],
        sent: list[asyncio.Future[Any]],
        rest: Callable[[], Awaitable[list[asyncio.Future[Any]]]],
    ) -> None:
        try:
            if previous is not None:
                await asyncio.shield(previous)
            await asyncio.gather(*sent)
            delivered = await rest()
            enqueued.set_result(None)
            await asyncio.gather(*delivered)
        except Exception as exc:  # noqa: BLE001 - recorded; the stage stops on it
            if not enqueued.done():
                enqueued.set_exception(exc)
                enqueued.exception()  # retrieved here; the next slot re-raises it if any
            done.set_exception(exc)
        else:
            done.set_result(None)
