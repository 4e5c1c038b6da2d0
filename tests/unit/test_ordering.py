"""The ordering ledger: outputs leave in arrival order, commits only past acknowledged outputs."""

from __future__ import annotations

import random

import pytest
from aiokafka.structs import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.kafka.ordering import OrderedOffsets, Slot

TP = TopicPartition("requests", 0)
TP1 = TopicPartition("requests", 1)


def test_outputs_leave_in_arrival_order_even_when_finished_out_of_order() -> None:
    ledger: OrderedOffsets[str] = OrderedOffsets()
    slots = [ledger.add(TP, offset) for offset in range(5)]
    slots[2].output = "c"
    slots[1].output = "b"
    assert list(ledger.emittable(TP)) == []  # head (offset 0) not ready: nothing may leave
    slots[0].output = "a"
    assert [s.output for s in ledger.emittable(TP)] == ["a", "b", "c"]
    assert list(ledger.emittable(TP)) == []  # each slot is emitted once
    slots[4].output = "e"
    slots[3].output = "d"
    assert [s.output for s in ledger.emittable(TP)] == ["d", "e"]


def test_commit_point_only_moves_past_acknowledged_head() -> None:
    ledger: OrderedOffsets[str] = OrderedOffsets()
    slots = [ledger.add(TP, offset) for offset in (10, 11, 12)]
    for slot in slots:
        slot.output = "x"
    list(ledger.emittable(TP))
    ledger.acknowledge(slots[1])  # acknowledged out of order: offset 10 still open
    assert ledger.committable() == {}
    ledger.acknowledge(slots[0])
    assert ledger.committable() == {TP: 12}
    ledger.mark_committed({TP: 12})
    assert ledger.committable() == {}
    ledger.acknowledge(slots[2])
    assert ledger.committable() == {TP: 13}
    assert ledger.pending() == 0


def test_an_empty_line_commits_up_to_the_read_position_past_offsets_with_no_record() -> None:
    """A transactional topic: offset 11 is the transaction's commit marker, which no consumer
    is handed. Once the line is empty, the consumer's position (12) is committable, so a group
    that has read to the end shows no lag; while a slot is unfinished, the position moves nothing."""
    ledger: OrderedOffsets[str] = OrderedOffsets()
    slot = ledger.add(TP, 10)
    ledger.read_to(TP, 12)  # not empty: the unfinished record at 10 rules
    assert ledger.committable() == {}
    slot.output = "x"
    list(ledger.emittable(TP))
    ledger.acknowledge(slot)
    assert ledger.committable() == {TP: 11}
    ledger.read_to(TP, 12)
    assert ledger.committable() == {TP: 12}
    ledger.read_to(TP, 5)  # an older position never moves the commit point back
    assert ledger.committable() == {TP: 12}
    ledger.read_to(TP1, 3)  # a partition read past markers only, no record tracked yet
    assert ledger.committable() == {TP: 12, TP1: 3}


def test_partitions_are_independent() -> None:
    ledger: OrderedOffsets[str] = OrderedOffsets()
    a = ledger.add(TP, 0)
    b = ledger.add(TP1, 0)
    b.output = "b"
    assert [s.output for s in ledger.emittable(TP1)] == ["b"]
    assert list(ledger.emittable(TP)) == []
    ledger.acknowledge(b)
    assert ledger.committable() == {TP1: 1}
    assert ledger.pending(TP) == 1 and a.output is None


def test_offsets_must_increase() -> None:
    ledger: OrderedOffsets[str] = OrderedOffsets()
    ledger.add(TP, 5)
    with pytest.raises(ValueError):
        ledger.add(TP, 5)


def test_forget_returns_unfinished_and_late_acknowledgement_is_harmless() -> None:
    ledger: OrderedOffsets[str] = OrderedOffsets()
    slots = [ledger.add(TP, o) for o in range(3)]
    assert len(ledger.forget(TP)) == 3
    ledger.acknowledge(slots[0])  # a delivery report after revocation
    assert ledger.committable() == {}


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_random_completion_order_never_reorders_or_commits_early(n: int, seed: int) -> None:
    rng = random.Random(seed)
    ledger: OrderedOffsets[int] = OrderedOffsets()
    slots = [ledger.add(TP, o) for o in range(n)]
    emitted: list[int] = []
    acknowledged: set[int] = set()
    for offset in rng.sample(range(n), n):
        slots[offset].output = offset
        ready = [s for s in ledger.emittable(TP)]
        emitted.extend(s.output for s in ready if s.output is not None)
        for slot in rng.sample(ready, len(ready)):
            ledger.acknowledge(slot)
            acknowledged.add(slot.offset)
        commit = ledger.committable().get(TP)
        if commit is not None:
            assert all(o in acknowledged for o in range(commit))
    assert emitted == list(range(n))
    assert ledger.committable() == {TP: n}


def test_pending_bytes_follow_acknowledgement_and_forgetting() -> None:
    offsets: OrderedOffsets[str] = OrderedOffsets()
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    first = offsets.add(a, 0, size=1000)
    second = offsets.add(a, 1, size=24)
    offsets.add(b, 0, size=5)
    assert offsets.pending_bytes() == 1029
    second.output = first.output = "out"
    offsets.acknowledge(second)  # not the head yet: nothing popped
    assert offsets.pending_bytes() == 1029
    offsets.acknowledge(first)
    assert offsets.pending_bytes() == 5
    offsets.forget(b)
    assert offsets.pending_bytes() == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=60), st.randoms())
def test_acknowledging_a_record_batchs_slots_together_equals_one_by_one(sizes: list[int], rnd: random.Random) -> None:
    """``acknowledge_all`` (a record batch's slots, from both lines, in any order) leaves the
    same commit points, pending counts and bytes as acknowledging each slot alone."""
    together: OrderedOffsets[str] = OrderedOffsets()
    alone: OrderedOffsets[str] = OrderedOffsets()
    slots: list[tuple[Slot[str], Slot[str]]] = []
    for line in (TP, TP1):
        for offset in range(30):
            slots.append((together.add(line, offset, size=offset + 1), alone.add(line, offset, size=offset + 1)))
    rnd.shuffle(slots)
    at = 0
    for count in sizes:
        batch = slots[at : at + count]
        at += count
        together.acknowledge_all([a for a, _ in batch])
        for _, b in batch:
            alone.acknowledge(b)
        assert together.committable() == alone.committable()
        assert together.pending() == alone.pending() and together.pending_bytes() == alone.pending_bytes()
