"""How far the consumer groups upstream of a stage have got: behind, caught up, or gone.

A join's window runs in event time. A branch topic the join has read to its end may still
be incomplete: the stage writing it may be behind on its own input (a backlog, a rejoin,
a branch slower than the other), and what it has not processed yet is older, in event
time, than what the join has seen. A sequence stage's input is the same: the stage before
it may still hold a stream's next chunks.

**A branch is behind until proven gone.** Time since a group's last commit is not, by
itself, evidence of anything: a stage rejoining its group (about 19 s on the embedded
broker), waiting for its models or sharing two cores with a 200,000-record backlog
commits nothing for as long as it takes, and any threshold on that silence fails on a
busier machine (issue 28). So each (branch, partition) is judged on evidence only:

- ``caught-up``: every group feeding it has committed its input to the end;
- ``gone``: a group feeding it has had no live member (the broker's DescribeGroups) for
  longer than ``gone_after_s``; nothing it has not processed will ever come;
- ``behind``: otherwise. The stage waits, judging by the branch's *position*
  (:meth:`UpstreamProgress.position`), or by a hard ``max_wait`` of its own.

**A behind branch is judged by where its stages are, not by what they delivered.** Its
position is the event time of the oldest record its groups have still to finish: the
lowest timestamp among the records from each group's committed offset to its input's end,
over every group of the branch with records left (:class:`~pipeline.kafka.partition_reads.OldestLeft`
reads them; unknown, so 0, until it has read them all). Everything the branch will still
deliver comes from those records. Neither what it has delivered so far nor the record at a
committed offset is a bound: partitions are not ordered by time. After a rebalance a
stage's new owner redoes the records the fence held back and appends their outputs after
later requests' (the broker kill test on Apache Kafka, 2026-11-27: 3 windows expired while
score redid them); two input partitions interleave into one output partition at their own
pace (2026-11-27: the record at score's committed offset was stamped 6 s past requests
still to come after it); a producer that is not idempotent can reorder a partition.

The groups feeding a branch are walked from the branch's own step upstream (``depth``):
the first that is not caught up decides. A gone branch step is gone even while the steps
before it are behind (nothing will pass through it), and a live step with records left
is behind even when a group before it is gone (what it holds still comes).

Every partition of an upstream group's input counts for every partition of the branch.
Co-partitioning maps partition *n* to *n* only while every writer hashes keys alike: a
client with librdkafka's default partitioner (CRC32, not Java's murmur2), or one that
picks partitions itself, writes requests whose outputs land in other partition numbers.

Committed offsets, end offsets and memberships are asked of the broker; the end offsets of
the stage's own inputs come in the same poll, after the commits, so an output acknowledged
before its commit is never missed.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from pipeline.kafka.partition_reads import OldestLeft, fetch_at, next_offset
from pipeline.settings import KafkaSettings

log = logging.getLogger(__name__)


class BranchState(enum.Enum):
    """What is known of a branch (or a sequence stage's upstream) on one partition."""

    BEHIND = "behind"
    CAUGHT_UP = "caught-up"
    GONE = "gone"


@dataclass(frozen=True)
class Upstream:
    """A consumer group, the topic it consumes, and where it sits relative to a branch."""

    group_id: str
    topic: str
    branch: str = ""
    """The join branch it feeds ("": the only upstream of a sequence stage)."""
    depth: int = 0
    """0: the branch's own step; 1: the step feeding that one; and so on."""


DEFAULT_GONE_AFTER_S = 180.0
"""How long a group may have no live member before its branch counts as gone: longer than
a rolling deploy's gap between one pod leaving and the next joining, or a slow rejoin."""

Committed = Mapping[tuple[str, TopicPartition], int | None]
"""(group, input partition) -> the group's committed offset (None: it never committed)."""


def _start(done: int | None, beginning: int) -> int:
    """Where a group's processing of a partition stands: its committed offset, or the
    partition's beginning where it never committed."""
    return beginning if done is None or done < 0 else done


def backlog(
    committed: Committed, beginning: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]
) -> set[tuple[str, TopicPartition]]:
    """The (group, partition) pairs with records left to process. Groups may share an input
    topic (a fan-out); one that never committed counts from the partition's beginning."""
    left = set()
    for key, done in committed.items():
        tp = key[1]
        start = _start(done, beginning.get(tp, 0))
        if start < end.get(tp, 0):
            left.add(key)
    return left


@dataclass
class Liveness:
    """When each group was last seen with a live member, by ``clock``. A group first seen
    without one counts from then: the stage may be starting, so it gets the full time."""

    gone_after_s: float
    clock: Callable[[], float] = time.monotonic
    _live_at: dict[str, float] = field(default_factory=dict)

    def observe(self, members: Mapping[str, int]) -> None:
        """``members``: group -> live members the broker lists for it now."""
        now = self.clock()
        for group, count in members.items():
            if count > 0 or group not in self._live_at:
                self._live_at[group] = now

    def gone(self, group: str) -> bool:
        seen = self._live_at.get(group)
        return seen is not None and self.clock() - seen > self.gone_after_s


def _chains(upstream: Sequence[Upstream]) -> dict[str, list[Upstream]]:
    """branch -> its groups, from its own step upstream."""
    chains: dict[str, list[Upstream]] = {}
    for up in sorted(upstream, key=lambda u: (u.depth, u.group_id, u.topic)):
        chains.setdefault(up.branch, []).append(up)
    return chains


def _has_left(up: Upstream, left: set[tuple[str, TopicPartition]]) -> bool:
    """Whether the group has records left on any partition of its input (module docstring)."""
    return any(group == up.group_id and tp.topic == up.topic for group, tp in left)


def branch_states(
    upstream: Sequence[Upstream],
    left: set[tuple[str, TopicPartition]],
    gone: Callable[[str], bool],
    numbers: Iterable[int],
) -> dict[tuple[str, int], BranchState]:
    """(branch, partition number) -> its state (see the module docstring)."""
    states = {}
    for branch, chain in _chains(upstream).items():
        state = BranchState.CAUGHT_UP
        for up in chain:
            if gone(up.group_id):
                state = BranchState.GONE
                break
            if _has_left(up, left):
                state = BranchState.BEHIND
                break
        for number in numbers:
            states[(branch, number)] = state
    return states


def branch_positions(
    upstream: Sequence[Upstream],
    left: set[tuple[str, TopicPartition]],
    gone: Callable[[str], bool],
    stamps: Mapping[tuple[str, TopicPartition], int | None],
) -> dict[str, int]:
    """branch -> the event time (ms) of the oldest record its live groups have left to finish
    (0 where a stamp is unknown: nothing may close on it). Groups past a gone one are left
    out: nothing of theirs passes through it. A branch with nothing left is absent."""
    positions: dict[str, int] = {}
    for branch, chain in _chains(upstream).items():
        for up in chain:
            if gone(up.group_id):
                break
            for key in left:
                if key[0] == up.group_id and key[1].topic == up.topic:
                    stamp = stamps.get(key)
                    positions[branch] = min(positions.get(branch, stamp or 0), stamp or 0)
    return positions


async def fetched_ends(
    client: AIOKafkaClient,
    listed: Mapping[TopicPartition, int],
    *,
    max_rounds: int = 8,
    cluster: ClusterMetadata | None = None,
) -> dict[TopicPartition, int]:
    """The end of each partition as the records a fetch returns show it, never below ``listed``
    (what ListOffsets answered) nor the high watermark a fetch reports.

    Why: the embedded broker, Tansu 0.6, answers ListOffsets below the end of its log, and
    stays there on a topic nobody writes any more (4,907 listed for 4,950 acknowledged records
    on one partition, measured 2026-11-26); so does the high watermark of its fetch answers
    until the records past it are read. A group that committed up to the listed end would
    look caught up with records left: a join closed its windows on it
    (``test_a_backlog_far_behind_catches_up_without_expiring_anything``). So the records from
    the listed end on are fetched (a few, on that broker; none on Apache Kafka, whose listed
    end is the end) until a fetch returns none.
    """
    ends = dict(listed)
    pending = set(listed)
    for _ in range(max_rounds):
        if not pending:
            break
        answers = await fetch_at(
            client, {tp: ends[tp] for tp in pending}, partition_bytes=1 << 20, total_bytes=4 << 20, cluster=cluster
        )
        pending = set()
        for tp, (high, data) in answers.items():
            after = next_offset(data)
            ends[tp] = max(ends[tp], high, after)
            if after > 0:
                pending.add(tp)  # records came back: there may be more past them
    return ends


def live_members(responses: Iterable[object]) -> dict[str, int]:
    """group -> members, from aiokafka's raw DescribeGroups responses (groups answered with
    an error are left out: unknown, so not evidence of anything)."""
    members: dict[str, int] = {}
    for response in responses:
        for group in getattr(response, "groups", ()):
            error_code, group_id, members_list = group[0], group[1], group[5]
            if error_code == 0:
                members[str(group_id)] = len(members_list)
    return members


class UpstreamProgress:
    """Polled states of ``upstream`` groups on the partition numbers a stage owns.

    Until a poll has succeeded (and whenever one fails), every branch counts as behind:
    the safe answer, since it only delays a window or an idle close.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        upstream: Sequence[Upstream],
        own_topics: Sequence[str],
        *,
        gone_after_s: float = DEFAULT_GONE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._upstream = list(upstream)
        self._own_topics = list(own_topics)
        self.liveness = Liveness(gone_after_s, clock)
        self._admin: AIOKafkaAdminClient | None = None
        self._client: AIOKafkaClient | None = None
        self._states: dict[tuple[str, int], BranchState] | None = None
        self._positions: dict[str, int] = {}
        self._oldest = OldestLeft()
        self._ends: dict[TopicPartition, int] = {}
        self._seen: tuple[Committed, Mapping[TopicPartition, int], Mapping[TopicPartition, int]] | None = None
        """The last poll's committed offsets, their inputs' ends and the own inputs' ends."""

    @property
    def branches(self) -> list[str]:
        return sorted({up.branch for up in self._upstream})

    async def start(self) -> None:
        if self._upstream:
            self._admin = AIOKafkaAdminClient(**self._settings.client_kwargs(), request_timeout_ms=5_000)
            await self._admin.start()
            self._client = AIOKafkaClient(**self._settings.client_kwargs(), request_timeout_ms=5_000)
            await self._client.bootstrap()

    async def stop(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    def state(self, branch: str, partition: int) -> BranchState:
        if self._states is None:
            return BranchState.BEHIND
        return self._states.get((branch, partition), BranchState.BEHIND)

    def behind(self, branch: str, partition: int) -> bool:
        return self.state(branch, partition) is BranchState.BEHIND

    def position(self, branch: str, partition: int) -> int | None:
        """None while the branch is not behind; else the event time (ms) of the oldest record
        its groups have left to finish, 0 where unknown (module docstring)."""
        if not self.behind(branch, partition):
            return None
        return self._positions.get(branch, 0)

    def summary(self) -> dict[str, BranchState]:
        """Per branch over the partitions polled: gone if gone anywhere, else behind if behind
        anywhere, else caught up (what the gauge and ``pipeline top`` show)."""
        worst: dict[str, BranchState] = {b: BranchState.CAUGHT_UP if self._states else BranchState.BEHIND for b in self.branches}
        for (branch, _number), state in (self._states or {}).items():
            if state is BranchState.GONE or (state is BranchState.BEHIND and worst[branch] is not BranchState.GONE):
                worst[branch] = state
        return worst

    def evidence(self, partition: int) -> str:
        """What the last poll saw: each upstream group's committed offset against its input's
        end on every partition, the behind branches' positions, and the stage's own inputs'
        ends on ``partition`` (logged when a window closes, so an expiry can be checked
        against the offsets it was decided on)."""
        if self._seen is None:
            return "no poll yet"
        committed, ends, own_ends = self._seen
        groups = [
            f"{group} at {committed.get((group, tp))} of {tp.topic}[{tp.partition}] end {ends.get(tp)}"
            for group, tp in sorted(committed, key=lambda k: (k[0], k[1].topic, k[1].partition))
        ]
        positions = [f"{branch or 'input'} position {at}" for branch, at in sorted(self._positions.items())]
        own = [f"{tp.topic} end {end}" for tp, end in sorted(own_ends.items()) if tp.partition == partition]
        return "; ".join(groups + positions + own)

    def end(self, tp: TopicPartition) -> int | None:
        """The end offset of one of the stage's own inputs as of the last poll."""
        return self._ends.get(tp)

    async def _members(self, admin: AIOKafkaAdminClient) -> dict[str, int]:
        """Live members per upstream group, one DescribeGroups request per group: the embedded
        broker (Tansu) answers a request naming several groups with a response aiokafka cannot
        decode. A group not answered is left out: no evidence either way."""
        members: dict[str, int] = {}
        for group in sorted({up.group_id for up in self._upstream}):
            try:
                members.update(live_members(await admin.describe_consumer_groups([group])))
            except KafkaError as exc:
                log.debug("members of %s unknown (%r)", group, exc)
        return members

    async def poll(self, consumer: AIOKafkaConsumer, partitions: Iterable[int]) -> None:
        numbers = sorted(set(partitions))
        try:
            committed: dict[tuple[str, TopicPartition], int | None] = {}
            if self._admin is not None:
                self.liveness.observe(await self._members(self._admin))
            cluster = await self._client.fetch_all_metadata() if self._client is not None else None
            for group, topic in sorted({(up.group_id, up.topic) for up in self._upstream}):
                assert self._admin is not None
                every = cluster.partitions_for_topic(topic) if cluster is not None else None
                tps = [TopicPartition(topic, p) for p in sorted(every or numbers)]  # all (module docstring)
                offsets = await self._admin.list_consumer_group_offsets(group, partitions=tps)
                committed.update({(group, tp): (offsets[tp].offset if tp in offsets else None) for tp in tps})
            inputs = sorted({tp for _, tp in committed})
            ends = await consumer.end_offsets(inputs) if inputs else {}
            beginning = await consumer.beginning_offsets(inputs) if inputs else {}
            left = backlog(committed, beginning, ends)
            # ListOffsets can answer short (Tansu): a partition that looks done is read past its
            # listed end before a group counts as caught up on it (only those: it costs a fetch).
            done = {tp for key in committed if key not in left and (tp := key[1]) in ends}
            if self._client is not None and done:
                ends = {**ends, **await fetched_ends(self._client, {tp: ends[tp] for tp in done}, cluster=cluster)}
                left = backlog(committed, beginning, ends)
            own = [TopicPartition(topic, p) for topic in self._own_topics for p in numbers]
            own_ends = dict(await consumer.end_offsets(own)) if own else {}
            # The stage's own inputs too: a join that read a branch to its short listed end (and
            # its fetches' high watermark, as short) took the branch as read, and expired windows
            # whose records were still to come (backlog test, 2026-11-27: 4,965 joins expired
            # "caught-up"). From the listed end the fetch reads only the tail past it.
            if self._client is not None and own_ends:
                own_ends = await fetched_ends(self._client, own_ends, cluster=cluster)
            self._ends = own_ends
            self._seen = (committed, ends, own_ends)  # formatted only when logged (evidence())
            starts = {key: _start(committed[key], beginning.get(key[1], 0)) for key in left}
            stamps = await self._oldest.oldest(self._client, starts, ends, cluster) if self._client is not None else {}
        except (KafkaError, OSError) as exc:
            log.warning("progress of upstream groups unknown (%r): windows wait", exc)
            self._states = None
            return
        self._positions = branch_positions(self._upstream, left, self.liveness.gone, stamps)
        states = branch_states(self._upstream, left, self.liveness.gone, numbers)
        for (branch, number), state in sorted(states.items(), key=lambda kv: kv[0]):
            if self._states is None or self._states.get((branch, number)) is not state:
                log.info("upstream of %s[%d] now %s: %s", branch or "input", number, state.value, self.evidence(number))
        self._states = states
