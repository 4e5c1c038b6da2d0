"""Who is waiting for which reply: a future per correlation id, a queue per stream key.

Pure bookkeeping (no Kafka), so the matching rules are unit-tested alone:

* a result or dead letter whose correlation id has a waiting call resolves it, once;
* one for a call that already timed out is **late**: discarded and counted, never
  handed to anyone else (the id is remembered, bounded, for exactly that);
* one for a call already answered is a **duplicate** (at-least-once delivery after a
  stage restart), discarded and counted;
* anything else is **foreign** (another client's, read from a shared result topic).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

from pipeline.contract.errors import TextEnum
from pipeline.tools.decoding import Consumed

#: Correlation ids of settled calls remembered to tell late and duplicate replies apart.
SETTLED_MEMORY = 100_000


class Delivery(TextEnum):
    """What happened to one reply record."""

    DELIVERED = "delivered"
    STREAMED = "streamed"
    LATE = "late"
    DUPLICATE = "duplicate"
    FOREIGN = "foreign"


@dataclass
class ClientStats:
    """Counters of one client: what it sent and what became of every reply it read."""

    sent: int = 0
    results: int = 0
    dead_letters: int = 0
    timed_out: int = 0
    streamed: int = 0
    late: int = 0
    duplicates: int = 0
    foreign: int = 0


class Waiters:
    """Futures by correlation id, stream queues by record key, and the settled ids."""

    def __init__(self, settled_memory: int = SETTLED_MEMORY) -> None:
        self.stats = ClientStats()
        self._calls: dict[str, asyncio.Future[Consumed]] = {}
        self._streams: dict[bytes, asyncio.Queue[Consumed]] = {}
        self._settled: OrderedDict[str, bool] = OrderedDict()  # id -> timed out
        self._memory = settled_memory

    def expect(self, correlation_id: str) -> asyncio.Future[Consumed]:
        """A future for the reply to ``correlation_id`` (registered before the request is sent)."""
        if correlation_id in self._calls:
            raise ValueError(f"correlation id {correlation_id!r} is already waiting")
        future: asyncio.Future[Consumed] = asyncio.get_running_loop().create_future()
        self._calls[correlation_id] = future
        return future

    def give_up(self, correlation_id: str, *, timed_out: bool) -> None:
        """The call stopped waiting (timeout, cancellation): a later reply is late."""
        future = self._calls.pop(correlation_id, None)
        if future is not None:
            future.cancel()
        self._remember(correlation_id, timed_out=True)
        if timed_out:
            self.stats.timed_out += 1

    def open_stream(self, key: bytes) -> asyncio.Queue[Consumed]:
        if key in self._streams:
            raise ValueError(f"stream {key!r} is already open in this client")
        queue: asyncio.Queue[Consumed] = asyncio.Queue()
        self._streams[key] = queue
        return queue

    def close_stream(self, key: bytes) -> None:
        self._streams.pop(key, None)

    def deliver(self, record: Consumed) -> Delivery:
        """Hand ``record`` (a result or dead letter) to whoever waits for it."""
        if record.key is not None and (queue := self._streams.get(record.key)) is not None:
            queue.put_nowait(record)
            self.stats.streamed += 1
            return Delivery.STREAMED
        cid = record.correlation_id or ""
        future = self._calls.pop(cid, None)
        if future is not None and not future.done():
            future.set_result(record)
            self._remember(cid, timed_out=False)
            if record.dead_letter is not None:
                self.stats.dead_letters += 1
            else:
                self.stats.results += 1
            return Delivery.DELIVERED
        if future is not None:  # the call was cancelled, its give_up() not run yet
            self._remember(cid, timed_out=True)
        timed_out = self._settled.get(cid)
        if timed_out is None:
            self.stats.foreign += 1
            return Delivery.FOREIGN
        if timed_out:
            self.stats.late += 1
            return Delivery.LATE
        self.stats.duplicates += 1
        return Delivery.DUPLICATE

    def fail_all(self, error: BaseException) -> None:
        """The client stops: every waiting call gets ``error``."""
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()

    @property
    def waiting(self) -> int:
        return len(self._calls)

    def _remember(self, correlation_id: str, *, timed_out: bool) -> None:
        self._settled[correlation_id] = timed_out
        self._settled.move_to_end(correlation_id)
        while len(self._settled) > self._memory:
            self._settled.popitem(last=False)
