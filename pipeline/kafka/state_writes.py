"""State checkpoints of one key reach the changelog in the order they were decided.

A checkpoint leaves with the slot of the record that changed the key's state, in that
slot's partition line. A join's key takes records from several input topics, so from
several lines, and lines emit independently: the checkpoint of the first branch's arrival
(pending, one branch) could be written *after* the done marker its second branch's
arrival wrote, when the first line was held up. The compacted changelog keeps the last
write, so a restore brought back a pending window for a join already answered, whose
first branch was committed past and never came again: it expired, and the request got a
dead letter besides its result (the broker kill -9 test on Apache Kafka, 2026-11-28,
`join-result.state[1]`: `done` at offset 13, then `pending {score}` at 19).

So each state record carries its ``version`` (the store's count of decisions, in the order
they were made), and this table keeps, per (topic, key), the newest version handed to the
producer and its delivery. A write older than one already handed over is *superseded*: it
is not written, and its slot waits for the newer write's delivery instead (the newer state
accounts for everything the older one did, so nothing is committed before it is durable).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline.kafka.out_record import OutRecord

MAX_KEYS = 200_000
"""Keys remembered; beyond it, the oldest keys whose write was delivered are forgotten
(a write that old and still unsent would have failed its send timeout long before)."""


class StateWrites:
    """The newest state write handed to the producer per (topic, key), and its delivery."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self._latest: OrderedDict[tuple[str, bytes], tuple[int, asyncio.Future[Any]]] = OrderedDict()
        self._max_keys = max_keys

    def superseded(self, out: OutRecord) -> asyncio.Future[Any] | None:
        """The delivery of a newer write of ``out``'s key already handed to the producer (then
        ``out`` must not be written), else None."""
        if out.version is None or out.key is None:
            return None
        latest = self._latest.get((out.topic, out.key))
        return latest[1] if latest is not None and latest[0] > out.version else None

    def sent(self, out: OutRecord, delivery: asyncio.Future[Any]) -> None:
        """``out`` was handed to the producer; ``delivery`` resolves when the broker has it."""
        if out.version is None or out.key is None:
            return
        key = (out.topic, out.key)
        latest = self._latest.get(key)
        if latest is None or latest[0] < out.version:
            self._latest[key] = (out.version, delivery)
            self._latest.move_to_end(key)
            self._prune()

    async def write(self, out: OutRecord, send: Callable[[], Awaitable[asyncio.Future[Any]]]) -> asyncio.Future[Any]:
        """Send ``out`` with ``send``, unless a newer write of its key was sent already: then
        that one's delivery stands for this one."""
        if (newer := self.superseded(out)) is not None:
            return newer
        delivery = await send()
        self.sent(out, delivery)
        return delivery

    def _prune(self) -> None:
        while len(self._latest) > self._max_keys:
            key, (_version, delivery) = next(iter(self._latest.items()))
            if not delivery.done():
                break
            del self._latest[key]
