"""When a stream's state is checkpointed: the coalescing rule of a sequence stage.

A checkpoint per chunk costs a compacted-topic record (the model's recurrent state, the
carry, 64 digests) and a broker round trip that waits for the chunk's results. Chunks of
a stream applied back to back (a backlog, a burst) share one instead: the chunks before it
are *held* (:mod:`pipeline.kafka.checkpoint_group`): their results leave at once, their input
offsets are committed only once the checkpoint covering them is acknowledged. A crash
therefore replays them and they are re-applied from the previous checkpoint, byte for byte
the same results (docs/streaming.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pipeline.kafka.checkpoint_group import CheckpointGroup
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs, OutRecord, StageOutbox
from pipeline.state import KeyedStateStore


@dataclass(frozen=True)
class CheckpointPolicy:
    every_chunks: int = 16
    """Most chunks one checkpoint covers (1: one per chunk, as before coalescing)."""
    max_interval_ms: int = 200
    """Longest an applied chunk waits for the checkpoint covering it."""


def checkpoint_due(
    policy: CheckpointPolicy, *, held: int, held_since: float | None, now: float, ending: bool, more_on_hand: bool
) -> bool:
    """Whether the chunk being applied carries its stream's checkpoint.

    ``held``: chunks applied since the last checkpoint (before this one), the oldest at
    ``held_since``; ``more_on_hand``: the stream has further chunks queued, so another
    checkpoint follows soon. Nothing more on hand, the stream's end, ``every_chunks`` or
    ``max_interval_ms`` reached: checkpoint now.
    """
    if ending or not more_on_hand or held + 1 >= policy.every_chunks:
        return True
    return held_since is not None and (now - held_since) * 1000 >= policy.max_interval_ms


@dataclass
class PendingCheckpoint:
    """A stream's chunks applied since its last checkpoint (their slots held in ``group``)."""

    group: CheckpointGroup | None = None
    since: float | None = None

    @property
    def held(self) -> int:
        return len(self.group) if self.group is not None else 0

    def join(self) -> CheckpointGroup:
        """The open group (opened now when there is none) for a chunk that takes no checkpoint."""
        if self.group is None:
            self.group, self.since = CheckpointGroup(), time.monotonic()
        return self.group

    def take(self) -> CheckpointGroup | None:
        """The open group, closed by the checkpoint about to be written (None: none open)."""
        group, self.group, self.since = self.group, None, None
        return group


def complete_chunk(
    outbox: StageOutbox,
    states: KeyedStateStore[Any],
    policy: CheckpointPolicy,
    pending: PendingCheckpoint,
    slot: Slot[Outputs],
    results: list[OutRecord],
    key: bytes,
    *,
    ending: bool,
    more_on_hand: bool,
) -> None:
    """Complete an applied chunk's slot (its stream's state already set in ``states``) with
    its results, and with the stream's checkpoint when it is due; else the slot is held."""
    due = checkpoint_due(
        policy, held=pending.held, held_since=pending.since, now=time.monotonic(), ending=ending, more_on_hand=more_on_hand
    )
    if due:
        outbox.complete(slot, (*results, states.checkpoint(key)), group=pending.take())  # covers the held ones too
    else:
        outbox.complete(slot, tuple(results), group=pending.join())


def close_pending(outbox: StageOutbox, states: KeyedStateStore[Any], pending: PendingCheckpoint, key: bytes) -> None:
    """A stream's last chunks on hand took no checkpoint (a duplicate or a dead letter came
    last): send one covering them on its own."""
    if (group := pending.take()) is not None:
        outbox.groups.close(group, (states.checkpoint(key),) if key in states else ())
