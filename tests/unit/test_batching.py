"""The dynamic batcher: full or old enough, never mixing keys."""

from __future__ import annotations

import pytest

from workers.stateless.batching import DynamicBatcher
from workers.stateless.tenancy.fair_batcher import FairBatcher


def test_releases_when_rows_reach_max() -> None:
    batcher: DynamicBatcher[str] = DynamicBatcher(max_rows=4, max_delay_s=10)
    assert batcher.add("k", "a", rows=1, now=0) == []
    assert batcher.add("k", "b", rows=2, now=0) == []
    [batch] = batcher.add("k", "c", rows=1, now=0)
    assert batch.items == ["a", "b", "c"] and batch.rows == 4
    assert len(batcher) == 0


def test_an_item_that_would_overflow_starts_a_new_batch() -> None:
    batcher: DynamicBatcher[str] = DynamicBatcher(max_rows=4, max_delay_s=10)
    batcher.add("k", "a", rows=3, now=0)
    [full] = batcher.add("k", "b", rows=2, now=1)
    assert full.items == ["a"] and full.rows == 3
    assert len(batcher) == 1


def test_different_keys_never_share_a_batch() -> None:
    batcher: DynamicBatcher[str] = DynamicBatcher(max_rows=2, max_delay_s=10)
    batcher.add(("m", (16,)), "a", rows=1, now=0)
    batcher.add(("m", (32,)), "b", rows=1, now=0)
    [batch] = batcher.add(("m", (16,)), "c", rows=1, now=0)
    assert batch.items == ["a", "c"]
    assert [b.items for b in batcher.drain()] == [["b"]]


def test_due_after_max_delay_from_the_oldest_item() -> None:
    batcher: DynamicBatcher[str] = DynamicBatcher(max_rows=64, max_delay_s=0.005)
    batcher.add("k", "a", rows=1, now=100.0)
    batcher.add("k", "b", rows=1, now=100.004)
    assert batcher.next_due() == pytest.approx(100.005)
    assert batcher.due(now=100.0049) == []
    [batch] = batcher.due(now=100.0051)
    assert batch.items == ["a", "b"]
    assert batcher.next_due() is None


def test_a_batch_is_released_by_bytes_before_rows() -> None:
    batcher: DynamicBatcher[str] = DynamicBatcher(max_rows=64, max_delay_s=10.0, max_bytes=100)
    assert batcher.add("k", "a", 1, now=0.0, size=60) == []
    released = batcher.add("k", "b", 1, now=0.0, size=60)  # 120 > 100: "a" goes first, alone
    assert [b.items for b in released] == [["a"]]
    assert [b.items for b in batcher.add("k", "c", 1, now=0.0, size=40)] == []  # b + c = 100: fits
    huge = batcher.add("k", "d", 1, now=0.0, size=500)  # b + c leave; d alone is over the limit
    assert [b.items for b in huge] == [["b", "c"], ["d"]]
    assert len(batcher) == 0


def test_with_a_free_call_slot_the_oldest_groups_go_at_once() -> None:
    """Work conserving: no wait below saturation, one call per free slot, oldest first."""
    batcher: DynamicBatcher[str] = DynamicBatcher(max_rows=64, max_delay_s=10)
    batcher.add("late", "c", rows=1, now=2.0)
    batcher.add("early", "a", rows=1, now=1.0)
    batcher.add("early", "b", rows=1, now=1.5)
    assert batcher.take_for_free_calls(0) == [], "every call busy: the groups keep forming"
    [first] = batcher.take_for_free_calls(1)
    assert first.items == ["a", "b"], "the oldest group, whole, though far from full and not due"
    assert [b.items for b in batcher.take_for_free_calls(4)] == [["c"]]
    assert len(batcher) == 0 and batcher.take_for_free_calls(4) == []


def test_with_pick_a_free_slot_takes_one_call_of_max_rows() -> None:
    picked: list[int] = []

    def pick(items: list[str], max_rows: int) -> list[int]:
        picked.append(len(items))
        return list(range(max_rows))

    batcher: FairBatcher[str] = FairBatcher(max_rows=2, max_delay_s=10, pick=pick, capacity=lambda: 0)
    for i, item in enumerate("abc"):
        assert batcher.add("k", item, rows=1, now=float(i)) == [], "no capacity: nothing goes by itself"
    [call] = batcher.take_for_free_calls(1)
    assert call.items == ["a", "b"] and picked == [3]
    assert len(batcher) == 1, "the rest stays, first in line"
