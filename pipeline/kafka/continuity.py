"""Never move past an offset no one has seen: every fetched record batch must start where
the previous one ended.

Why this exists (measured 2026-11-26, Tansu 0.6.0 and aiokafka 0.14 alone; the
reproduction is in docs/streaming.md): with several producers writing one partition at
once, the embedded broker sometimes answers a fetch at offset X with batches that start at
X+1, or leaves a gap between two batches of one answer. aiokafka trusts the answer: it
moves its position past X, and the record at X is never delivered to anyone, although
the broker holds it (it is there when read later). The stage then commits past it: a
silent loss.

In a log that is not compacted, every offset belongs to a batch: data, a transaction's
control marker, or an aborted transaction's batch, and the broker returns those too. So a
batch whose base offset lies past where the previous one ended (or past the fetch offset,
for the first one) is never legitimate there. The guard sits where aiokafka unpacks a
partition's fetched bytes (:class:`GuardedPartitionRecords`, in the caller's ``getmany``):
on such a gap it hands out the records before it and stops, so the consumer's position
stays at the first missing offset and its next fetch asks for it again. The broker's
fault is transient; a refetch answers with the record (``tests/integration/
test_offset_continuity.py`` counts how often: every one of 24 was delivered by the next fetch).

A gap that every re-read shows again, for :data:`TRUST_AFTER_S` and at least
:data:`TRUST_AFTER_TRIES` fetches, is a hole in the broker's log, not a skipped record: the
offsets hold nothing to deliver. The embedded broker leaves such holes when it is killed
with records it had not acknowledged (their producers send them again, at later offsets;
``test_broker_kill_9_and_restart_mid_stream`` shows one). Stopping there would wedge the
partition for good, so the consumer moves past it, counted apart
(``pipeline_offsets_absent_total``) and logged as an error.

Compacted topics (the state changelogs) have legitimate gaps: compaction drops whole
batches. Their readers declare them with :func:`expect_gaps`.

Every detection is logged (once per partition per minute) and reported to the observer
set with :func:`observing` by whoever is fetching (a stage counts it as
``pipeline_offsets_skipped_total``). aiokafka's private internals are touched here and
only here: the ``PartitionRecords`` constructor and the record batch's ``base_offset`` /
``next_offset``; ``tests/unit/test_fetch_continuity.py`` fails by name when an aiokafka
upgrade changes them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import aiokafka.consumer.fetcher as _fetcher
from aiokafka.structs import TopicPartition

log = logging.getLogger(__name__)

__all__ = [
    "TRUST_AFTER_S",
    "TRUST_AFTER_TRIES",
    "GapObserver",
    "GuardedPartitionRecords",
    "expect_gaps",
    "install",
    "observing",
]

TRUST_AFTER_S = 10.0
"""How long re-reads must keep answering past one offset before it counts as a hole in the log."""
TRUST_AFTER_TRIES = 5
"""...and over at least this many fetches (a slow machine refetches less often)."""
LOG_EVERY_S = 60.0
"""A partition's detections are logged at most this often (each one is counted)."""

GapObserver = Callable[[TopicPartition, int, int, bool], None]
"""``(partition, first missing offset, offset the broker answered with, absent)``: one
detection; ``absent``: re-reading confirmed a hole in the log, and the consumer moves past it."""

_observer: ContextVar[GapObserver | None] = ContextVar("offset_gap_observer", default=None)
_compacted: set[str] = set()


@dataclass
class _Missing:
    offset: int
    since: float
    tries: int = 1


class _Detections:
    """Process-wide: what is missing now, per partition, and when each was last logged."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.missing: dict[TopicPartition, _Missing] = {}
        self.logged: dict[TopicPartition, float] = {}
        self.total = 0

    def gap(self, tp: TopicPartition, expected: int, answered: int) -> bool:
        """One answer skipped ``[expected, answered)``: count, log, report. True once re-reads
        have shown the same hole long enough to trust it (the caller moves past it)."""
        now = self.clock()
        self.total += 1
        missing = self.missing.get(tp)
        if missing is None or missing.offset != expected:
            missing = self.missing[tp] = _Missing(expected, now)
        else:
            missing.tries += 1
        if now - self.logged.get(tp, -LOG_EVERY_S) >= LOG_EVERY_S:
            self.logged[tp] = now
            log.warning(
                "%s: the broker answered a fetch at offset %d from offset %d; fetching %d again "
                "(a broker fault; counted as pipeline_offsets_skipped_total, logged once a minute)",
                tp, expected, answered, expected,
            )
        absent = missing.tries >= TRUST_AFTER_TRIES and now - missing.since >= TRUST_AFTER_S
        if absent:
            del self.missing[tp]
            log.error(
                "%s: offsets %d..%d are absent from the broker's log (answered from %d by %d fetches over %.0fs): "
                "moving past them (counted as pipeline_offsets_absent_total)",
                tp, expected, answered - 1, answered, missing.tries, now - missing.since,
            )
        observer = _observer.get()
        if observer is not None:
            observer(tp, expected, answered, absent)
        return absent

    def seen(self, tp: TopicPartition, next_offset: int) -> None:
        """A batch ending before ``next_offset`` was handed out contiguously."""
        missing = self.missing.get(tp)
        if missing is not None and next_offset > missing.offset:
            del self.missing[tp]


DETECTIONS = _Detections()


class _ContinuousBatches:
    """A partition's fetched record set that ends at the first gap between batches.

    aiokafka's loop is ``while records.has_next(): batch = records.next_batch()``; so
    ``has_next`` reads the next batch ahead and answers False at a gap.
    """

    __slots__ = ("_ahead", "_expected", "_records", "_tp")

    def __init__(self, tp: TopicPartition, records: Any, fetch_offset: int) -> None:
        self._tp = tp
        self._records = records
        self._expected = fetch_offset
        self._ahead: Any = None

    def has_next(self) -> bool:
        if self._ahead is not None:
            return True
        if self._expected < 0 or not self._records.has_next():
            return False
        batch = self._records.next_batch()
        if batch is None:
            return False
        # Message format v2 batches know their first offset; a legacy (v0/v1) message set does
        # not (aiokafka's C reader has no base_offset for it), and is passed through unchecked.
        base = getattr(batch, "base_offset", None)
        if base is not None and base > self._expected and not DETECTIONS.gap(self._tp, self._expected, base):
            self._expected = -1  # ends the record set: nothing past the gap is handed out
            return False
        self._expected = max(self._expected, batch.next_offset)
        if DETECTIONS.missing:
            DETECTIONS.seen(self._tp, self._expected)
        self._ahead = batch
        return True

    def next_batch(self) -> Any:
        if not self.has_next():
            return None
        batch, self._ahead = self._ahead, None
        return batch

    def size_in_bytes(self) -> int:
        return int(self._records.size_in_bytes())


class GuardedPartitionRecords(_fetcher.PartitionRecords):  # type: ignore[misc]
    """aiokafka's unpacking of one partition's fetched bytes, over a record set that ends at a gap.

    When it ends at a gap, aiokafka's ``next_fetch_offset`` stays at the gap's first
    offset, so the consumer's position does too, and its next fetch asks for it again.
    """

    def __init__(
        self, tp: TopicPartition, records: Any, aborted_transactions: Any, fetch_offset: int, *args: Any
    ) -> None:
        if tp.topic not in _compacted:
            records = _ContinuousBatches(tp, records, fetch_offset)
        super().__init__(tp, records, aborted_transactions, fetch_offset, *args)


def install() -> None:
    """Make every aiokafka consumer of this process unpack its fetches through the guard."""
    _fetcher.PartitionRecords = GuardedPartitionRecords


def expect_gaps(topic: str) -> None:
    """``topic`` is compacted: gaps between its batches are compaction, not a fault."""
    _compacted.add(topic)


@contextlib.contextmanager
def observing(observer: GapObserver) -> Iterator[None]:
    """Report the detections of fetches unpacked inside this block (a ``getmany``) to ``observer``."""
    token = _observer.set(observer)
    try:
        yield
    finally:
        _observer.reset(token)
