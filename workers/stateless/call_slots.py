"""At most N batch calls at once, granted round-robin across models when they queue.

A stage with task routes keeps one batcher group per model (the model is part of
the batch key), but its calls share ``max_inflight_batches``. A plain semaphore
grants waiters first-come: a task flooding the stage would queue hundreds of
batches ahead of another task's one. Here each model (a route's) has its own
queue of waiters and a freed slot goes to the next model in turn, so a model waits
behind at most one batch of each other model. With a single model (a stage without
routes) this is exactly a FIFO semaphore.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager


class CallSlots:
    """``async with slots.slot(model):`` holds one of ``slots``; freed slots go round-robin."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self._free = slots
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}
        self._turn: deque[Hashable] = deque()  # models with waiters, next to serve first

    @asynccontextmanager
    async def slot(self, model: Hashable = None) -> AsyncIterator[None]:
        await self.acquire(model)
        try:
            yield
        finally:
            self.free()

    async def acquire(self, model: Hashable = None) -> None:
        if self._free > 0 and not self._turn:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(model)
        if queue is None:
            queue = self._waiting[model] = deque()
            self._turn.append(model)
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.free()  # granted as we were cancelled: pass the slot on
            else:
                self._forget(model, waiter)
            raise

    def free(self) -> None:
        """Give the freed slot to the head waiter of the next model in turn (or keep it free)."""
        while self._turn:
            model = self._turn.popleft()
            queue = self._waiting[model]
            waiter = queue.popleft()
            if queue:
                self._turn.append(model)
            else:
                del self._waiting[model]
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    def _forget(self, model: Hashable, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(model)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del self._waiting[model]
            self._turn.remove(model)

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())
