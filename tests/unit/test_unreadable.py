"""What can be read of record batches aiokafka refuses (pipeline/kafka/salvage.py), offline.

Batches are built with aiokafka's own builder (tests/helpers/raw_records.py) and
run through both of aiokafka's readers: the C extension and the pure-Python one
(what ``AIOKAFKA_NO_EXTENSIONS`` selects), since they fail differently.
"""

from __future__ import annotations

import pytest
from aiokafka.errors import CorruptRecordException
from aiokafka.record import memory_records
from aiokafka.record.default_records import DefaultRecordBatch, _DefaultRecordBatchPy
from aiokafka.structs import ConsumerRecord, TopicPartition

from pipeline.kafka import salvage as salvage_module
from pipeline.kafka.salvage import BAD_CRC, BAD_HEADER_KEY, CORRUPT_RECORD, UnreadableRecord, salvage
from pipeline.kafka.unreadable import is_decode_error
from tests.helpers.raw_records import RawKey, RawRecord, build_batch

TP = TopicPartition("t.requests", 3)
BAD = RawKey(b"\xff\xfe")


@pytest.fixture(params=["c-extension", "pure-python"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "pure-python":
        monkeypatch.setattr(salvage_module, "MemoryRecords", memory_records._MemoryRecordsPy)
    return str(request.param)


def _records(n: int, bad: set[int] = frozenset()) -> list[RawRecord]:  # type: ignore[assignment]
    return [
        RawRecord(f"k{i}".encode(), f"v{i}".encode(), [(BAD if i in bad else "h", b"x"), ("n", None)])
        for i in range(n)
    ]


def _rebase(batch: bytes, base: int) -> bytes:
    return base.to_bytes(8, "big", signed=True) + batch[8:]


def _offsets(records: list[object]) -> list[tuple[int, str]]:
    return [
        (r.offset, r.cause if isinstance(r, UnreadableRecord) else "ok")  # type: ignore[attr-defined]
        for r in records
    ]


def test_the_two_readers_fail_differently_on_a_header_key_that_is_not_utf8() -> None:
    batch = build_batch(_records(3, bad={1}))
    with pytest.raises(UnicodeDecodeError):
        list(DefaultRecordBatch(batch))
    with pytest.raises(CorruptRecordException, match="UnicodeDecodeError"):
        list(_DefaultRecordBatchPy(batch))
    assert is_decode_error(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "x"))
    assert is_decode_error(CorruptRecordException("Invalid CRC"))


def test_readable_bytes_need_no_salvage(reader: str) -> None:
    assert salvage(TP, build_batch(_records(4)), fetch_offset=0) is None


def test_a_bad_header_key_is_one_unreadable_record_and_the_rest_of_its_batch_is_returned(reader: str) -> None:
    data = build_batch(_records(2)) + _rebase(build_batch(_records(3, bad={1})), 2)
    found = salvage(TP, data, fetch_offset=0)
    assert found is not None
    assert _offsets(found.records) == [(0, "ok"), (1, "ok"), (2, "ok"), (3, BAD_HEADER_KEY), (4, "ok")]
    assert found.resume_at == 5
    readable = [r for r in found.records if not isinstance(r, UnreadableRecord)]
    assert all(isinstance(r, ConsumerRecord) and r.topic == TP.topic and r.partition == TP.partition for r in readable)
    # The second batch numbers its keys from 0 again.
    assert readable[3].key == b"k2" and readable[3].headers == (("h", b"x"), ("n", None))
    (bad,) = found.unreadable
    assert (bad.topic, bad.partition, bad.key, bad.value) == (TP.topic, TP.partition, b"k1", b"v1")
    assert list(bad.headers) == [
        ("\\xff\\xfe", b"x"), ("n", None),
        ("source-topic", b"t.requests"), ("source-partition", b"3"), ("source-offset", b"3"),
    ]
    assert "\\xff\\xfe" in bad.reason


def test_a_fetch_from_inside_the_failing_batch_starts_at_the_fetch_offset(reader: str) -> None:
    found = salvage(TP, build_batch(_records(4, bad={1, 3})), fetch_offset=2)
    assert found is not None
    assert _offsets(found.records) == [(2, "ok"), (3, BAD_HEADER_KEY)]
    assert found.resume_at == 4


def test_a_compressed_batch_is_salvaged_after_decompression(reader: str) -> None:
    found = salvage(TP, build_batch(_records(3, bad={0}), compression=1), fetch_offset=0)  # gzip
    assert found is not None
    assert _offsets(found.records) == [(0, BAD_HEADER_KEY), (1, "ok"), (2, "ok")]


def test_a_batch_with_a_wrong_crc_is_unreadable_as_a_whole_with_its_bytes_unverified(reader: str) -> None:
    data = build_batch(_records(1)) + _rebase(build_batch(_records(3), corrupt_crc=True), 1)
    found = salvage(TP, data, fetch_offset=0)
    assert found is not None
    assert _offsets(found.records) == [(0, "ok"), (1, BAD_CRC), (2, BAD_CRC), (3, BAD_CRC)]
    assert found.unreadable[0].value == b"v0" and "CRC" in found.unreadable[0].reason
    assert found.resume_at == 4
    # Without CRC checks (check_crcs=False) the consumer reads it, so nothing is salvaged.
    assert salvage(TP, data, fetch_offset=0, check_crcs=False) is None


def test_a_record_that_cannot_be_delimited_leaves_its_offsets_with_empty_values(reader: str) -> None:
    data = bytearray(build_batch(_records(3)))
    data[data.index(b"v1") - 1] = 0x7E  # value length of record 1: 63 bytes, past the record's end
    found = salvage(TP, bytes(data), fetch_offset=0, check_crcs=False)
    assert found is not None
    assert _offsets(found.records) == [(0, "ok"), (1, CORRUPT_RECORD), (2, CORRUPT_RECORD)]
    assert all(r.value == b"" and r.key is None for r in found.unreadable)
    assert [dict(r.headers)["source-offset"] for r in found.unreadable] == [b"1", b"2"]
    assert found.resume_at == 3


def test_a_corrupt_header_cannot_invent_offsets_past_the_high_watermark(reader: str) -> None:
    data = bytearray(build_batch(_records(3), corrupt_crc=True))
    data[23:27] = (10_000_000).to_bytes(4, "big")  # LastOffsetDelta, covered by the (wrong) CRC
    data[data.index(b"v1") - 1] = 0x7E
    found = salvage(TP, bytes(data), fetch_offset=0, high_watermark=3)
    assert found is not None
    assert [r.offset for r in found.records] == [0, 1, 2]
    assert found.resume_at == 3
