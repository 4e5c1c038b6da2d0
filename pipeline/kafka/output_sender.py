"""How a slot's outputs reach the broker: at their reply topic, and again once refused.

The outbox decides *when* a slot's outputs leave (from the head of its partition's line,
after-acks ones after the rest) and what their acknowledgement lets it commit; this module
decides *how* one leaves, which is where the broker's refusals are handled:

- an output asking for an allowed reply topic goes there (:mod:`pipeline.kafka.replies`);
- one ``send`` refuses as too large becomes a claim-check dead letter, one refused at its
  reply topic (deleted meanwhile: the client is gone) goes to the result topic instead;
- a slot whose delivery fails for one of those reasons (a topic made elsewhere with a
  smaller ``max.message.bytes``, a reply topic deleted after the send) is sent once more,
  so rewritten; a second refusal, or any other error, stops the stage.

Kept apart from :class:`pipeline.kafka.outbox.Outbox`, which sends through
:meth:`OutputSender.send` and asks :meth:`OutputSender.resend` of every failed delivery.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from pipeline.kafka.ordering import Slot
from pipeline.kafka.out_record import Outputs, OutRecord, OversizeHandler, ReplyRedirect

log = logging.getLogger(__name__)

#: The outbox's handler of a slot's delivery future (it settles the slot).
Delivered = Callable[[asyncio.Future[Any], Slot[Outputs]], None]


async def send_record(producer: AIOKafkaProducer, out: OutRecord) -> asyncio.Future[Any]:
    """Hand ``out`` to the producer; returns its delivery future."""
    fut: asyncio.Future[Any] = await producer.send(
        out.topic, value=out.value, key=out.key, headers=out.headers, partition=out.partition,
        timestamp_ms=out.timestamp_ms if out.timestamp_ms and out.timestamp_ms > 0 else None,
    )
    return fut


class OutputSender:
    """Sends one output of a slot, redirected and rewritten as the broker requires."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        *,
        oversize: OversizeHandler | None,
        replies: ReplyRedirect | None,
        delivery: set[asyncio.Future[Any]],
        delivered: Delivered,
    ) -> None:
        self.send_record = functools.partial(send_record, producer)
        self._oversize = oversize
        self._replies = replies
        self._delivery = delivery  # the outbox's in-flight deliveries (what a flush waits for)
        self._delivered = delivered
        self._resent: set[Slot[Outputs]] = set()
        self._senders: set[asyncio.Task[None]] = set()

    @property
    def redirects(self) -> bool:
        """Whether outputs may ask for a reply topic (a topology with ``reply_topics``)."""
        return self._replies is not None

    async def redirect(self, slot: Slot[Outputs]) -> None:
        """Move the slot's outputs that ask for an allowed reply topic there."""
        replies = self._replies
        if replies is not None and slot.output is not None and any(replies.asks(out) for out in slot.output):
            slot.output = tuple([await replies.redirect(out) for out in slot.output])

    async def send(self, out: OutRecord, slot: Slot[Outputs], index: int, *, redirected: bool = False) -> asyncio.Future[Any]:
        """Hand ``slot.output[index]`` to the producer (at its reply topic when it asks for an
        allowed one, unless ``redirected`` already); one it refuses as too large: claim check."""
        if self._replies is not None and not redirected:
            moved = await self._replies.redirect(out)
            if moved is not out:
                assert slot.output is not None
                slot.output = (*slot.output[:index], moved, *slot.output[index + 1 :])
                out = moved
        try:
            return await self.send_record(out)
        except MessageSizeTooLargeError as exc:
            if self._oversize is None or not (out.dead_letter or out.counts_as_result):
                raise
            log.warning("output for %s@%d too large to send (%s): claim check", slot.tp, slot.offset, exc)
            out = await self._oversize.replace(out, slot, index)
        except KafkaError:
            if out.redirected_from is None or self._replies is None:
                raise
            (out,) = await self._replies.redirect_back((out,))  # its reply topic is gone: the result topic
        assert slot.output is not None
        slot.output = (*slot.output[:index], out, *slot.output[index + 1 :])
        return await self.send_record(out)

    def resending(self) -> bool:
        """Whether any slot's outputs are being sent once more (their settling is theirs)."""
        return bool(self._resent)

    def resend(self, slot: Slot[Outputs], exc: BaseException | None) -> bool:
        """After the slot's delivery failed with ``exc`` (None: it did not): whether its
        outputs are being sent once more (their new delivery is handed to ``delivered``).
        False: the delivery stands, acknowledged or failed for good."""
        again = self._again(exc, slot) if exc is not None and slot not in self._resent else None
        if again is None:
            self._resent.discard(slot)
            return False
        self._resent.add(slot)
        task = asyncio.create_task(self._resend(slot, again))
        self._senders.add(task)
        task.add_done_callback(self._senders.discard)
        return True

    def _again(self, exc: BaseException, slot: Slot[Outputs]) -> Callable[[Outputs], Awaitable[Outputs]] | None:
        """How to send a slot's outputs once more after the broker refused them (None: the
        stage stops). Too large (a topic made elsewhere with a smaller ``max.message.bytes``):
        as claim checks. At a reply topic deleted meanwhile (client gone): at the result topic."""
        if isinstance(exc, MessageSizeTooLargeError) and (oversize := self._oversize) is not None:
            return lambda outs: oversize.replace_all(slot, outs, lambda out: out.dead_letter or out.counts_as_result)
        if self._replies is not None and any(out.redirected_from is not None for out in slot.output or ()):
            return self._replies.redirect_back
        return None

    async def _resend(self, slot: Slot[Outputs], again: Callable[[Outputs], Awaitable[Outputs]]) -> None:
        """Send the slot's outputs again, as ``again`` makes them (now after later outputs of
        the partition; the commit still waits for them), checkpoints after the rest."""
        assert slot.output is not None
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._delivery.add(done)
        try:
            slot.output = await again(slot.output)
            for part in ([o for o in slot.output if not o.after_acks], [o for o in slot.output if o.after_acks]):
                await asyncio.gather(*[await self.send_record(out) for out in part])
        except Exception as exc:  # noqa: BLE001 - recorded; the stage stops on it
            done.set_exception(exc)
        else:
            done.set_result(None)
        self._delivered(done, slot)
