"""The fetch guard of pipeline/kafka/continuity.py, offline: record batches built with aiokafka's
own builder, unpacked by the guarded ``PartitionRecords`` exactly as a consumer's ``getmany`` does."""

from __future__ import annotations

import inspect
import struct
import time

import aiokafka.consumer.fetcher as aiokafka_fetcher
import pytest
from aiokafka.consumer.fetcher import READ_COMMITTED
from aiokafka.record import _crecords
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy, _DefaultRecordBatchPy
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from pipeline.kafka import continuity
from pipeline.kafka.clients import make_consumer
from pipeline.kafka.continuity import TRUST_AFTER_S, TRUST_AFTER_TRIES, GuardedPartitionRecords
from pipeline.settings import KafkaSettings

TP = TopicPartition("audio.chunks", 2)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def detections(monkeypatch: pytest.MonkeyPatch) -> continuity._Detections:
    fresh = continuity._Detections(Clock())
    monkeypatch.setattr(continuity, "DETECTIONS", fresh)
    return fresh


def batch(base: int, count: int, *, producer_id: int = -1, transactional: bool = False) -> bytes:
    """A v2 batch of ``count`` data records at offsets ``base``..``base + count - 1``."""
    builder = _DefaultRecordBatchBuilderPy(2, 0, int(transactional), producer_id, 0 if producer_id >= 0 else -1, -1, 1 << 20)
    for i in range(count):
        builder.append(i, int(time.time() * 1000), None, f"v{base + i}".encode(), [])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base)
    return bytes(data)


def marker(base: int, producer_id: int, *, commit: bool = True) -> bytes:
    """A transaction's control batch (one COMMIT or ABORT marker record) at ``base``."""
    builder = _DefaultRecordBatchBuilderPy(2, 0, 1, producer_id, 0, -1, 1 << 20)
    builder.append(0, int(time.time() * 1000), struct.pack(">hh", 0, 1 if commit else 0), b"", [])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base)
    attributes_at = 21  # BaseOffset(8) Length(4) PartitionLeaderEpoch(4) Magic(1) CRC(4)
    (attributes,) = struct.unpack_from(">h", data, attributes_at)
    struct.pack_into(">h", data, attributes_at, attributes | 0x20)  # the control bit
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[attributes_at:])))
    return bytes(data)


def unpack(data: bytes, fetch_offset: int, *, aborted: list[tuple[int, int]] | None = None) -> tuple[list[int], int]:
    """What one fetch answer gives a consumer: the offsets handed out and its next position."""
    records = GuardedPartitionRecords(TP, MemoryRecords(data), aborted, fetch_offset, None, None, True, READ_COMMITTED)
    return [r.offset for r in records], records.next_fetch_offset


def test_contiguous_batches_are_handed_out_whole(detections: continuity._Detections) -> None:
    assert unpack(batch(0, 3) + batch(3, 2) + batch(5, 4), 0) == (list(range(9)), 9)
    assert detections.total == 0


def test_a_fetch_from_inside_a_batch_is_not_a_gap(detections: continuity._Detections) -> None:
    assert unpack(batch(10, 5) + batch(15, 1), 12) == ([12, 13, 14, 15], 16)
    assert detections.total == 0


def test_a_gap_between_batches_ends_the_answer_at_its_first_missing_offset(detections: continuity._Detections) -> None:
    seen: list[tuple[TopicPartition, int, int]] = []
    with continuity.observing(lambda tp, expected, answered, absent: seen.append((tp, expected, answered, absent))):
        assert unpack(batch(0, 3) + batch(4, 2), 0) == ([0, 1, 2], 3)
    assert seen == [(TP, 3, 4, False)]
    assert detections.missing[TP].offset == 3


def test_an_answer_that_starts_past_the_fetch_offset_hands_out_nothing(detections: continuity._Detections) -> None:
    assert unpack(batch(2304, 3), 2303) == ([], 2303)
    assert detections.total == 1
    # The refetch answers from the missing offset: it is handed out, and no longer missing.
    assert unpack(batch(2303, 4), 2303) == ([2303, 2304, 2305, 2306], 2307)
    assert detections.missing == {}


def test_a_legacy_message_set_passes_through_unchecked(detections: continuity._Detections) -> None:
    builder = LegacyRecordBatchBuilder(1, 0, 1 << 20)
    for i in range(3):
        builder.append(i, timestamp=None, key=None, value=b"v")
    legacy = bytes(builder.build())
    assert unpack(legacy, 0) == ([0, 1, 2], 3)
    assert detections.total == 0


def test_transaction_markers_and_aborted_batches_fill_their_offsets(detections: continuity._Detections) -> None:
    data = batch(0, 2, producer_id=7, transactional=True) + marker(2, 7) + batch(3, 2, producer_id=8, transactional=True)
    data += marker(5, 8, commit=False) + batch(6, 1)
    offsets, position = unpack(data, 0, aborted=[(8, 3)])
    assert offsets == [0, 1, 6]  # the commit marker, the aborted batch and its abort marker are skipped...
    assert position == 7
    assert detections.total == 0  # ...as legitimate: they are in the log


def test_a_compacted_topic_may_have_gaps(detections: continuity._Detections, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(continuity, "_compacted", set())
    continuity.expect_gaps(TP.topic)
    assert unpack(batch(0, 2) + batch(9, 1), 0) == ([0, 1, 9], 10)
    assert detections.total == 0


def test_a_hole_every_reread_shows_is_moved_past_and_counted_apart(detections: continuity._Detections) -> None:
    """A broker killed with records it had not acknowledged leaves offsets that hold nothing:
    re-read for TRUST_AFTER_S over TRUST_AFTER_TRIES fetches, the hole is trusted, not wedged on."""
    clock = detections.clock
    assert isinstance(clock, Clock)
    seen: list[bool] = []
    with continuity.observing(lambda _tp, _expected, _answered, absent: seen.append(absent)):
        for _ in range(TRUST_AFTER_TRIES - 1):
            assert unpack(batch(41, 1), 40) == ([], 40)
            clock.now += TRUST_AFTER_S
        assert unpack(batch(41, 2), 40) == ([41, 42], 43)
    assert seen == [False] * (TRUST_AFTER_TRIES - 1) + [True]
    assert detections.missing == {}


def test_many_quick_refetches_are_not_enough_to_give_up(detections: continuity._Detections) -> None:
    for _ in range(TRUST_AFTER_TRIES * 4):
        assert unpack(batch(41, 1), 40) == ([], 40)  # the same instant: a transient fault keeps being refetched
    assert detections.missing[TP].tries == TRUST_AFTER_TRIES * 4


async def test_every_project_consumer_unpacks_through_the_guard() -> None:
    make_consumer(KafkaSettings(bootstrap_servers="127.0.0.1:1"), group_id=None)  # never started
    assert aiokafka_fetcher.PartitionRecords is GuardedPartitionRecords


def test_the_aiokafka_internals_the_guard_relies_on_are_unchanged() -> None:
    """Fails by name when an aiokafka upgrade changes what pipeline/kafka/continuity.py hooks into."""
    PartitionRecords = GuardedPartitionRecords.__mro__[1]  # aiokafka's own (the module name may be ours now)
    assert PartitionRecords.__module__ == "aiokafka.consumer.fetcher"
    parameters = list(inspect.signature(PartitionRecords.__init__).parameters)
    assert parameters[:5] == ["self", "tp", "records", "aborted_transactions", "fetch_offset"], (
        "aiokafka.consumer.fetcher.PartitionRecords changed its constructor: review pipeline/kafka/continuity.py"
    )
    unpacking = inspect.getsource(PartitionRecords._unpack_records)
    assert "records.has_next()" in unpacking and "records.next_batch()" in unpacking, (
        "PartitionRecords._unpack_records no longer walks records.has_next()/next_batch(): review continuity.py"
    )
    assert "PartitionRecords(" in inspect.getsource(aiokafka_fetcher.Fetcher._proc_fetch_request), (
        "aiokafka's Fetcher no longer builds PartitionRecords by its module name: the guard would not be used"
    )
    for reader in (_crecords.DefaultRecordBatch, _DefaultRecordBatchPy):
        assert hasattr(reader, "base_offset") and hasattr(reader, "next_offset"), f"{reader} lost base/next_offset"
