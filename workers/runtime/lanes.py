"""Priority lanes on the consumer: fetch a lower lane only while the lanes above it are drained.

The rule, per consume-loop turn: a lane is *busy* when, on any partition of it this
worker owns, the fetch position is below the high watermark the last fetch reported
(records are there to read). Every partition of every lane below the highest busy
lane is paused; the rest are resumed. Pausing is aiokafka's ``pause``/``resume``: the
consumer keeps polling (group membership) and the lower lanes' records stay on the
broker, so a backlog there waits while higher lanes are served and none is lost.

Robustness:
- Only high watermarks from fetch responses count, never ListOffsets (Tansu answers it
  with the last batch's base offset + 1), and a partition not fetched yet is not busy.
- A partition whose (position, high watermark) has not moved for ``stale_after_s``
  while the consumer was not paused for backpressure counts as drained: a high
  watermark off by one, or a transaction marker the position never passes, must
  never hold the lower lanes forever.
- Backpressure wins: while :class:`~workers.runtime.flow_control.FlowControl` has paused the
  whole consumer, lanes change nothing; when it resumes everything, the lower lanes
  are paused again in the same turn, before the next fetch.

Outcomes, ordering and commits are per topic-partition in the outbox, so lanes need
nothing there: a key's records are in order within its lane, and have no order
across lanes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import IllegalStateError
from aiokafka.structs import TopicPartition

from pipeline.observability.metrics import PipelineMetrics
from pipeline.topology.lanes import Lane

STALE_AFTER_S = 1.0
"""A fetch answers within fetch.max.wait (0.5 s by default) and moves the position of a
partition with records; a (position, high watermark) frozen twice that long is stale."""


class LaneRule:
    """Which partitions to hold back, from positions and high watermarks (no I/O)."""

    def __init__(
        self, topics: Sequence[str], *, stale_after_s: float = STALE_AFTER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rank = {topic: index for index, topic in enumerate(topics)}
        """Lane rank per topic: 0 the highest."""
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._seen: dict[TopicPartition, tuple[int, int, float]] = {}  # position, high, since

    def busy(self, tp: TopicPartition, position: int | None, high: int | None) -> bool:
        """Records are waiting on ``tp``, by a high watermark that is not stale."""
        if position is None or high is None:
            return False
        now = self._clock()
        last = self._seen.get(tp)
        if last is None or last[:2] != (position, high):
            self._seen[tp] = (position, high, now)
            since = now
        else:
            since = last[2]
        return position < high and now - since < self.stale_after_s

    def restart_clocks(self) -> None:
        """The consumer was paused (backpressure): a frozen position says nothing then."""
        now = self._clock()
        self._seen = {tp: (position, high, now) for tp, (position, high, _) in self._seen.items()}

    def held(self, owned: Collection[TopicPartition], busy: Collection[TopicPartition]) -> set[TopicPartition]:
        """The partitions of ``owned`` in lanes below the highest lane with a busy partition."""
        top = min((self.rank[tp.topic] for tp in busy if tp.topic in self.rank), default=None)
        if top is None:
            return set()
        return {tp for tp in owned if self.rank.get(tp.topic, -1) > top}

    def forget(self, kept: Collection[TopicPartition]) -> None:
        self._seen = {tp: seen for tp, seen in self._seen.items() if tp in kept}


class LaneScheduler:
    """Applies :class:`LaneRule` to a stage's consumer each turn; counts requests by lane."""

    def __init__(self, stage: str, lanes: Sequence[Lane], metrics: PipelineMetrics, rule: LaneRule | None = None) -> None:
        self.lanes = tuple(lanes)
        self.rule = rule or LaneRule([lane.topic for lane in lanes])
        self._name = {lane.topic: lane.name for lane in lanes}
        self._requests = {lane.topic: metrics.lane_requests.labels(stage, lane.name) for lane in lanes}
        self._held_gauge = {lane.topic: metrics.lane_held.labels(stage, lane.name) for lane in lanes}
        self.held: set[TopicPartition] = set()
        """Partitions this scheduler paused (flow control may have paused others)."""

    def consumed(self, tp: TopicPartition, count: int = 1) -> None:
        if count and (counter := self._requests.get(tp.topic)) is not None:
            counter.inc(count)

    async def apply(self, consumer: AIOKafkaConsumer, owned: Collection[TopicPartition], backpressure: bool) -> None:
        """Pause the lanes below the highest busy one; resume what no longer needs holding."""
        if backpressure:
            self.rule.restart_clocks()
            return  # everything is paused already; flow control resumes it all, then we hold again
        assigned = consumer.assignment()
        owned = [tp for tp in owned if tp in assigned]
        self.rule.forget(owned)
        busy = []
        for tp in owned:
            high = consumer.highwater(tp)  # from fetch responses only: None before the first
            if high is not None and self.rule.busy(tp, await _position(consumer, tp), high):
                busy.append(tp)
        hold = self.rule.held(owned, busy)
        paused = consumer.paused()
        if pause := hold - paused:
            consumer.pause(*pause)
        if resume := (self.held - hold) & paused & assigned:
            consumer.resume(*resume)
        self.held = hold
        for topic, gauge in self._held_gauge.items():
            gauge.set(1 if any(tp.topic == topic for tp in hold) else 0)


async def _position(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The fetch position (at once once a partition has been fetched); None once revoked."""
    try:
        return int(await consumer.position(tp))
    except IllegalStateError:  # revoked while its position was being reset
        return None


def lane_priority(lanes: Sequence[Lane], topic: str) -> int | None:
    """The Triton priority the lane of ``topic`` gives its requests (None: the stage's default)."""
    return next((lane.priority for lane in lanes if lane.topic == topic), None)
