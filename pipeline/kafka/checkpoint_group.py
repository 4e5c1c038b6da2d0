"""Several slots accounted for by one later checkpoint (coalesced checkpoints).

A stateful stage that checkpoints a key every N records instead of every record still
sends each record's results at once, but the records whose state is not checkpointed yet
must not be committed past: after a crash they are replayed and re-applied from the last
checkpoint. So their slots are *held*: their outputs leave in order as usual, and once the
broker acknowledged them the slot waits, unacknowledged in its partition's line, until the
group's checkpoint (carried by a later slot of the same line, or sent on its own by
:meth:`pipeline.kafka.outbox.Outbox.close_group`) is acknowledged. The checkpoint in turn
is sent only after every held slot's outputs are acknowledged, so a restored state never
runs ahead of the results it accounts for.

Pure bookkeeping, driven by the outbox; the stage only opens a group per key and hands it
to :meth:`Outbox.complete` with each slot.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.kafka.after_acks import AfterAcks
from pipeline.kafka.ordering import Slot

log = logging.getLogger(__name__)


class CheckpointGroup:
    """Held slots of one key (all in one partition line) and the futures that order them."""

    def __init__(self) -> None:
        self.held: list[Slot[Any]] = []
        self._results: dict[Slot[Any], asyncio.Future[None]] = {}
        self.closed = False
        """A checkpoint was attached (to a slot, or sent alone): no more slots join."""

    def __len__(self) -> int:
        return len(self.held)

    def hold(self, slot: Slot[Any]) -> None:
        """``slot``'s acknowledgement waits for the group's checkpoint."""
        assert not self.closed, "a closed group takes no more slots"
        self.held.append(slot)
        self._results[slot] = asyncio.get_running_loop().create_future()

    def holds(self, slot: Slot[Any]) -> bool:
        return slot in self._results

    def results_acknowledged(self, slot: Slot[Any], exc: BaseException | None = None) -> None:
        """The broker acknowledged ``slot``'s own outputs (or they failed for good)."""
        fut = self._results.get(slot)
        if fut is None or fut.done():
            return
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)
            fut.exception()  # retrieved: the closing checkpoint re-raises it

    def results(self) -> list[asyncio.Future[None]]:
        """What the checkpoint waits for: every held slot's outputs acknowledged."""
        return list(self._results.values())

    def drop(self) -> None:
        """The partition was handed back: nothing waits any more (its new owner replays; the
        fence drops a checkpoint still waiting, for its slots are handed back too)."""
        for fut in self._results.values():
            if not fut.done():
                fut.set_result(None)
        self.held.clear()
        self._results.clear()
        self.closed = True


class CheckpointGroups:
    """The outbox's table of slots in groups: which slots are held, what a closing
    checkpoint waits for, and which slots its acknowledgement releases."""

    def __init__(
        self, acknowledge: Callable[[Slot[Any]], None], after_acks: AfterAcks, delivery: set[asyncio.Future[Any]]
    ) -> None:
        self._ledger = acknowledge  # the outbox's acknowledgement of a slot (commit bookkeeping)
        self._after_acks = after_acks
        self._delivery = delivery  # the outbox's in-flight deliveries (what a flush waits for)
        self._by_slot: dict[Slot[Any], CheckpointGroup] = {}
        self.failure: BaseException | None = None

    def register(self, slot: Slot[Any], outputs: Sequence[Any], group: CheckpointGroup | None) -> None:
        """``slot`` joins ``group``: as its closer (its outputs carry the checkpoint) or held."""
        if group is None:
            return
        if any(out.after_acks for out in outputs):
            group.closed = True
        else:
            group.hold(slot)
        self._by_slot[slot] = group

    def empty(self) -> bool:
        """No slot is in a group (a stage that never checkpoints, or none open now)."""
        return not self._by_slot

    def covered(self, slot: Slot[Any]) -> list[asyncio.Future[None]]:
        """What ``slot``'s checkpoint waits for besides its own outputs."""
        group = self._by_slot.get(slot)
        return group.results() if group is not None and not group.holds(slot) else []

    def failed(self, slot: Slot[Any], exc: BaseException) -> None:
        if (group := self._by_slot.get(slot)) is not None:
            group.results_acknowledged(slot, exc)  # its checkpoint must not wait forever

    def acknowledge(self, slot: Slot[Any]) -> None:
        """``slot``'s outputs are acknowledged: a held slot waits for its group's checkpoint;
        a closing one releases its group's held slots, then itself."""
        group = self._by_slot.get(slot)
        if group is not None:
            if group.holds(slot):
                group.results_acknowledged(slot)
                return
            del self._by_slot[slot]
            self._release(group)
        self._ledger(slot)

    def close(self, group: CheckpointGroup, checkpoint: Sequence[Any]) -> None:
        """Send ``group``'s checkpoint with no slot to carry it (the key's last slots took
        none): after the held slots' outputs, in their line's checkpoint order."""
        group.closed = True
        if not group.held:
            return
        done = self._after_acks.send_alone(group.held[-1], list(checkpoint), group.results())
        self._delivery.add(done)
        done.add_done_callback(functools.partial(self._closed_alone, group=group))

    def _closed_alone(self, done: asyncio.Future[None], group: CheckpointGroup) -> None:
        self._delivery.discard(done)
        if done.cancelled():
            return
        if (exc := done.exception()) is not None:
            log.error("checkpoint of %d held records not delivered: %s", len(group), exc)
            self.failure = exc
            return
        self._release(group)

    def _release(self, group: CheckpointGroup) -> None:
        """The group's checkpoint is acknowledged: its held slots are done (unless handed back)."""
        if not group.held or self._by_slot.get(group.held[0]) is not group:
            return
        for held in group.held:
            del self._by_slot[held]
            self._ledger(held)

    def forget(self, tp: Any) -> None:
        """``tp`` was handed back: its groups wait for nothing any more."""
        for slot in [s for s in self._by_slot if s.tp == tp]:
            self._by_slot.pop(slot).drop()
