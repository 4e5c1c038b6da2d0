"""Read what can be read of fetched Kafka bytes that aiokafka refuses to decode.

Pure functions over the bytes of one fetch response (no I/O), so they are
unit-tested on their own; :mod:`pipeline.kafka.unreadable` fetches the bytes and
acts on the result.

How the failure point is found: the bytes are run through aiokafka's own
``PartitionRecords`` (the very iterator the consumer's fetcher uses, with the
same C or pure-Python record reader, CRC check, transaction-abort and
control-batch handling), so it stops exactly where the consumer stops; its
``next_fetch_offset`` then names the first offset it could not deliver.

How the failing batch is salvaged: with aiokafka's pure-Python batch reader
(``_DefaultRecordBatchPy``, the code aiokafka runs under
``AIOKAFKA_NO_EXTENSIONS``), whose buffer is swapped for a bytearray whose
``decode`` uses ``surrogateescape``: a header key that is not UTF-8 then reads
as a string that still holds its original bytes, and everything else is parsed
by the library, not by hand. Only the outer framing of the batches (offset:
int64, length: int32, identical in every message format; aiokafka's
``MemoryRecords`` keeps its slices private) is walked here. The swap relies on
two private names of aiokafka 0.14 (``_buffer``, ``_maybe_uncompress``);
tests/unit/test_unreadable.py fails loudly if an upgrade changes them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, SupportsIndex

from aiokafka.consumer.fetcher import READ_COMMITTED
from aiokafka.record.default_records import _DefaultRecordBatchPy
from aiokafka.record.legacy_records import _LegacyRecordBatchPy
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord, TopicPartition

from pipeline.contract.headers import Headers
from pipeline.contract.records import source_position_headers
from pipeline.kafka.continuity import GuardedPartitionRecords

_FRAME = struct.Struct(">qi")  # BaseOffset, Length: the same in message formats v0, v1 and v2
_MAGIC_AT = 16  # BaseOffset(8) + Length(4) + PartitionLeaderEpoch or CRC(4)

#: Why a record could not be read (the ``cause`` label of the metric).
BAD_HEADER_KEY = "bad-header-key"
BAD_CRC = "bad-crc"
CORRUPT_RECORD = "corrupt-record"


@dataclass
class UnreadableRecord:
    """Stands in for a record aiokafka cannot decode: its position and what could be read.

    Has the attributes of :class:`pipeline.kafka.records.ConsumedRecord`, so the
    outbox gives it a slot and a stage dead-letters it like any other record.
    ``headers`` are the readable headers (a non-UTF-8 key written with ``\\x``
    escapes) followed by ``source-topic``/``-partition``/``-offset``.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]
    cause: str
    reason: str


@dataclass
class Salvage:
    """The outcome of one partition's failed fetch, in offset order."""

    records: list[Any] = field(default_factory=list)
    """aiokafka ``ConsumerRecord``s and :class:`UnreadableRecord`s, to be handled in this order."""
    resume_at: int = 0
    """Where the consumer seeks to afterwards: the end of the failing batch."""

    @property
    def unreadable(self) -> list[UnreadableRecord]:
        return [r for r in self.records if isinstance(r, UnreadableRecord)]


class _LenientBuffer(bytearray):
    """A bytearray whose slices decode leniently: a bad header key keeps its bytes."""

    def __getitem__(self, item: SupportsIndex | slice) -> Any:
        got = super().__getitem__(item)
        return _LenientBuffer(got) if isinstance(item, slice) else got

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return super().decode(encoding, "surrogateescape")


class _LenientBatch(_DefaultRecordBatchPy):  # type: ignore[misc]
    """aiokafka's pure-Python v2 batch reader, reading header keys leniently."""

    _buffer: bytearray

    def _maybe_uncompress(self) -> None:
        super()._maybe_uncompress()
        if not isinstance(self._buffer, _LenientBuffer):
            self._buffer = _LenientBuffer(self._buffer)


def salvage(
    tp: TopicPartition,
    data: bytes,
    *,
    fetch_offset: int,
    aborted_transactions: Sequence[tuple[int, int]] | None = None,
    high_watermark: int | None = None,
    check_crcs: bool = True,
    isolation_level: int = READ_COMMITTED,
) -> Salvage | None:
    """Decode ``data`` (one partition's fetched record set) as the consumer does.

    None when the consumer can read all of it. Otherwise: the readable records
    before the failure, then every record of the failing batch from there on,
    readable or not, and the offset after that batch (the consumer re-parses a
    whole batch on every fetch, so it can only go on past the batch's end).
    """
    # Guarded as the consumer's own unpacking is: a gap before the failure ends what is
    # readable there (the caller fetches it again), never skips it.
    partition_records = GuardedPartitionRecords(
        tp, MemoryRecords(data), aborted_transactions, fetch_offset, None, None, check_crcs, isolation_level
    )
    readable: list[Any] = []
    try:
        readable.extend(partition_records)
        return None
    except Exception as exc:  # noqa: BLE001 - any decode error: the point is to find where
        error: Exception = exc
    failed_at: int = partition_records.next_fetch_offset
    frame = _failing_batch(data, failed_at)
    if frame is None:
        return None
    out = Salvage(records=readable, resume_at=failed_at + 1)
    _salvage_batch(tp, frame, failed_at, error, check_crcs, high_watermark, out)
    return out


def _failing_batch(data: bytes, failed_at: int) -> bytes | None:
    """The first complete batch in ``data`` that ends after ``failed_at``."""
    pos = 0
    while pos + _FRAME.size <= len(data):
        base, length = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        if length < 0 or end > len(data):
            return None  # a truncated tail: the consumer ignores it too
        frame = data[pos:end]
        try:
            next_offset = _batch(frame).next_offset
        except Exception:  # noqa: BLE001 - a header too short to read: this is the failing batch
            return frame if base >= failed_at else None
        if next_offset > failed_at:
            return frame
        pos = end
    return None


def _batch(frame: bytes) -> Any:
    magic = frame[_MAGIC_AT] if len(frame) > _MAGIC_AT else -1
    return _LenientBatch(frame) if magic >= 2 else _LegacyRecordBatchPy(frame, magic)


def _salvage_batch(
    tp: TopicPartition,
    frame: bytes,
    failed_at: int,
    error: Exception,
    check_crcs: bool,
    high_watermark: int | None,
    out: Salvage,
) -> None:
    try:
        batch = _batch(frame)
    except Exception as exc:  # noqa: BLE001 - not even a batch header: one offset at a time
        out.records.append(_unknown(tp, failed_at, f"unreadable record batch: {exc!r}"))
        return
    bad_crc = check_crcs and not batch.validate_crc()
    first = max(failed_at, batch.base_offset) if isinstance(batch, _LenientBatch) else failed_at
    end = batch.next_offset
    if high_watermark is not None and high_watermark > first:
        end = min(end, high_watermark)  # a corrupt header must not invent offsets
    parse_error: Exception | None = None
    parsed: list[Any] = []
    try:
        parsed.extend(r for r in batch if r.offset >= first)
    except Exception as exc:  # noqa: BLE001 - the rest of the batch cannot be delimited
        parse_error = exc
    for record in parsed:
        if bad_crc:
            out.records.append(_unreadable(tp, record, BAD_CRC, f"record batch CRC mismatch ({error}); bytes unverified"))
        elif any(_not_utf8(key) for key, _ in record.headers):
            bad = [_escaped(key) for key, _ in record.headers if _not_utf8(key)]
            out.records.append(_unreadable(tp, record, BAD_HEADER_KEY, f"header key is not UTF-8: {', '.join(bad)}"))
        else:
            out.records.append(_consumer_record(tp, record))
    rest = parsed[-1].offset + 1 if parsed else first
    why = f"record batch CRC mismatch ({error})" if bad_crc else f"undecodable record ({parse_error or error!r})"
    out.records.extend(_unknown(tp, offset, why, BAD_CRC if bad_crc else CORRUPT_RECORD) for offset in range(rest, end))
    out.resume_at = max(end, rest, failed_at + 1)


def _not_utf8(key: str) -> bool:
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _escaped(key: str) -> str:
    """A header key as printable text: bytes that are not UTF-8 become ``\\xNN``."""
    return key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _unreadable(tp: TopicPartition, record: Any, cause: str, reason: str) -> UnreadableRecord:
    headers: Headers = [(_escaped(key), value) for key, value in record.headers]
    return UnreadableRecord(
        topic=tp.topic,
        partition=tp.partition,
        offset=record.offset,
        timestamp=record.timestamp,
        key=record.key,
        value=record.value,
        headers=headers + source_position_headers(tp.topic, tp.partition, record.offset),
        cause=cause,
        reason=reason,
    )


def _unknown(tp: TopicPartition, offset: int, reason: str, cause: str = CORRUPT_RECORD) -> UnreadableRecord:
    """An offset whose bytes cannot be delimited: position only, empty value."""
    return UnreadableRecord(
        topic=tp.topic,
        partition=tp.partition,
        offset=offset,
        timestamp=0,
        key=None,
        value=b"",
        headers=source_position_headers(tp.topic, tp.partition, offset),
        cause=cause,
        reason=reason,
    )


def _consumer_record(tp: TopicPartition, record: Any) -> Any:
    """What aiokafka's fetcher would have returned for a readable record of the batch."""
    return ConsumerRecord(
        tp.topic,
        tp.partition,
        record.offset,
        record.timestamp,
        record.timestamp_type,
        record.key,
        record.value,
        record.checksum,
        len(record.key) if record.key is not None else -1,
        len(record.value) if record.value is not None else -1,
        tuple(record.headers),
    )
