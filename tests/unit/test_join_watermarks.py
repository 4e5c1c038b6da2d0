"""A join's branch is caught up only when the stages upstream of it are too.

Why: a join read to the end of one branch's topic used to count that branch as "now",
so a branch merely slower than the other (a backlog, a restarted stage) had its joins
expired and dead-lettered. These are the pure rules behind the fix: which groups feed a
join, when a group is behind, and what the watermark does while one is. (Issue 28's
rule, behind until proven gone, is tested in tests/unit/test_branch_progress.py.)
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiokafka.structs import TopicPartition

from pipeline.kafka.progress import backlog
from tests.helpers.branch_graph import two_branch_graph
from workers.runtime.event_time import EventTimeClock, now_ms


def _record(partition: int, offset: int, timestamp: int) -> Any:
    return SimpleNamespace(topic="b", partition=partition, offset=offset, timestamp=timestamp)


def test_the_groups_feeding_a_join_are_every_step_upstream_of_its_branches() -> None:
    graph = two_branch_graph()
    [join] = graph.joins
    assert graph.joins[join].branches == ("calibrate", "b")
    assert graph.feeding(join) == [("a", "t.prep.out"), ("b", "t.prep.out"), ("calibrate", "t.a.out"), ("prep", "t.in")]


class _Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _numbers(left: set[tuple[str, TopicPartition]]) -> set[int]:
    return {tp.partition for _group, tp in left}


def test_a_group_is_behind_where_it_has_records_left() -> None:
    p0, p1, p2 = (TopicPartition("in", p) for p in range(3))
    committed = {("g", p0): 10, ("g", p1): 7, ("g", p2): None}  # p2: never committed
    beginning = {p0: 0, p1: 0, p2: 5}
    assert _numbers(backlog(committed, beginning, {p0: 10, p1: 9, p2: 5})) == {1}
    assert _numbers(backlog(committed, beginning, {p0: 10, p1: 7, p2: 6})) == {2}


def test_two_branches_reading_one_topic_are_judged_each_on_its_own_commits() -> None:
    tp = TopicPartition("features", 0)
    slow_behind = {("fast", tp): 100, ("slow", tp): 40}  # both branches consume the fan-out topic
    assert backlog(slow_behind, {tp: 0}, {tp: 100}) == {("slow", tp)}, "the slow branch holds the window"
    assert backlog({("fast", tp): 100, ("slow", tp): 100}, {tp: 0}, {tp: 100}) == set()


def test_a_branch_read_to_its_end_waits_while_its_upstream_is_behind() -> None:
    tp = TopicPartition("b", 0)
    upstream = {"behind": True}
    old = now_ms() - 3_600_000
    # Its stages have a record stamped ``old`` left to finish (their position).
    clock = EventTimeClock(lambda _tp: 11, grace_ms=0, upstream_position=lambda _tp: old if upstream["behind"] else None)
    clock.assigned([tp])
    clock.observe(_record(0, 10, old))  # read to the end of the branch topic (end offset 11)
    assert clock.watermark([tp]) == old, "the stage writing this branch has more to write: not 'now'"
    upstream["behind"] = False
    assert abs(clock.watermark([tp]) - now_ms()) < 1000


def test_a_branch_nothing_was_read_from_waits_while_its_upstream_is_behind() -> None:
    tp = TopicPartition("b", 0)
    clock = EventTimeClock(lambda _tp: 0, grace_ms=0, upstream_position=lambda _tp: 0)  # behind, position unknown
    clock.assigned([tp])
    assert clock.watermark([tp]) == 0, "a restarted branch stage has not written yet: no window may close"


def test_a_branch_redoing_older_records_holds_the_window_though_it_delivered_later_ones() -> None:
    """Issue 28, the broker kill test on Apache Kafka (2026-11-27): after the rebalance,
    score's new owner redid the requests whose outputs the fence had held, and appended them
    to score.out after later requests' outputs. The join had read score.out to its end, so
    what the branch had delivered was stamped past the window, while its oldest record left
    to finish (its position) was not: the position decides, less the late grace."""
    tp = TopicPartition("b", 0)
    start = now_ms() - 60_000
    position = {"ms": start + 100}  # the first redone request, at the group's committed offset
    clock = EventTimeClock(lambda _tp: 3, grace_ms=0, upstream_position=lambda _tp: position["ms"], late_grace_ms=1_000)
    clock.assigned([tp], {tp: 0})
    for offset, stamp in enumerate((start, start + 9_000, start + 10_000)):  # later requests, delivered first
        clock.observe(_record(0, offset, stamp))
    assert clock.caught_up(tp) is False
    assert clock.watermark([tp]) == start + 100 - 1_000, "not the 10 s the branch delivered"
    position["ms"] = start + 20_000  # the redo is done; the branch works on requests 20 s in
    assert clock.watermark([tp]) == start + 19_000


def test_a_branch_position_never_runs_past_what_the_join_has_read() -> None:
    tp = TopicPartition("b", 0)
    start = now_ms() - 60_000
    clock = EventTimeClock(lambda _tp: 10, grace_ms=0, upstream_position=lambda _tp: start + 50_000, late_grace_ms=1_000)
    clock.assigned([tp], {tp: 0})
    clock.observe(_record(0, 4, start + 5_000))  # five records of ten read
    assert clock.watermark([tp]) == start + 5_000, "the unread records of the branch topic come first"


def test_a_partition_nothing_was_read_from_is_behind_while_its_end_is_past_where_reading_starts() -> None:
    """Backlog test, 2026-11-27: a join that had read nothing of a branch partition 5,035
    records long took it as read once the grace after its assignment ran out, and expired
    every window on it "caught-up". With the group's committed offset as the start, the
    partition is behind until its records are read; one whose end is the start is not."""
    tp, empty = TopicPartition("score.out", 1), TopicPartition("score.out", 0)
    ends = {tp: 5035, empty: 120}
    clock = EventTimeClock(lambda t: ends[t], grace_ms=0)
    clock.assigned([tp, empty], {tp: 0, empty: 120})
    assert not clock.caught_up(tp), "5,035 records past the start, none read"
    assert clock.caught_up(empty), "nothing past the start"
    record = SimpleNamespace(topic=tp.topic, partition=1, offset=5034, timestamp=now_ms())
    clock.observe(record)
    assert clock.caught_up(tp), "read to its end"
    unknown = TopicPartition("score.out", 2)
    ends[unknown] = 10
    clock.assigned([unknown])
    assert not clock.caught_up(unknown), "start unknown (broker not answering): counted from offset 0, never taken as read"
    record = SimpleNamespace(topic=unknown.topic, partition=2, offset=9, timestamp=now_ms())
    clock.observe(record)
    assert clock.caught_up(unknown), "read to its end"
