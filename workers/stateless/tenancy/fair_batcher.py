"""The batcher of a stage with fair batches: a batch forms when a call can start, its rows picked.

The plain :class:`~workers.stateless.batching.DynamicBatcher` releases a group as soon as it
is full or old enough, in arrival order. With tenants, that queues pre-formed batches of
whoever sent most. This one releases a group only while the stage has an in-flight slot free
(``capacity``): until then the group keeps growing past ``max_rows``, and when a call can
start, ``pick`` (:func:`workers.stateless.tenancy.fair_share.fair_pick`) chooses which of
its requests go; the rest stay, keeping their age, first in line for the next call. Batches
then form when Triton can take them, from everyone waiting.

A separate class rather than a mode of the plain batcher, so that a stage without tenants
runs no fairness check per record (issue 22: a feature that is off costs nothing).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

from workers.stateless.batching import Batch, DynamicBatcher, T

Pick = Callable[[list[T], int], list[int]]
"""(waiting items, max_rows) -> indexes of the items that go now (the first always does)."""


class FairBatcher(DynamicBatcher[T]):
    """Groups by key like the plain batcher; releases them only when a call can start."""

    def __init__(
        self,
        max_rows: int,
        max_delay_s: float,
        max_bytes: int | None = None,
        max_elements: int | None = None,
        *,
        pick: Pick[T],
        capacity: Callable[[], int],
    ) -> None:
        super().__init__(max_rows, max_delay_s, max_bytes, max_elements)
        self._pick = pick
        self._capacity = capacity

    def add(
        self, key: Hashable, item: T, rows: int, now: float | None = None, size: int = 0, elements: int = 0
    ) -> list[Batch[T]]:
        now = time.monotonic() if now is None else now
        self._open.setdefault(key, Batch(key=key, opened_at=now)).put(item, rows, size, elements)
        return self._release_picked(now)

    def due(self, now: float | None = None) -> list[Batch[T]]:
        """Groups full or old enough, as many as the stage has room for."""
        return self._release_picked(time.monotonic() if now is None else now)

    def take_for_free_calls(self, room: int) -> list[Batch[T]]:
        """The oldest groups, one call each, up to ``room``: ``max_rows`` of each chosen by ``pick``."""
        released: list[Batch[T]] = []
        while self._open and len(released) < room:
            released.append(self._take(min(self._open.values(), key=lambda g: g.opened_at)))
        return released

    def next_due(self) -> float | None:
        """As the plain batcher's, but None while no call can start: the stage then calls
        :meth:`due` when a call ends."""
        if self._capacity() <= 0:
            return None
        return super().next_due()

    def drain(self) -> list[Batch[T]]:
        """Every open group, in calls of ``max_rows``."""
        taken = []
        while self._open:
            taken.append(self._take(next(iter(self._open.values()))))
        return taken

    def _ready(self, group: Batch[T], now: float) -> bool:
        return (
            group.rows >= self.max_rows
            or self._over(group.size, group.elements)
            or now - group.opened_at >= self.max_delay_s
        )

    def _release_picked(self, now: float) -> list[Batch[T]]:
        """The oldest ready groups, one call each, while the stage has room."""
        released: list[Batch[T]] = []
        room = self._capacity()
        while room > len(released):
            ready = [g for g in self._open.values() if self._ready(g, now)]
            if not ready:
                break
            released.append(self._take(min(ready, key=lambda g: g.opened_at)))
        return released

    def _take(self, group: Batch[T]) -> Batch[T]:
        """One call's worth of ``group``, chosen by ``pick`` (within ``max_bytes``); the rest
        stays open, keeping its age, so it is first in line."""
        chosen = (
            set(self._pick(group.items, self.max_rows)) if group.rows > self.max_rows else set(range(len(group.items)))
        )
        batch: Batch[T] = Batch(key=group.key, opened_at=group.opened_at)
        for index in sorted(chosen):
            size, elements = group.item_sizes[index], group.item_elements[index]
            if batch.items and self._over(batch.size + size, batch.elements + elements):
                chosen.discard(index)
            else:
                batch.put(group.items[index], group.item_rows[index], size, elements)
        keep = [i for i in range(len(group.items)) if i not in chosen]
        rest: Batch[T] = Batch(
            key=group.key,
            opened_at=group.opened_at,
            items=[group.items[i] for i in keep],
            rows=group.rows - batch.rows,
            size=group.size - batch.size,
            elements=group.elements - batch.elements,
            item_rows=[group.item_rows[i] for i in keep],
            item_sizes=[group.item_sizes[i] for i in keep],
            item_elements=[group.item_elements[i] for i in keep],
        )
        if rest.items:
            self._open[group.key] = rest
        else:
            del self._open[group.key]
        return batch
