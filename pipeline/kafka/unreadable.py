"""Fetching that survives records aiokafka cannot decode: they become dead letters by position.

What aiokafka 0.14 does with such a record (checked against Tansu; see
tests/integration/test_unreadable_records.py):

- Records are decoded lazily, in the caller's ``getmany``: ``Fetcher.fetched_records``
  -> ``FetchResult.getall`` -> ``PartitionRecords._unpack_records`` -> the batch
  reader. The reader is the C extension (``aiokafka.record._crecords``) unless
  ``AIOKAFKA_NO_EXTENSIONS`` is set, then the pure-Python ``_DefaultRecordBatchPy``.
- A header key that is not UTF-8 (the protocol says String; Tansu stores whatever
  it is sent): the C reader raises ``UnicodeDecodeError``; the Python reader
  raises ``CorruptRecordException("Found invalid record structure:
  UnicodeDecodeError(...)")``. Other structural damage raises
  ``CorruptRecordException`` from either.
- A batch whose CRC does not match (``check_crcs=True``, the default) raises
  ``CorruptRecordException("Invalid CRC - <tp>")`` before any of its records.
  A missing compression library raises ``UnsupportedCodecError``.
- State afterwards: ``getall`` raised before ``consumed_to``, so the partition's
  position is where it was before the call; the records of that partition
  decoded before the bad one are lost from the call, and so are the records
  already drained *from other partitions* in the same call, although their
  positions did advance. The next fetch of the partition starts at its old
  position, returns the same batch, and fails the same way: forever. The
  consumer re-parses a whole batch on every fetch (records before the fetch
  offset are skipped only after being parsed), so seeking past the bad record
  alone does not help: only a position past the end of its batch does.

What this module does on such an error (:meth:`UnreadableRecords.getmany`):
for every assigned, unpaused partition, the position before the failed call
(the offset after the last record this stage was given, else the group's
committed offset, else the log start: stage consumers reset to earliest) is
fetched once more with a plain protocol request and run through
:func:`pipeline.kafka.salvage.salvage`. A partition whose bytes fail yields
its readable records before the failure, the failing batch's records (the bad
ones as :class:`~pipeline.kafka.salvage.UnreadableRecord`, to be dead-lettered)
and a seek past that batch; every other partition is sought back to its
position, so nothing drained by the failed call is lost. Stand-ins take outbox
slots like records, so commits stay in offset order. An error no scan can
place is raised after three tries in a row, as before: loudly.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.client import AIOKafkaClient
from aiokafka.consumer.fetcher import READ_COMMITTED
from aiokafka.errors import CorruptRecordException, KafkaError, UnsupportedCodecError
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.structs import TopicPartition

from pipeline.kafka.continuity import GapObserver, observing
from pipeline.kafka.salvage import Salvage, UnreadableRecord, salvage
from pipeline.settings import KafkaSettings

log = logging.getLogger(__name__)

__all__ = ["UnreadableRecord", "UnreadableRecords", "is_decode_error"]

Fetched = dict[TopicPartition, list[Any]]

#: Failed scans in a row before the original error is raised (with a growing pause between:
#: a scan can miss while metadata or a leader is moving; seen once under heavy load).
MAX_MISSES = 8


def is_decode_error(exc: BaseException) -> bool:
    """An error raised while decoding fetched bytes, not a broker or client state error."""
    if isinstance(exc, (CorruptRecordException, UnsupportedCodecError)):
        return True
    return isinstance(exc, Exception) and not isinstance(exc, KafkaError)


class UnreadableRecords:
    """``consumer.getmany`` for a stage: decode errors turn into stand-ins, never into a crash."""

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        max_fetch_bytes: int = 4 << 20,
        check_crcs: bool = True,
        on_gap: GapObserver | None = None,
    ) -> None:
        self._kafka = kafka
        self._on_gap = on_gap
        self._max_fetch_bytes = max_fetch_bytes
        self._check_crcs = check_crcs
        self._next: dict[TopicPartition, int] = {}  # offset after the last record handed out
        self._misses = 0

    def forget(self, partitions: list[TopicPartition]) -> None:
        """Partitions were handed back: their next owner starts from the committed offset."""
        for tp in partitions:
            self._next.pop(tp, None)

    async def getmany(self, consumer: AIOKafkaConsumer, *, timeout_ms: int, max_records: int) -> Fetched:
        try:
            if self._on_gap is None:
                batch: Fetched = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            else:
                with observing(self._on_gap):  # fetches are unpacked (and checked) inside getmany
                    batch = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except Exception as exc:
            if not is_decode_error(exc):
                raise
            log.warning("fetched records cannot be decoded (%r): locating them", exc)
            return await self._recover(consumer, exc)
        self._misses = 0
        assigned = consumer.assignment()
        for tp, records in batch.items():
            if records and tp in assigned:
                self._next[tp] = records[-1].offset + 1
        return batch

    async def _recover(self, consumer: AIOKafkaConsumer, exc: Exception) -> Fetched:
        paused = consumer.paused()
        partitions = sorted(consumer.assignment() - paused)
        starts = {tp: await self._position_before(consumer, tp) for tp in partitions}
        salvaged = await self._scan(starts)
        out: Fetched = {}
        for tp in partitions:
            found = salvaged.get(tp)
            if found is None:
                consumer.seek(tp, starts[tp])  # give back what the failed call drained
                continue
            for record in found.unreadable:
                log.warning("unreadable record %s@%d (%s): %s", tp, record.offset, record.cause, record.reason)
            out[tp] = found.records
            consumer.seek(tp, found.resume_at)
            self._next[tp] = found.resume_at
        if out:
            self._misses = 0
            return out
        self._misses += 1
        if self._misses >= MAX_MISSES:
            raise exc
        log.warning("could not place the decode error (%d of %d tries)", self._misses, MAX_MISSES)
        await asyncio.sleep(0.25 * self._misses)
        return out

    async def _position_before(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
        known = self._next.get(tp)
        if known is not None:
            return known
        committed = await consumer.committed(tp)
        if committed is not None:
            return int(committed)
        beginning = await consumer.beginning_offsets([tp])
        return int(beginning[tp])

    async def _scan(self, starts: dict[TopicPartition, int]) -> dict[TopicPartition, Salvage]:
        """Fetch each partition from its start with a plain client; salvage what fails."""
        found: dict[TopicPartition, Salvage] = {}
        if not starts:
            return found
        client = AIOKafkaClient(**self._kafka.client_kwargs())
        try:
            await client.bootstrap()
            cluster = await client.fetch_all_metadata()
            for tp, offset in starts.items():
                fetched = await self._fetch(client, cluster.leader_for_partition(tp), tp, offset)
                if fetched is None:
                    continue
                data, aborted, high = fetched
                result = salvage(
                    tp, data, fetch_offset=offset, aborted_transactions=aborted,
                    high_watermark=high, check_crcs=self._check_crcs,
                )
                if result is not None and result.resume_at > offset:
                    found[tp] = result
        finally:
            await client.close()
        return found

    async def _fetch(
        self, client: AIOKafkaClient, node: int | None, tp: TopicPartition, offset: int
    ) -> tuple[bytes, list[tuple[int, int]] | None, int] | None:
        if node is None or node < 0:
            return None
        request = FetchRequest(
            max_wait_time=100,
            min_bytes=1,
            max_bytes=self._max_fetch_bytes,
            isolation_level=READ_COMMITTED,
            topics=[(tp.topic, [(tp.partition, offset, self._max_fetch_bytes)])],
        )
        response = await client.send(node, request)
        for _topic, partitions in response.topics:
            for _partition, error_code, high, *part_data in partitions:
                if error_code != 0:
                    return None
                # Same layout rule as aiokafka's fetcher: v11+ [lso, log_start, aborted, replica, records];
                # v4..v10 aborted transactions second to last; records always last.
                if response.API_VERSION >= 11:
                    aborted = part_data[2]
                elif response.API_VERSION >= 4:
                    aborted = part_data[-2]
                else:
                    aborted = None
                return bytes(part_data[-1]), aborted, int(high)
        return None
