"""Outputs too large for their topic, replaced by claim-check dead letters before they leave.

The outbox gives a completed slot its outputs through :meth:`ClaimChecks.place`: most go
straight in; a slot with an output over its limit (:class:`OversizeHandler`) is instead
rewritten off the loop and off the line, by a task that stores the payload (the S3 store)
and only then makes the slot ready, so only that partition waits for the store. Kept apart
from :class:`pipeline.kafka.outbox.Outbox`, which asks :meth:`ClaimChecks.holds` before a
slot's first answer and waits for :meth:`ClaimChecks.running` in a flush.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka.structs import TopicPartition

from pipeline.kafka.ordering import Slot
from pipeline.kafka.out_record import Outputs, OversizeHandler

log = logging.getLogger(__name__)


class ClaimChecks:
    """The slots whose outputs are being replaced by claim checks, and the rule for which."""

    def __init__(self, oversize: OversizeHandler | None, on_done: Callable[[BaseException | None], None]) -> None:
        self._oversize = oversize
        self._on_done = on_done  # the outbox: a failure stops the stage; either way, emit again
        self._claiming: dict[Slot[Outputs], asyncio.Task[None]] = {}

    def holds(self, slot: Slot[Outputs]) -> bool:
        """Whether ``slot``'s outputs are being replaced (its first answer is taken)."""
        return slot in self._claiming

    def place(self, slot: Slot[Outputs], outputs: Outputs) -> None:
        """Give ``slot`` its outputs, or, when one is too large, start replacing them."""
        oversize = self._oversize
        if oversize is not None and any(oversize.too_large(out) for out in outputs):
            self._claiming[slot] = asyncio.create_task(self._claim(slot, outputs))
        else:
            slot.output = outputs

    async def _claim(self, slot: Slot[Outputs], outputs: Outputs) -> None:
        """Replace the oversized outputs by claim-check dead letters, then make the slot ready."""
        assert self._oversize is not None
        failure: BaseException | None = None
        try:
            slot.output = await self._oversize.replace_all(slot, outputs, self._oversize.too_large)
        except Exception as exc:
            log.exception("claim check for %s@%d failed", slot.tp, slot.offset)
            failure = exc
        finally:
            self._claiming.pop(slot, None)
        self._on_done(failure)

    def running(self) -> list[asyncio.Task[None]]:
        return list(self._claiming.values())

    def forget(self, tp: TopicPartition) -> None:
        """A revoked partition's claims are cancelled (its next owner redoes its records)."""
        for slot in [s for s in self._claiming if s.tp == tp]:
            self._claiming.pop(slot).cancel()
