"""The in-memory side of a sequence stage's streams: queues, waiting chunks, tasks.

One task per stream applies its queued chunks in order, so streams run
concurrently while each stays sequential. The durable side (next index, carry,
model state) is the keyed state; this table only holds what a restart may lose.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiokafka.structs import TopicPartition

from workers.sequence.checkpoints import PendingCheckpoint
from workers.sequence.chunks import Chunk
from workers.sequence.model import StreamHandle
from workers.sequence.results import Origin

SKIP_GAP = None
"""Queued to a stream's task instead of a chunk: skip to its first waiting chunk."""


@dataclass
class Stream:
    handle: StreamHandle
    partition: TopicPartition
    queue: asyncio.Queue[Chunk | None] = field(default_factory=asyncio.Queue)
    waiting: dict[int, Chunk] = field(default_factory=dict)  # arrived early, by index
    task: asyncio.Task[None] | None = None
    origin: Origin | None = None  # the latest chunk's key/request/headers, for a closing summary
    gaps: list[tuple[int, int]] = field(default_factory=list)  # skipped [start, stop), reported with the next result
    pending: PendingCheckpoint = field(default_factory=PendingCheckpoint)  # applied, not yet checkpointed

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()


Driver = Callable[[Stream], Coroutine[Any, Any, None]]


class StreamTable:
    """Streams by key; :meth:`enqueue` starts a stream's task when it has none running."""

    def __init__(self, driver: Driver, label: str) -> None:
        self._driver = driver
        self._label = label
        self._streams: dict[bytes, Stream] = {}

    def get(self, key: bytes) -> Stream | None:
        return self._streams.get(key)

    def open(self, key: bytes, partition: TopicPartition) -> Stream:
        stream = self._streams[key] = Stream(StreamHandle(key), partition)
        return stream

    def pop(self, key: bytes) -> None:
        self._streams.pop(key, None)

    def __iter__(self) -> Iterator[Stream]:
        return iter(list(self._streams.values()))

    def enqueue(self, stream: Stream, item: Chunk | None) -> None:
        stream.queue.put_nowait(item)
        if not stream.busy:
            stream.task = asyncio.create_task(self._driver(stream), name=f"{self._label}-stream")

    def cancel(self, partitions: set[TopicPartition]) -> None:
        """Partitions were handed back: stop and forget their streams."""
        for key, stream in list(self._streams.items()):
            if stream.partition in partitions:
                if stream.task is not None:
                    stream.task.cancel()
                del self._streams[key]

    def running(self, partitions: set[TopicPartition] | None) -> list[asyncio.Task[None]]:
        return [
            s.task
            for s in self._streams.values()
            if s.task is not None and s.busy and (partitions is None or s.partition in partitions)
        ]
