"""The tenant gate of a stateless stage: every record passes it before decoding.

Per record: name its tenant (a header, or the key up to a separator), then
- under quota: the stage serves it (``served``);
- over quota, ``over_quota: delay``: the record, byte for byte, goes to the delay topic with
  ``quota-delay-until`` (ms since the epoch) and ``quota-delay-count`` (+1); its slot is
  complete, so the partition commits past it at once (``delayed``);
- over quota ``max_delays`` times already, or ``over_quota: dead-letter``: a
  ``quota-exceeded`` dead letter, at once (``quota-exceeded``).

The stage also consumes the delay topic. A record read there before its time is *held*
(its slot open, so it is not committed) and its partition paused until nothing held there
remains, so the loop never spins on it; when due it passes the quota check again. On a
rebalance or shutdown, held records go back to the delay topic unchanged, so nothing waits
for their time there. A delayed request leaves its partition's order: it is answered after
requests that arrived after it.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from pipeline.contract import headers as h
from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs, OutRecord
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability.metrics import PipelineMetrics
from workers.stateless.batching import DynamicBatcher
from workers.stateless.tenancy.fair_batcher import FairBatcher, Pick
from workers.stateless.tenancy.fair_share import fair_pick
from workers.stateless.tenancy.quotas import QuotaSpec, TenantLabels, TenantQuotas

T = TypeVar("T")

DELAY_UNTIL = "quota-delay-until"
DELAY_COUNT = "quota-delay-count"


@dataclass(frozen=True)
class TenancySettings:
    """A stage's ``tenants`` section as plain settings (pipeline/topology/tenants.py)."""

    default: QuotaSpec
    overrides: dict[str, QuotaSpec] = field(default_factory=dict)
    source: str = "header"  # or "key_prefix"
    header: str = "tenant"
    separator: str = ":"
    delay_topic: str | None = None  # None: over-quota records are dead-lettered
    max_delays: int = 5
    max_delay_s: float = 5.0
    max_labelled_tenants: int = 100
    fair_share: bool = False


@dataclass(frozen=True)
class StageHooks:
    """What the gate does through its stage."""

    complete: Callable[[Slot[Outputs], OutRecord], None]
    dead_letter: Callable[[ConsumedRecord, Slot[Outputs], ErrorClass, str], None]
    consumer: Callable[[], AIOKafkaConsumer | None]
    flow_paused: Callable[[], bool]


@dataclass(order=True)
class _Held:
    due: float
    seq: int
    record: ConsumedRecord = field(compare=False)
    slot: Slot[Outputs] = field(compare=False)

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.record.topic, self.record.partition)


class TenantGate:
    def __init__(self, settings: TenancySettings, stage: str, metrics: PipelineMetrics, hooks: StageHooks) -> None:
        self.settings = settings
        self.hooks = hooks
        self.quotas = TenantQuotas(settings.default, settings.overrides, max_delay_s=settings.max_delay_s)
        self._labels = TenantLabels(list(settings.overrides), settings.max_labelled_tenants)
        self._counter = metrics.tenant_requests
        self._stage = stage
        self._held: list[_Held] = []
        self._seq = itertools.count()
        self.fair = settings.fair_share

    def tenant_of(self, record: ConsumedRecord) -> str:
        """The record's tenant; "" when it names none (it gets the default quota)."""
        if self.settings.source == "header":
            return h.get_header(list(record.headers or ()), self.settings.header.lower()) or ""
        key = (record.key or b"").decode("utf-8", errors="replace")
        tenant, found, _ = key.partition(self.settings.separator)
        return tenant if found else ""

    def tenant_or_none(self, record: ConsumedRecord) -> str:
        try:
            return self.tenant_of(record)
        except BadRequest:
            return ""

    async def admit(self, record: ConsumedRecord, slot: Slot[Outputs]) -> bool:
        """True: serve the record now. False: it has its outcome (delayed or dead-lettered)
        or is held until due."""
        if record.topic == self.settings.delay_topic:
            now = time.time()
            due = min(_due_s(record), now + self.settings.max_delay_s)  # a forged header holds no longer
            if due > now:
                heapq.heappush(self._held, _Held(due, next(self._seq), record, slot))
                self._pause(TopicPartition(record.topic, record.partition))
                return False
        try:
            tenant = self.tenant_of(record)
        except BadRequest as bad:
            self.hooks.dead_letter(record, slot, bad.error_class, f"tenant: {bad.reason}")
            return False
        label = self._labels(tenant)
        if await self.quotas.admit(tenant):
            self._count(label, "served")
            return True
        delays = _delay_count(record)
        quota = self.quotas.quota(tenant)
        if self.settings.delay_topic is None or delays >= self.settings.max_delays:
            why = f"tenant {tenant or '(none)'} over its quota of {quota.rate:g}/s (burst {quota.burst})"
            if delays:
                why += f" after {delays} delay(s)"
            self.hooks.dead_letter(record, slot, ErrorClass.QUOTA_EXCEEDED, why)
            self._count(label, "quota-exceeded")
            return False
        until_ms = int(self.quotas.come_back_at(tenant) * 1000)
        headers = h.replace_headers(
            list(record.headers or ()), [(DELAY_UNTIL, str(until_ms)), (DELAY_COUNT, str(delays + 1))]
        )
        self.hooks.complete(slot, self._to_delay_topic(record, headers))
        self._count(label, "delayed")
        return False

    def due(self) -> list[tuple[ConsumedRecord, Slot[Outputs]]]:
        """Held records whose time has come (to :meth:`admit` again); pauses partitions that
        still hold records not yet due, resumes those holding none."""
        now = time.time()
        ready = []
        while self._held and self._held[0].due <= now:
            held = heapq.heappop(self._held)
            ready.append((held.record, held.slot))
        still = {held.tp for held in self._held}
        for tp in {TopicPartition(r.topic, r.partition) for r, _ in ready} - still:
            self._resume(tp)
        for tp in still:
            self._pause(tp)
        return ready

    def return_held(self, partitions: list[TopicPartition] | None) -> None:
        """Rebalance or shutdown: held records go back to the delay topic as they are."""
        keep: list[_Held] = []
        back: list[_Held] = []
        for held in self._held:
            (back if partitions is None or held.tp in partitions else keep).append(held)
        self._held = keep
        heapq.heapify(self._held)
        for held in back:
            self.hooks.complete(held.slot, self._to_delay_topic(held.record, list(held.record.headers or ())))

    def forget(self, partitions: list[TopicPartition]) -> None:
        self._held = [held for held in self._held if held.tp not in partitions]
        heapq.heapify(self._held)

    def _to_delay_topic(self, record: ConsumedRecord, headers: h.Headers) -> OutRecord:
        assert self.settings.delay_topic is not None
        return OutRecord(
            topic=self.settings.delay_topic,
            key=record.key,
            value=record.value,
            headers=headers,
            counts_as_result=False,
            timestamp_ms=record.timestamp if record.timestamp > 0 else None,
        )

    def _count(self, label: str, outcome: str) -> None:
        self._counter.labels(self._stage, label, outcome).inc()

    def _pause(self, tp: TopicPartition) -> None:
        consumer = self.hooks.consumer()
        if consumer is not None and tp in consumer.assignment():
            consumer.pause(tp)

    def _resume(self, tp: TopicPartition) -> None:
        consumer = self.hooks.consumer()
        if consumer is not None and tp in consumer.assignment() and not self.hooks.flow_paused():
            consumer.resume(tp)


class _Item(Protocol):
    tenant: str
    rows: int


class _Batching(Protocol):
    @property
    def max_queue_delay_s(self) -> float: ...
    @property
    def max_batch_bytes(self) -> int | None: ...
    @property
    def max_inflight_batches(self) -> int: ...


ItemT = TypeVar("ItemT", bound=_Item)


def _tenant(item: _Item) -> str:
    return item.tenant


def _rows(item: _Item) -> int:
    return item.rows


def stage_batcher(
    max_rows: int, settings: _Batching, calls: Sized, *, fair: bool, max_elements: int | None = None
) -> DynamicBatcher[ItemT]:
    """The stage's batcher; with fair batches, one that forms a batch when a call can start
    (fewer than ``max_inflight_batches`` ``calls`` running) and picks its rows with :func:`fair_pick`."""
    if not fair:
        return DynamicBatcher(max_rows, settings.max_queue_delay_s, settings.max_batch_bytes, max_elements)
    pick: Pick[ItemT] = fair_pick_of(_tenant, _rows)
    return FairBatcher(
        max_rows,
        settings.max_queue_delay_s,
        settings.max_batch_bytes,
        max_elements,
        pick=pick,
        capacity=lambda: settings.max_inflight_batches - len(calls),
    )
def fair_pick_of(tenant_of: Callable[[T], str], rows_of: Callable[[T], int]) -> Pick[T]:
    """The batcher's ``pick`` hook: :func:`fair_pick` over the items' tenants and rows."""

    def pick(items: list[T], max_rows: int) -> list[int]:
        return fair_pick([(tenant_of(item), rows_of(item)) for item in items], max_rows)

    return pick


def _header_int(record: ConsumedRecord, name: str) -> int:
    """A gate header's integer value; absent or unreadable reads as 0 (due now, never delayed)."""
    try:
        text = h.get_header(list(record.headers or ()), name)
        return int(text) if text is not None else 0
    except (BadRequest, ValueError):
        return 0


def _due_s(record: ConsumedRecord) -> float:
    return _header_int(record, DELAY_UNTIL) / 1000


def _delay_count(record: ConsumedRecord) -> int:
    return max(_header_int(record, DELAY_COUNT), 0)
