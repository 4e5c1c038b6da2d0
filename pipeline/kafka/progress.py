"""How far the consumer groups upstream of a stage have got: are they still working through
their input?

A join's window runs in event time. A branch topic the join has read to its end may still
be incomplete: the stage writing it may be behind on its own input (a backlog, a branch
slower than the other), and what it has not processed yet is older, in event time, than
what the join has seen. So a join counts a branch as caught up only when every group
upstream of it has committed its input to the end, or has stopped moving: a group with
records left whose commits have not advanced for ``stall_s`` (its stage is down, or
waits out an outage) is late, not slow, and windows close on it as they would on a
branch that never answers.

Committed offsets and end offsets are asked of the broker; the end offsets of the join's
own inputs come in the same poll, after the commits, so an output acknowledged before its
commit is never missed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from pipeline.settings import KafkaSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Upstream:
    """A consumer group and the topic it consumes."""

    group_id: str
    topic: str


MIN_STALL_S = 30.0
"""The shortest time without a commit that counts an upstream group as stopped. A stage
that is starting (joining its group, waiting for its models), rebalancing or working
through a large batch commits nothing for seconds while it is only slow; a join window
shorter than that must not close on it."""

Committed = Mapping[tuple[str, TopicPartition], int | None]
"""(group, input partition) -> the group's committed offset (None: it never committed)."""


@dataclass
class Movement:
    """When each (group, partition)'s committed offset last changed, by ``clock``."""

    stall_s: float
    clock: Callable[[], float] = time.monotonic
    _seen: dict[tuple[str, TopicPartition], tuple[int | None, float]] = field(default_factory=dict)

    def behind(self, committed: Committed, beginning: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]) -> set[int]:
        """Partition numbers where a group still has records to process and has committed
        within ``stall_s`` (a group first seen counts as moving). Groups may share an input
        topic (a fan-out); one that never committed counts from the partition's beginning."""
        now = self.clock()
        behind = set()
        for key, done in committed.items():
            last = self._seen.get(key)
            if last is None or last[0] != done:
                self._seen[key] = last = (done, now)
            tp = key[1]
            start = beginning.get(tp, 0) if done is None or done < 0 else done
            if start < end.get(tp, 0) and now - last[1] < self.stall_s:
                behind.add(tp.partition)
        return behind


class UpstreamProgress:
    """Polled progress of ``upstream`` groups on the partition numbers a stage owns.

    Until a poll has succeeded (and whenever one fails), every partition counts as
    behind: the safe answer, since it only delays a window.
    """

    def __init__(
        self, settings: KafkaSettings, upstream: Sequence[Upstream], own_topics: Sequence[str], *, stall_s: float
    ) -> None:
        self._settings = settings
        self._upstream = list(upstream)
        self._own_topics = list(own_topics)
        self._movement = Movement(stall_s)
        self._admin: AIOKafkaAdminClient | None = None
        self._behind: set[int] | None = None
        self._ends: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        if self._upstream:
            self._admin = AIOKafkaAdminClient(**self._settings.client_kwargs(), request_timeout_ms=5_000)
            await self._admin.start()

    async def stop(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None

    def behind(self, partition: int) -> bool:
        return self._behind is None or partition in self._behind

    def end(self, tp: TopicPartition) -> int | None:
        """The end offset of one of the stage's own inputs as of the last poll."""
        return self._ends.get(tp)

    async def poll(self, consumer: AIOKafkaConsumer, partitions: Iterable[int]) -> None:
        numbers = sorted(set(partitions))
        try:
            committed: dict[tuple[str, TopicPartition], int | None] = {}
            for up in self._upstream:
                assert self._admin is not None
                tps = [TopicPartition(up.topic, p) for p in numbers]
                offsets = await self._admin.list_consumer_group_offsets(up.group_id, partitions=tps)
                committed.update({(up.group_id, tp): (offsets[tp].offset if tp in offsets else None) for tp in tps})
            inputs = sorted({tp for _, tp in committed})
            ends = await consumer.end_offsets(inputs) if inputs else {}
            beginning = await consumer.beginning_offsets(inputs) if inputs else {}
            own = [TopicPartition(topic, p) for topic in self._own_topics for p in numbers]
            self._ends = dict(await consumer.end_offsets(own)) if own else {}
        except (KafkaError, OSError) as exc:
            log.warning("progress of upstream groups unknown (%r): windows wait", exc)
            self._behind = None
            return
        self._behind = self._movement.behind(committed, beginning, ends)
