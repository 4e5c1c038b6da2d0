"""Reading partitions beside a stage's consumer: where they end, and how old what is left is.

The progress poll (:mod:`pipeline.kafka.progress`) asks two things of the broker that a
consumer's API does not answer: the true end of a partition (ListOffsets can answer short
on the embedded broker) and the event time of the oldest record a group has still to
process. Both are plain uncommitted-isolation fetches, one per partition leader, that move
no consumer's position.

**The oldest record left, not the record at the committed offset.** A partition is not
ordered by timestamp. A stage writing it appends outputs as it finishes them: after a
rebalance or a broker restart, its new owner redoes older requests and appends their
outputs after newer ones; two input partitions interleave into one output partition at
whatever pace each is processed. The broker kill test on Apache Kafka (2026-11-27) showed
it: a join's branch committed at a record stamped 6 s past requests whose outputs were
still further on in the same partition, and the join expired their windows. So
:class:`OldestLeft` reads every record from each group's committed offset to the end, once
(incrementally, as the end grows), and keeps their stamps' minimum from any offset on (a
sliding-window minimum: a deque whose stamps increase). Until it has read a partition to
its end, the oldest stamp there is unknown (None), and nothing may close on it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka.client import AIOKafkaClient
from aiokafka.cluster import ClusterMetadata
from aiokafka.consumer.fetcher import READ_UNCOMMITTED
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

GroupPartition = tuple[str, TopicPartition]
"""(consumer group, input partition)."""


async def fetch_at(
    client: AIOKafkaClient,
    offsets: Mapping[TopicPartition, int],
    *,
    partition_bytes: int,
    total_bytes: int,
    cluster: ClusterMetadata | None = None,
) -> dict[TopicPartition, tuple[int, bytes]]:
    """One uncommitted-isolation fetch per partition leader at ``offsets``: per partition
    answered without an error, its high watermark and record bytes (those in error are left
    out). ``cluster``: the leaders as the caller's poll already read them (None: ask)."""
    cluster = cluster if cluster is not None else await client.fetch_all_metadata()
    by_node: dict[int, list[TopicPartition]] = {}
    for tp in offsets:
        leader = cluster.leader_for_partition(tp)
        if leader is not None and leader >= 0:
            by_node.setdefault(leader, []).append(tp)
    answers: dict[TopicPartition, tuple[int, bytes]] = {}
    for node, tps in by_node.items():
        topics: dict[str, list[tuple[int, int, int]]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append((tp.partition, offsets[tp], partition_bytes))
        request = FetchRequest(
            max_wait_time=5, min_bytes=1, max_bytes=total_bytes, isolation_level=READ_UNCOMMITTED,
            topics=list(topics.items()),
        )  # fmt: skip
        response = await client.send(node, request)
        for topic, partitions in response.topics:
            for partition, error_code, high, *rest in partitions:
                tp = TopicPartition(topic, partition)
                if error_code == 0 and tp in offsets:
                    answers[tp] = (int(high), bytes(rest[-1]) if rest and rest[-1] else b"")
    return answers


def _batches(data: bytes) -> Iterator[Any]:
    """The complete record batches of a fetch answer's record bytes."""
    records = MemoryRecords(data)
    while records.has_next():
        batch = records.next_batch()
        if batch is None:
            break
        yield batch


def record_stamps(data: bytes) -> tuple[list[tuple[int, int]], int]:
    """A fetch answer's data records as (offset, timestamp), and the offset after its last
    complete batch (0: none; transaction markers move it too)."""
    stamps: list[tuple[int, int]] = []
    after = 0
    for batch in _batches(data):
        after = max(after, int(batch.next_offset))
        if not getattr(batch, "is_control_batch", False):
            stamps.extend((int(record.offset), int(record.timestamp)) for record in batch)
    return stamps, after


def next_offset(data: bytes) -> int:
    """The offset after the last complete batch in a fetch answer's record bytes (0: none)."""
    return max((int(batch.next_offset) for batch in _batches(data)), default=0)


@dataclass
class _Left:
    """One group's records of one partition from its committed offset on, as far as read."""

    base: int  # the start offset this reading began at
    read_to: int  # the next offset to read
    minima: deque[tuple[int, int]] = field(default_factory=deque)
    """(offset, stamp) with increasing stamps: minima[0] is the oldest from any start on."""

    def start_at(self, start: int) -> None:
        while self.minima and self.minima[0][0] < start:
            self.minima.popleft()
        self.read_to = max(self.read_to, start)

    def add(self, stamps: list[tuple[int, int]], after: int) -> None:
        for offset, stamp in stamps:
            if offset < self.read_to:
                continue
            while self.minima and self.minima[-1][1] >= stamp:
                self.minima.pop()
            self.minima.append((offset, stamp))
        self.read_to = max(self.read_to, after)


class OldestLeft:
    """Per (group, partition): the timestamp of the oldest record from the group's committed
    offset to the partition's end (module docstring). Reads only what it has not read yet,
    up to ``max_rounds`` fetches of ``partition_bytes`` per partition each poll."""

    def __init__(self, *, partition_bytes: int = 1 << 20, total_bytes: int = 4 << 20, max_rounds: int = 4) -> None:
        self._left: dict[GroupPartition, _Left] = {}
        self._partition_bytes = partition_bytes
        self._total_bytes = total_bytes
        self._max_rounds = max_rounds

    async def oldest(
        self,
        client: AIOKafkaClient,
        starts: Mapping[GroupPartition, int],
        ends: Mapping[TopicPartition, int],
        cluster: ClusterMetadata | None = None,
    ) -> dict[GroupPartition, int | None]:
        """``starts``: where each group's records left begin; ``ends``: the partitions' ends.
        None where the records left are not all read yet, or hold no data record."""
        for key in [k for k in self._left if k not in starts]:
            del self._left[key]  # caught up (or gone from the question): read afresh next time
        for key, start in starts.items():
            left = self._left.get(key)
            if left is None or start < left.base:  # a new question, or the group moved back
                left = self._left[key] = _Left(start, start)
            left.start_at(start)
        for _ in range(self._max_rounds):
            wanted: dict[TopicPartition, int] = {}
            for (_group, tp), left in sorted(self._left.items(), key=lambda kv: (kv[0][1], kv[1].read_to)):
                if left.read_to < ends.get(tp, 0) and tp not in wanted:
                    wanted[tp] = left.read_to  # groups at other offsets of tp: next round
            if not wanted:
                break
            answers = await fetch_at(
                client, wanted, partition_bytes=self._partition_bytes, total_bytes=self._total_bytes, cluster=cluster
            )
            moved = False
            for tp, (_high, data) in answers.items():
                stamps, after = record_stamps(data)
                for (_group, at), left in self._left.items():
                    if at == tp and left.read_to == wanted[tp]:
                        left.add(stamps, after)
                        moved = moved or left.read_to > wanted[tp]
            if not moved:
                break  # nothing more came back this poll
        result: dict[GroupPartition, int | None] = {}
        for key in starts:
            left = self._left[key]
            done = left.read_to >= ends.get(key[1], 0)
            result[key] = left.minima[0][1] if done and left.minima else None
        return result
