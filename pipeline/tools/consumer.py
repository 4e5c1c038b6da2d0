"""Read records from topics until a count, an idle timeout or a signal; classify each.

Without a group the consumer reads every partition and commits nothing: a
look at a topic must not move a real consumer group's offsets. With a group
it joins it, reads its share of the partitions and commits after each batch
it has handed on, like any other member.

"Latest" (the default start) has a race built in: a record produced between
subscribing and the consumer learning the end offsets would be skipped. So
before reporting ready, the consumer resolves the position of every assigned
partition; ``on_ready`` fires only then, and anything produced after it is
seen. Scripts wait for that line on stderr before producing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from pipeline.contract.errors import TextEnum
from pipeline.kafka.clients import make_consumer, refuse_unauthorized
from pipeline.kafka.topic_partitions import topic_partitions
from pipeline.settings import KafkaSettings
from pipeline.tools.connect import start_client
from pipeline.tools.decoding import Consumed, classify

#: How long to wait for the broker, and for the topics' partitions to be assigned.
CONNECT_TIMEOUT_S = 10.0
#: Session timeout of a ``--group`` member. Short, since an interactive tool is often stopped
#: hard: a member that vanished without leaving holds the next join up for this long. (aiokafka
#: also skips LeaveGroup in generation 0, the first generation Tansu hands out.)
GROUP_SESSION_TIMEOUT_S = 10.0
_POLL_MS = 200


class StopReason(TextEnum):
    """Why reading ended: ``--count`` reached, ``--timeout`` idle, or Ctrl-C/SIGTERM."""

    COUNT = "count"
    IDLE = "idle"
    SIGNAL = "signal"


@dataclass(frozen=True)
class ConsumeOptions:
    """When to start and when to stop."""

    from_beginning: bool = False
    count: int | None = None
    """Stop after this many records (None: no limit)."""
    idle_timeout_s: float | None = 10.0
    """Stop after this long without a record (None: follow until stopped)."""
    group: str | None = None
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    partitions: tuple[int, ...] = ()
    """Read only these partitions of each topic (empty: all). With ``start``, the partitions
    are assigned, not subscribed: no group, as ``kafka-console-consumer --partition``."""
    start: StartAt | None = None
    """Where to start in each partition read (None: ``from_beginning`` decides)."""


@dataclass(frozen=True)
class StartAt:
    """``--offset``: ``beginning``, ``end``, an offset (negative: that many before the end),
    or the first record at or after a time (ms since the epoch)."""

    kind: str
    value: int = 0

    @classmethod
    def parse(cls, text: str, *, now_ms: int) -> StartAt:
        from pipeline.tools.replay_rules import parse_time

        word = text.strip().lower()
        if word in ("beginning", "earliest", "start"):
            return cls("beginning")
        if word in ("end", "latest"):
            return cls("end")
        try:
            return cls("offset", int(word))
        except ValueError:
            return cls("time", parse_time(text, now_ms=now_ms))


@dataclass(frozen=True)
class ConsumeResult:
    """How a consume run ended."""

    records: int
    stopped_by: StopReason
    missing_topics: list[str]
    """Topics that had no partition assigned when the consumer became ready."""


async def consume(
    topics: list[str],
    *,
    settings: KafkaSettings,
    options: ConsumeOptions,
    on_record: Callable[[Consumed], None],
    on_ready: Callable[[list[TopicPartition], list[str]], None] | None = None,
    stop: asyncio.Event | None = None,
) -> ConsumeResult:
    """Consume ``topics``, calling ``on_record`` with each classified record in partition order."""
    overrides: dict[str, Any] = {"session_timeout_ms": int(GROUP_SESSION_TIMEOUT_S * 1000)} if options.group else {}
    consumer = make_consumer(
        settings,
        group_id=options.group,
        auto_offset_reset="earliest" if options.from_beginning else "latest",
        **overrides,
    )
    await start_client(consumer, settings, options.connect_timeout_s)
    if options.partitions or options.start is not None:
        return await _consume_assigned(settings, consumer, topics, options, on_record, on_ready, stop)
    try:
        consumer.subscribe(topics)
        # A group join waits for the members of the previous generation, up to a session timeout.
        patience = options.connect_timeout_s + (GROUP_SESSION_TIMEOUT_S if options.group else 0.0)
        assigned = await _wait_assigned(
            consumer, topics, patience, stop, every_topic=not options.group
        )
        return await _read(settings, consumer, topics, assigned, options, on_record, on_ready, stop)
    finally:
        await consumer.stop()


async def _consume_assigned(
    settings: KafkaSettings,
    consumer: AIOKafkaConsumer,
    topics: list[str],
    options: ConsumeOptions,
    on_record: Callable[[Consumed], None],
    on_ready: Callable[[list[TopicPartition], list[str]], None] | None,
    stop: asyncio.Event | None,
) -> ConsumeResult:
    """Read chosen partitions from chosen positions (``--partition``/``--offset``), no group."""
    try:
        assigned: list[TopicPartition] = []
        for topic in topics:
            known = await asyncio.wait_for(topic_partitions(consumer, topic), options.connect_timeout_s) or set()
            wanted = set(options.partitions) if options.partitions else known
            assigned += [TopicPartition(topic, p) for p in sorted(wanted & known)]
        consumer.assign(assigned)
        if assigned:
            await _seek(consumer, assigned, options)
        return await _read(settings, consumer, topics, assigned, options, on_record, on_ready, stop)
    finally:
        await consumer.stop()


async def _read(
    settings: KafkaSettings,
    consumer: AIOKafkaConsumer,
    topics: list[str],
    assigned: list[TopicPartition],
    options: ConsumeOptions,
    on_record: Callable[[Consumed], None],
    on_ready: Callable[[list[TopicPartition], list[str]], None] | None,
    stop: asyncio.Event | None,
) -> ConsumeResult:
    """Positions resolved now ("latest"/"earliest", not at the first fetch), ``on_ready`` told,
    then records until ``options`` or ``stop`` end it."""
    for partition in assigned:
        await consumer.position(partition)
    missing = sorted(set(topics) - {tp.topic for tp in assigned})
    await refuse_unauthorized(settings, missing, "consume")
    if on_ready is not None:
        on_ready(sorted(assigned), missing)
    records, reason = await _loop(consumer, options, on_record, stop)
    return ConsumeResult(records=records, stopped_by=reason, missing_topics=missing)


async def _seek(consumer: AIOKafkaConsumer, partitions: list[TopicPartition], options: ConsumeOptions) -> None:
    start = options.start or StartAt("beginning" if options.from_beginning else "end")
    if start.kind == "beginning":
        await consumer.seek_to_beginning(*partitions)
    elif start.kind == "end":
        await consumer.seek_to_end(*partitions)
    elif start.kind == "offset":
        first = await consumer.beginning_offsets(partitions)
        ends = await consumer.end_offsets(partitions)
        for tp in partitions:
            wanted = start.value if start.value >= 0 else ends[tp] + start.value
            consumer.seek(tp, min(max(wanted, first[tp]), ends[tp]))
    else:
        found = await consumer.offsets_for_times({tp: start.value for tp in partitions})
        ends = await consumer.end_offsets(partitions)
        for tp in partitions:
            at = found.get(tp)
            consumer.seek(tp, at.offset if at is not None else ends[tp])


async def _wait_assigned(
    consumer: AIOKafkaConsumer,
    topics: list[str],
    timeout: float,
    stop: asyncio.Event | None,
    *,
    every_topic: bool,
) -> list[TopicPartition]:
    """The assignment once it is complete, or whatever it is after ``timeout``.

    Without a group, complete means a partition of every topic (a topic that
    does not exist yet has none). In a group, another member may own whole
    topics, so any partition will do. An incomplete assignment is not an
    error, only what ``missing_topics`` reports.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        covered = {tp.topic for tp in consumer.assignment()}
        if covered >= set(topics) or (covered and not every_topic):
            break
        await asyncio.sleep(0.05)
    return list(consumer.assignment())


async def _loop(
    consumer: AIOKafkaConsumer,
    options: ConsumeOptions,
    on_record: Callable[[Consumed], None],
    stop: asyncio.Event | None,
) -> tuple[int, StopReason]:
    seen = 0
    last_activity = time.monotonic()
    while True:
        if stop is not None and stop.is_set():
            return seen, StopReason.SIGNAL
        if options.count is not None and seen >= options.count:
            return seen, StopReason.COUNT
        wait_ms = _POLL_MS
        if options.idle_timeout_s is not None:
            remaining = options.idle_timeout_s - (time.monotonic() - last_activity)
            if remaining <= 0:
                return seen, StopReason.IDLE
            wait_ms = max(1, min(_POLL_MS, int(remaining * 1000)))
        if not consumer.assignment():  # nothing to fetch (yet): a group is still (re)joining
            await asyncio.sleep(min(wait_ms, 50) / 1000)
            continue
        limit = None if options.count is None else options.count - seen
        try:
            # getmany can outlast its own timeout while a rebalance is in progress; the
            # idle timeout and Ctrl-C must not. Cancelling it loses nothing: records leave
            # the fetcher's buffer only when returned.
            batches = await asyncio.wait_for(
                consumer.getmany(timeout_ms=wait_ms, max_records=limit), wait_ms / 1000 + 0.5
            )
        except asyncio.TimeoutError:
            continue
        got = 0
        for records in batches.values():
            for record in records:
                on_record(classify(record))
                got += 1
        if got:
            seen += got
            last_activity = time.monotonic()
            if options.group is not None:
                await consumer.commit()
