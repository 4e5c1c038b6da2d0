"""Pure rules behind 'every record reaches an outcome' for streams and joins: where a chunk
goes, event time, and what a join's expiry emits."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from aiokafka.structs import TopicPartition

from pipeline.contract.records import read_dead_letter, read_source
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import KafkaSettings
from workers.join.stage import JoinSettings, JoinStage, JoinState
from workers.runtime.event_time import EventTimeClock, now_ms
from workers.runtime.stage_io import StageIO
from workers.sequence.chunks import Chunk, Placement, placement
from workers.sequence.model import sequence_id
from workers.sequence.state import StreamState


def _chunk(index: int, payload: bytes = b"x", *, start: bool = False) -> Chunk:
    record = SimpleNamespace(topic="t", partition=0, offset=index, timestamp=0, key=b"k", value=payload, headers=[])
    request = SimpleNamespace(sequence_start=start, sequence_end=False)
    return Chunk(record, None, request, index, np.zeros(1, np.float32))  # type: ignore[arg-type]


def _skipped(start: int, stop: int) -> StreamState:
    state = StreamState(key="k", next_index=start)
    state.skip(start, stop)
    assert state.next_index == stop
    return state


def _state(next_index: int, *, ended: bool = False, applied: dict[int, bytes] | None = None) -> StreamState:
    state = StreamState(key="k", next_index=next_index, ended=ended)
    for i, payload in (applied or {}).items():
        state.remember(i, payload)
    return state


@pytest.mark.parametrize(
    ("state", "chunk", "waiting", "want"),
    [
        (None, _chunk(0, start=True), {}, (Placement.APPLY, "")),
        (None, _chunk(0), {}, Placement.REJECT),  # chunk 0 without sequence_start
        (None, _chunk(3), {}, (Placement.WAIT, "")),
        (None, _chunk(17), {}, Placement.OVERFLOW),  # beyond a window of 16
        (_state(5, applied={4: b"x"}), _chunk(4, b"x"), {}, (Placement.DUPLICATE, "duplicate-chunk")),
        (_state(5, applied={4: b"x"}), _chunk(4, b"y"), {}, Placement.REJECT),  # conflicting
        (_state(100), _chunk(4), {}, (Placement.DUPLICATE, "old-chunk-unverifiable")),
        (_skipped(2, 2**40), _chunk(5), {}, Placement.REJECT),  # arrived after its gap was skipped
        (_state(5), _chunk(7, b"a"), {7: _chunk(7, b"a")}, (Placement.DUPLICATE, "duplicate-chunk")),
        (_state(5), _chunk(7, b"b"), {7: _chunk(7, b"a")}, Placement.REJECT),
        (_state(9, ended=True), _chunk(9), {}, Placement.REJECT),  # after the end
        (_state(9, ended=True, applied={0: b"first"}), _chunk(0, b"first", start=True), {}, Placement.DUPLICATE),
        (_state(9, ended=True, applied={0: b"first"}), _chunk(0, b"next", start=True), {}, (Placement.RESTART, "")),
    ],
)
def test_placement(state: StreamState | None, chunk: Chunk, waiting: dict[int, Chunk], want: Any) -> None:
    got = placement(state, chunk, waiting, reorder_window=16)
    if isinstance(want, Placement):
        assert got[0] is want and (want is Placement.DUPLICATE or got[1]), got  # refusals say why
    else:
        assert got == want


def test_first_chunk_digest_outlives_the_remembered_window() -> None:
    state = _state(0)
    for i in range(200):
        state.remember(i, f"c{i}".encode())
    state.ended = True
    assert 0 not in state.digests and state.first_digest is not None
    assert placement(state, _chunk(0, b"c0", start=True), {}, 16)[0] is Placement.DUPLICATE


class Highwater:
    def __init__(self) -> None:
        self.ends: dict[TopicPartition, int] = {}

    def __call__(self, tp: TopicPartition) -> int | None:
        return self.ends.get(tp)


def _record(offset: int, timestamp: int) -> Any:
    return SimpleNamespace(topic="t", partition=0, offset=offset, timestamp=timestamp, key=b"", value=b"", headers=[])


def test_watermark_is_event_time_while_behind_and_now_when_caught_up() -> None:
    tp = TopicPartition("t", 0)
    ends = Highwater()
    clock = EventTimeClock(ends, grace_ms=1000)
    clock.assigned([tp])
    assert clock.watermark([tp]) == 0, "nothing read yet: behind for the grace period"
    old = now_ms() - 3_600_000
    clock.observe(_record(10, old))
    ends.ends[tp] = 500  # a backlog: records up to offset 499 exist
    assert clock.watermark([tp]) == old
    assert clock.since_s(old - 5000, [tp]) == pytest.approx(5.0)
    ends.ends[tp] = 11  # caught up
    assert abs(clock.watermark([tp]) - now_ms()) < 1000


def test_a_partition_the_broker_stopped_answering_for_is_behind() -> None:
    """A broker outage must not age streams by the wall clock: the end offset last fetched
    is old news once fetches stop being answered, and records may be waiting behind it."""
    tp = TopicPartition("t", 0)
    ends = Highwater()
    answered: dict[str, int | None] = {"at": now_ms()}
    clock = EventTimeClock(ends, grace_ms=10_000, fetched_at=lambda _tp: answered["at"], stale_ms=5_000)
    stamp = now_ms() - 60_000
    clock.observe(_record(10, stamp))
    ends.ends[tp] = 11  # caught up as of the last fetch
    assert abs(clock.watermark([tp]) - now_ms()) < 1000, "fetches answered: caught up, event time is now"
    answered["at"] = now_ms() - 5_001
    clock.watch([tp])
    assert clock.watermark([tp]) == stamp, "no fetch answered for 5 s: only what was read counts"
    answered["at"] = now_ms()
    assert clock.watermark([tp]) == stamp, "answered again: read for the grace period before it is trusted"
    clock.grace_ms = 0
    answered["at"] = now_ms() - 6_000
    clock.watch([tp])  # silent again, now with no grace
    answered["at"] = now_ms()
    assert abs(clock.watermark([tp]) - now_ms()) < 1000, "answered again, grace over: caught up"
    answered["at"] = None
    assert clock.watermark([tp]) == stamp, "never answered: behind"


def test_a_stage_that_could_not_look_for_a_while_reads_before_it_trusts() -> None:
    """The membership fence holds a stage's loop through a broker outage, so no sweep sees
    the silence; the gap between two sweeps is the evidence: grace before trust."""
    tp = TopicPartition("t", 0)
    ends = Highwater()
    clock = EventTimeClock(ends, grace_ms=10_000, fetched_at=lambda _tp: now_ms(), stale_ms=5_000)
    stamp = now_ms() - 60_000
    clock.observe(_record(10, stamp))
    ends.ends[tp] = 11
    clock.watch([tp])
    assert abs(clock.watermark([tp]) - now_ms()) < 1000, "swept just now, fetches answered: caught up"
    clock._last_watch = now_ms() - 30_000  # the last sweep was 30 s ago
    clock.watch([tp])
    assert clock.watermark([tp]) == stamp, "30 s unseen: read for the grace period first"


def test_future_timestamps_are_clamped() -> None:
    clock = EventTimeClock(Highwater(), grace_ms=0, max_future_ms=60_000)
    far = now_ms() + 365 * 86_400_000
    assert clock.observe(_record(0, far)) <= now_ms() + 60_000


def _join(mode: str) -> JoinStage:
    io = StageIO(stage="j", group_id="g", input_topic="a", output_topic="out", dead_letter_topic="dl")
    settings = JoinSettings(name="j", branches=("a", "b", "c"), input_topics=("a", "b", "c"), mode=mode, window_ms=10)
    return JoinStage(io, settings, state_topic="j.state", kafka=KafkaSettings(bootstrap_servers="x:1"), metrics=PipelineMetrics())


def test_inner_join_expiry_dead_letters_every_branch_that_arrived_with_its_own_headers() -> None:
    stage = _join("inner")
    state = JoinState(
        first_ms=int(time.time() * 1000),
        branches={"a": b"A", "b": b"B"},
        headers=[("h", b"first")],
        branch_headers={"a": [("h", b"from-a")], "b": [("h", b"from-b")]},
        digests={"a": "da", "b": "db"},
        positions={"a": ("a", 0, 7), "b": ("b", 0, 9)},
    )
    stage.states.put(b"cid", state, 0)
    entry = stage.states.entry(b"cid")
    assert entry is not None
    out = stage._expire(entry)
    letters = [r for r in out if r.dead_letter]
    assert [(r.value, dict(r.headers)["h"]) for r in letters] == [(b"A", b"from-a"), (b"B", b"from-b")]
    assert all("missing c" in read_dead_letter(r.headers).reason for r in letters)
    sources = [read_source(list(r.headers)) for r in letters]
    assert [(s.topic, s.partition, s.offset) for s in sources if s is not None] == [("a", 0, 7), ("b", 0, 9)], (
        "each names where its branch record was read: replayable, and accounted for"
    )
    marker = stage.states.get(b"cid")
    assert marker is not None and marker.done and marker.branches == {}
    assert marker.digests == {"a": "da", "b": "db"}, "kept: a late replay is told from a reused id"


def test_open_joins_are_bounded_and_the_idlest_is_expired_not_dropped() -> None:
    io = StageIO(stage="j", group_id="g", input_topic="a", output_topic="out", dead_letter_topic="dl")
    settings = JoinSettings(name="j", branches=("a", "b"), input_topics=("a", "b"), window_ms=10_000, max_open=2)
    stage = JoinStage(io, settings, state_topic="j.state", kafka=KafkaSettings(bootstrap_servers="x:1"), metrics=PipelineMetrics())
    for key in (b"old", b"new"):
        stage.states.put(key, JoinState(first_ms=now_ms(), branches={"a": key}, digests={"a": "d"}), 0)
    victims = stage.states.make_room(b"third")
    assert [e.key for e in victims] == [b"old"]
    out = stage._evict(victims[0])
    assert [(r.topic, r.value, r.dead_letter) for r in out[:1]] == [("dl", b"old", True)], "its branch is dead-lettered"
    assert out[-1].value is None and out[-1].topic == "j.state", "and its state deleted (tombstone)"
    assert stage.states.get(b"old") is None and len(stage.states) == 1


def test_a_streams_triton_sequence_id_is_stable_for_one_worker_and_differs_for_the_next() -> None:
    """A stream's next owner calls another Triton sequence: a late frame of a frozen former
    owner lands in the abandoned one (docs/streaming.md, Affinity)."""
    a, b = b"\x01" * 8, b"\x02" * 8
    assert sequence_id(b"audio-05", a) == sequence_id(b"audio-05", a)
    assert sequence_id(b"audio-05", a) != sequence_id(b"audio-05", b)
    assert sequence_id(b"audio-05", a) != sequence_id(b"audio-06", a)
    ids = [sequence_id(f"s-{i}".encode(), a) for i in range(1000)]
    assert all(0 < sid < 2**63 for sid in ids) and len(set(ids)) == len(ids)
