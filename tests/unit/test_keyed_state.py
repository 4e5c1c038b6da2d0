"""The keyed-state store and its codec: expiry, the key bound, corrupt records, envelopes.

Pure logic (no broker): restore from Kafka is exercised by the sequence and join
integration tests (kill -9, rebalance), which use this store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pipeline.settings import KafkaSettings
from pipeline.state import CorruptState, KeyedStateStore, StateLimits, decode_state, encode_state
from workers.join.stage import JoinState, JoinStateCodec


@dataclass
class Counter:
    n: int


class CounterCodec:
    kind = "counter"

    def to_dict(self, state: Counter) -> dict[str, Any]:
        return {"n": state.n}

    def from_dict(self, data: dict[str, Any], version: int) -> Counter:
        return Counter(int(data["n"]))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _store(clock: Clock, *, ttl_s: float = 10.0, max_keys: int | None = None) -> KeyedStateStore[Counter]:
    return KeyedStateStore(
        kafka=KafkaSettings(bootstrap_servers="unused:9092"),
        topic="t.state",
        codec=CounterCodec(),
        limits=StateLimits(ttl_s=ttl_s, max_keys=max_keys),
        clock=clock,
    )


def test_put_returns_a_checkpoint_after_acks_and_delete_a_tombstone() -> None:
    store = _store(Clock())
    record = store.put(b"k", Counter(3), partition=2)
    assert (record.topic, record.key, record.partition, record.after_acks) == ("t.state", b"k", 2, True)
    assert not record.counts_as_result
    assert decode_state(CounterCodec(), record.value or b"") == Counter(3)
    tombstone = store.delete(b"k")
    assert tombstone is not None and tombstone.value is None and tombstone.partition == 2
    assert store.get(b"k") is None and store.delete(b"k") is None


def test_entries_expire_after_their_ttl_and_touch_renews_it() -> None:
    clock = Clock()
    store = _store(clock, ttl_s=10)
    store.put(b"a", Counter(1), 0)
    store.put(b"b", Counter(2), 0, ttl_s=30)
    clock.now += 5
    store.touch(b"a")  # a now expires at +15
    clock.now += 6
    assert store.due() == []
    clock.now += 5
    assert [e.key for e in store.due()] == [b"a"]
    assert store.due() == []  # handed out once; the caller deletes or renews it
    clock.now += 20
    assert [e.key for e in store.due()] == [b"b"]


def test_the_key_bound_names_the_idlest_entries_for_eviction() -> None:
    clock = Clock()
    store = _store(clock, max_keys=3)
    for i, key in enumerate([b"a", b"b", b"c"]):
        clock.now += 1
        store.put(key, Counter(i), 0)
    store.touch(b"a")  # a is now the most recently active
    assert [e.key for e in store.make_room(b"d")] == [b"b"]
    assert store.make_room(b"a") == []  # an existing key needs no room


def test_forget_drops_only_the_partitions_handed_back() -> None:
    store = _store(Clock())
    store.put(b"a", Counter(1), 0)
    store.put(b"b", Counter(2), 1)
    gone = store.forget([0])
    assert [e.key for e in gone] == [b"a"] and len(store) == 1 and b"b" in store


def test_the_heap_stays_proportional_to_live_keys() -> None:
    store = _store(Clock())
    for i in range(10_000):
        store.touch(b"k") if i else store.put(b"k", Counter(0), 0)
    assert len(store._expiry) <= 4 * len(store) + 64


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"v": 2, "kind": "join", "state": {"n": 1}}',
        b'{"v": 2, "kind": "counter", "state": {}}',
        b'{"v": 9, "kind": "counter", "state": {"n": 1}}',
        b'{"v": 2, "kind": "counter", "state": {"n": "x"}}',
        b"\xff\xfe",
    ],
)
def test_undecodable_states_raise_corrupt_state(value: bytes) -> None:
    with pytest.raises(CorruptState):
        decode_state(CounterCodec(), value)


def test_join_state_round_trip_and_pre_envelope_records() -> None:
    codec = JoinStateCodec()
    state = JoinState(first_ms=5, branches={"a": b"\x00\x01"}, headers=[("h", b"\xff")], positions={"a": ("t.a", 1, 42)})
    assert decode_state(codec, encode_state(codec, state)) == state
    legacy = b'{"first_ms":7,"partition":1,"done":true,"branches":{},"headers":[["h","AA=="]]}'
    assert decode_state(codec, legacy) == JoinState(first_ms=7, done=True, headers=[("h", b"\x00")])
