"""At most N batch calls at once, granted round-robin across lanes when they queue.

A stage with task routes keeps one batcher group per model (the model is part of
the batch key), but its calls share ``max_inflight_batches``. A plain semaphore
grants waiters first-come: a task flooding the stage would queue hundreds of
batches ahead of another task's one. Here each lane (a route's model) has its own
queue of waiters and a freed slot goes to the next lane in turn, so a lane waits
behind at most one batch of each other lane. With a single lane (a stage without
routes) this is exactly a FIFO semaphore.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager


class FairGate:
    """``async with gate.slot(lane):`` holds one of ``slots``; freed slots go round-robin."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self._free = slots
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}
        self._turn: deque[Hashable] = deque()  # lanes with waiters, next to serve first

    @asynccontextmanager
    async def slot(self, lane: Hashable = None) -> AsyncIterator[None]:
        await self.acquire(lane)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, lane: Hashable = None) -> None:
        if self._free > 0 and not self._turn:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(lane)
        if queue is None:
            queue = self._waiting[lane] = deque()
            self._turn.append(lane)
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted as we were cancelled: pass the slot on
            else:
                self._forget(lane, waiter)
            raise

    def release(self) -> None:
        """Give the freed slot to the head waiter of the next lane in turn (or keep it free)."""
        while self._turn:
            lane = self._turn.popleft()
            queue = self._waiting[lane]
            waiter = queue.popleft()
            if queue:
                self._turn.append(lane)
            else:
                del self._waiting[lane]
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    def _forget(self, lane: Hashable, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(lane)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del self._waiting[lane]
            self._turn.remove(lane)

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())
