"""Keyed state owned by partition, checkpointed to a compacted Kafka topic.

The mechanism every stateful stage shares (sequences: one state per stream key;
joins: one per correlation ID), once:

- **Ownership by partition.** A key's state lives in the state topic's partition
  with the number of the input partition its records come from. A worker that is
  assigned input partition ``p`` calls :meth:`KeyedStateStore.restore` for ``p``
  *before* it handles a record of ``p`` (the stage runtime guarantees the order),
  and :meth:`forget` when ``p`` is revoked. Several input topics with the same
  partition numbers (a join's branches) restore each number once.
- **Checkpoints and tombstones** are :class:`~pipeline.kafka.outbox.OutRecord`
  values the stage hands to the outbox, *after* the outputs they account for
  (``after_acks``), so a restored state never runs ahead of what was produced; and
  through the membership fence (:mod:`pipeline.kafka.membership`), so a worker frozen
  past its session never writes one late, over the checkpoint of the key's new owner.
- **Expiry.** Every entry has a time-to-live, renewed by :meth:`put` and
  :meth:`touch`; restored entries start theirs at restore time, so a state that
  is restored but never touched again still expires. :meth:`due` hands expired
  entries to the stage, which either deletes them (tombstone) or renews them.
- **A bound on live keys** (``StateLimits.max_keys``). Policy when it is reached:
  *evict the idlest* — :meth:`make_room` names the entries with the earliest
  expiry; the stage ends them as it would on expiry (a sequence emits its summary,
  an inner join dead-letters what arrived) and deletes them. New keys are never
  refused, and nothing is dropped silently.
- **Corrupt records** on restore are counted in the :class:`RestoreReport` and
  skipped: the key starts fresh. Restore never raises for a bad record.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pipeline.kafka.changelog import read_changelog
from pipeline.kafka.outbox import OutRecord
from pipeline.settings import KafkaSettings
from pipeline.state.codec import CorruptState, StateCodec, decode_state, encode_state

log = logging.getLogger(__name__)

S = TypeVar("S")


@dataclass
class StateLimits:
    ttl_s: float
    """Default time-to-live of an entry after its last put or touch."""
    max_keys: int | None = None
    """Live keys held by one worker; beyond it the idlest are evicted (None: unbounded)."""


@dataclass
class StateEntry(Generic[S]):
    key: bytes
    state: S
    partition: int
    expires_at: float  # on the store's clock


@dataclass
class RestoreReport:
    partitions: list[int]
    restored: int = 0
    corrupt: list[tuple[bytes, bytes, int, str]] = field(default_factory=list)
    """(key, value, partition, reason) of each record that did not decode."""


class KeyedStateStore(Generic[S]):
    """In-memory states by key, restored from and checkpointed to ``topic``."""

    def __init__(
        self,
        *,
        kafka: KafkaSettings,
        topic: str,
        codec: StateCodec[S],
        limits: StateLimits,
        clock: Callable[[], float] = time.monotonic,
        committed_only: bool = False,
    ) -> None:
        self.kafka = kafka
        self.committed_only = committed_only
        """Restore only committed checkpoints (``read_committed``): a topology under exactly-once,
        whose checkpoints are written in transactions, some aborted."""
        self.topic = topic
        self.codec = codec
        self.limits = limits
        self.clock = clock
        self._entries: dict[bytes, StateEntry[S]] = {}
        self._expiry: list[tuple[float, int, bytes]] = []  # heap; stale items skipped
        self._order = itertools.count()
        self._versions = itertools.count()
        self._loaded: set[int] = set()

    # ------------------------------------------------------------------ ownership
    async def restore(self, partitions: Iterable[int]) -> RestoreReport:
        """Load the latest state of every key in ``partitions`` not loaded yet."""
        numbers = sorted(set(partitions) - self._loaded)
        report = RestoreReport(numbers)
        tables = await read_changelog(self.kafka, self.topic, numbers, committed_only=self.committed_only)
        for partition, table in tables.items():
            for key, value in table.items():
                try:
                    state = decode_state(self.codec, value)
                except CorruptState as exc:
                    log.warning("%s: corrupt state for key %r in partition %d: %s", self.topic, key, partition, exc)
                    report.corrupt.append((key, value, partition, str(exc)))
                    continue
                self._set(key, state, partition, None)
                report.restored += 1
        self._loaded.update(numbers)
        return report

    def forget(self, partitions: Iterable[int]) -> list[StateEntry[S]]:
        """Partitions were handed back: drop their states from memory (not from Kafka)."""
        numbers = set(partitions)
        gone = [e for e in self._entries.values() if e.partition in numbers]
        for entry in gone:
            del self._entries[entry.key]
        self._loaded -= numbers
        return gone

    # ------------------------------------------------------------------ access
    def get(self, key: bytes) -> S | None:
        entry = self._entries.get(key)
        return entry.state if entry is not None else None

    def entry(self, key: bytes) -> StateEntry[S] | None:
        return self._entries.get(key)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[StateEntry[S]]:
        return iter(list(self._entries.values()))

    # ------------------------------------------------------------------ changes
    def put(self, key: bytes, state: S, partition: int, *, ttl_s: float | None = None) -> OutRecord:
        """Set ``key``'s state (renewing its time-to-live); returns its checkpoint record."""
        self.keep(key, state, partition, ttl_s=ttl_s)
        return self.checkpoint(key)

    def keep(self, key: bytes, state: S, partition: int, *, ttl_s: float | None = None) -> None:
        """Set ``key``'s state without encoding a checkpoint (a later :meth:`checkpoint`
        covers it: coalesced checkpoints)."""
        self._set(key, state, partition, ttl_s)

    def touch(self, key: bytes, *, ttl_s: float | None = None) -> None:
        """Renew ``key``'s time-to-live without changing its state."""
        entry = self._entries.get(key)
        if entry is not None:
            self._set(key, entry.state, entry.partition, ttl_s)

    def checkpoint(self, key: bytes) -> OutRecord:
        entry = self._entries[key]
        return self._record(key, encode_state(self.codec, entry.state), entry.partition)

    def delete(self, key: bytes) -> OutRecord | None:
        """Forget ``key``; returns the tombstone that deletes it from the topic too."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        return self._record(key, None, entry.partition)

    # ------------------------------------------------------------------ expiry and bound
    def due(self, now: float | None = None) -> list[StateEntry[S]]:
        """Entries whose time-to-live has run out, oldest first. The caller deletes or
        renews each one (an entry left alone is not returned again)."""
        now = self.clock() if now is None else now
        expired: list[StateEntry[S]] = []
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, _, key = heapq.heappop(self._expiry)
            entry = self._entries.get(key)
            if entry is not None and entry.expires_at == expires_at:
                expired.append(entry)
        return expired

    def make_room(self, key: bytes) -> list[StateEntry[S]]:
        """Before ``key`` is added: the idlest entries to evict so it fits under
        ``max_keys`` (none when ``key`` exists or there is room)."""
        limit = self.limits.max_keys
        if limit is None or key in self._entries or len(self._entries) < limit:
            return []
        excess = len(self._entries) - limit + 1
        return heapq.nsmallest(excess, self._entries.values(), key=lambda e: e.expires_at)

    # ------------------------------------------------------------------ internals
    def _set(self, key: bytes, state: S, partition: int, ttl_s: float | None) -> None:
        expires_at = self.clock() + (self.limits.ttl_s if ttl_s is None else ttl_s)
        self._entries[key] = StateEntry(key, state, partition, expires_at)
        heapq.heappush(self._expiry, (expires_at, next(self._order), key))
        if len(self._expiry) > 4 * len(self._entries) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop heap items superseded by a later put/touch (keeps the heap O(live keys))."""
        self._expiry = [(e.expires_at, next(self._order), e.key) for e in self._entries.values()]
        heapq.heapify(self._expiry)

    def _record(self, key: bytes, value: bytes | None, partition: int) -> OutRecord:
        return OutRecord(
            topic=self.topic,
            key=key,
            value=value,
            headers=[],
            partition=partition,
            after_acks=True,
            counts_as_result=False,
            version=next(self._versions),  # decision order: pipeline/kafka/state_writes.py
        )
