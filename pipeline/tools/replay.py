"""Redrive dead letters: read a dead-letter topic, send the selected records back.

``pipeline replay`` is a thin command over :func:`replay`. What it does, and why:

* It reads the dead-letter topic **from the start position to the end offsets taken
  when it starts**, then stops: a record dead-lettered again while it runs (the stage
  is live) waits for the next run instead of going round at once.
* Without a group it reads every partition from the beginning and commits nothing (a
  look, or a one-off redrive). With ``group`` it starts where that group committed and,
  at the end, commits per partition past every record it read, but never past a
  record whose replay failed: a second run with the same group does not redo what
  was replayed, refused or left out by the filters, and retries what failed. (So use
  one group per filter, or none, when replaying part of a topic.)
* Each record sent is the original: key, value and headers byte for byte (the dead
  letter's ``error-*``, ``source-*`` and claim-check headers removed), plus
  ``replay-count`` one higher than before. Stages carry every request header to their
  results and dead letters, so a record that fails again comes back with its count,
  and the rules (:mod:`pipeline.tools.replay_rules`) refuse it past ``max_replays``.
* A claim check's original is fetched from the S3 store and its size and SHA-256
  checked before it is sent (:meth:`ClaimCheckStore.fetch`).
* Sends are paced by the one :class:`~pipeline.tools.pacing.Pacer`; every one is
  awaited to its acknowledgement, so ``sent`` means the broker has it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from pipeline.contract.errors import TextEnum, one_line
from pipeline.contract.records import read_replay_count, read_source, replayed_headers
from pipeline.deadletter.claim_check import ClaimCheckStore
from pipeline.errors import ConfigError
from pipeline.kafka.clients import RecordLimits, make_consumer, make_producer
from pipeline.kafka.to_end import ReadToEnd
from pipeline.kafka.topic_partitions import topic_partitions
from pipeline.settings import KafkaSettings, S3Settings
from pipeline.tools.connect import start_client
from pipeline.tools.pacing import Pacer
from pipeline.tools.replay_rules import Letter, Plan, ReplayRules, Verdict

CONNECT_TIMEOUT_S = 10.0


class Outcome(TextEnum):
    """What became of one selected dead letter."""

    WOULD_SEND = "would send"  # --dry-run
    SENT = "sent"
    REFUSED = "refused"
    ANSWERED = "already answered"
    FAILED = "failed"


@dataclass(frozen=True)
class ReplayOptions:
    rules: ReplayRules = field(default_factory=ReplayRules)
    dry_run: bool = False
    rate: float = 0.0
    """Records per second; 0: as fast as the broker takes them."""
    limit: int | None = None
    """Stop after this many selected dead letters."""
    group: str | None = None
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    result_topic: str | None = None
    """Read to its end first: dead letters whose key has a result there are refused
    (``ReplayRules.answered``). None: nothing is checked (``--replay-answered``)."""


@dataclass(frozen=True)
class Row:
    """One selected dead letter, for the table a person reads."""

    partition: int
    offset: int
    key: str
    error_class: str
    stage: str
    reason: str
    target: str | None
    replay_count: int
    outcome: Outcome
    detail: str = ""


@dataclass
class ReplayReport:
    """Counts of one run: ``read`` = not selected + ``selected``; ``selected`` = sent
    (or would send) + refused + answered + failed. ``rows``: every selected record in a dry run,
    else the refused and failed ones."""

    topic: str
    to_read: int = 0
    read: int = 0
    selected: int = 0
    sent: int = 0
    would_send: int = 0
    refused: int = 0
    answered: int = 0
    failed: int = 0
    interrupted: bool = False
    rows: list[Row] = field(default_factory=list)
    committed: dict[int, int] = field(default_factory=dict)

    def add(self, row: Row, *, keep: bool) -> None:
        counter = {
            Outcome.SENT: "sent", Outcome.WOULD_SEND: "would_send", Outcome.REFUSED: "refused", Outcome.ANSWERED: "answered"
        }  # fmt: skip
        name = counter.get(row.outcome, "failed")
        setattr(self, name, getattr(self, name) + 1)
        if keep:
            self.rows.append(row)


def _row(letter: Letter, plan: Plan, outcome: Outcome, detail: str = "", count: int | None = None) -> Row:
    return Row(
        partition=letter.partition,
        offset=letter.offset,
        key=letter.key_text,
        error_class=letter.failure.error_class,
        stage=letter.failure.stage,
        reason=letter.failure.reason,
        target=plan.target,
        replay_count=letter.replay_count if count is None else count,
        outcome=outcome,
        detail=detail or plan.detail,
    )


class _Replayer:
    """One run: the consumer over the dead-letter topic, the producer, the report."""

    def __init__(
        self,
        topic: str,
        *,
        settings: KafkaSettings,
        limits: RecordLimits,
        s3: S3Settings | None,
        options: ReplayOptions,
        on_progress: Callable[[ReplayReport], None] | None,
    ) -> None:
        self.topic = topic
        self.settings = settings
        self.limits = limits
        self.s3 = s3
        self.options = options
        self.on_progress = on_progress
        self.report = ReplayReport(topic=topic)
        self.pacer = Pacer(options.rate)
        self.producer: AIOKafkaProducer | None = None
        self._store: ClaimCheckStore | None = None
        self._next: dict[TopicPartition, int] = {}  # past the last record handled, per partition
        self._first_failed: dict[TopicPartition, int] = {}
        self._first: dict[TopicPartition, int] = {}  # where this run started, per partition
        self._pending: set[asyncio.Future[object]] = set()

    async def run(self, stop: asyncio.Event | None) -> ReplayReport:
        if self.options.result_topic is not None:
            answered = await answered_keys(self.settings, self.options.result_topic, self.limits, stop)
            self.options = replace(self.options, rules=replace(self.options.rules, answered=answered))
        consumer = make_consumer(self.settings, group_id=self.options.group, limits=self.limits)
        await start_client(consumer, self.settings, self.options.connect_timeout_s)
        try:
            reader = await self._assign(consumer)
            if not self.options.dry_run and any(self._next[tp] < end for tp, end in reader.ends.items()):
                self.producer = make_producer(self.settings, limits=self.limits)
                await start_client(self.producer, self.settings, self.options.connect_timeout_s)
            try:
                await self._read(reader, stop)
                if self.producer is not None:
                    await self.producer.flush()
                if self._pending:
                    await asyncio.wait(set(self._pending))
            finally:
                if self.producer is not None:
                    await self.producer.stop()
            if self.options.group is not None and not self.options.dry_run:
                await self._commit(consumer)
        finally:
            await consumer.stop()
        if self.on_progress is not None:
            self.on_progress(self.report)
        return self.report

    async def _assign(self, consumer: AIOKafkaConsumer) -> ReadToEnd:
        """Every partition of the topic, positioned at its start, to be read to its end as of now."""
        numbers = await topic_partitions(consumer, self.topic)
        if not numbers:
            raise ConfigError(f"dead-letter topic {self.topic!r} does not exist on the broker")
        partitions = [TopicPartition(self.topic, p) for p in sorted(numbers)]
        consumer.assign(partitions)
        starts = await consumer.beginning_offsets(partitions)
        for tp in partitions:
            committed = await consumer.committed(tp) if self.options.group is not None else None
            self._next[tp] = max(committed, starts[tp]) if committed is not None else starts[tp]
            consumer.seek(tp, self._next[tp])
        reader = await ReadToEnd.now(consumer, partitions)
        self._first = dict(self._next)
        self._count_to_read(reader)
        return reader

    def _count_to_read(self, reader: ReadToEnd) -> None:
        self.report.to_read = sum(max(0, end - self._first[tp]) for tp, end in reader.ends.items())

    async def _read(self, reader: ReadToEnd, stop: asyncio.Event | None) -> None:
        async for tp, records in reader.batches(stop=stop):
            self._count_to_read(reader)  # the first fetch may move an end (see ReadToEnd)
            for record in records:
                if record.offset >= reader.ends[tp]:
                    break  # written after this run started: the next run's
                if stop is not None and stop.is_set():
                    self.report.interrupted = True
                    return
                await self._handle(tp, Letter.of(record))
                self._next[tp] = record.offset + 1
                if self.options.limit is not None and self.report.selected >= self.options.limit:
                    return
        if stop is not None and stop.is_set():
            self.report.interrupted = True
            return
        for tp in reader.done:  # compacted or transaction markers: the position moved on
            self._next[tp] = max(self._next[tp], reader.ends[tp])

    async def _handle(self, tp: TopicPartition, letter: Letter) -> None:
        self.report.read += 1
        plan = self.options.rules.plan(letter)
        if plan.verdict is Verdict.NOT_SELECTED:
            self._progress()
            return
        self.report.selected += 1
        dry = self.options.dry_run
        if plan.verdict is Verdict.REFUSED:
            self.report.add(_row(letter, plan, Outcome.REFUSED), keep=True)
        elif plan.verdict is Verdict.ANSWERED:
            self.report.add(_row(letter, plan, Outcome.ANSWERED), keep=True)
        elif plan.verdict is Verdict.NO_TARGET:
            self._failed(tp, letter, _row(letter, plan, Outcome.FAILED))
        elif dry:
            self.report.add(_row(letter, plan, Outcome.WOULD_SEND), keep=True)
        else:
            await self._send(tp, letter, plan)
        self._progress()

    async def _send(self, tp: TopicPartition, letter: Letter, plan: Plan) -> None:
        key, value, headers = letter.key, letter.value, letter.headers
        if letter.claim_check is not None:
            try:
                stored = await asyncio.to_thread(self._claim_checks().fetch, letter.claim_check)
            except Exception as exc:  # noqa: BLE001 - any S3, transport or checksum failure: this record failed
                self._failed(tp, letter, _row(letter, plan, Outcome.FAILED, f"claim check: {one_line(str(exc))}"))
                return
            key, value, headers = stored.key, stored.value, stored.headers
            # The manifest holds every header, also those the dead letter dropped to fit its topic.
            count = max(letter.replay_count, read_replay_count(headers))
            plan = self.options.rules.plan(letter, replay_count=count, source=read_source(headers))
            if plan.verdict is Verdict.REFUSED:
                self.report.add(_row(letter, plan, Outcome.REFUSED, count=count), keep=True)
                return
            if plan.verdict is not Verdict.SEND:
                self._failed(tp, letter, _row(letter, plan, Outcome.FAILED, count=count))
                return
        count = max(letter.replay_count, read_replay_count(headers)) + 1
        assert self.producer is not None and plan.target is not None
        await self.pacer.wait()
        try:
            send = self.producer.send(plan.target, value, key=key, headers=replayed_headers(headers, count))
            future = await asyncio.wait_for(send, self.options.connect_timeout_s)
        except (KafkaError, asyncio.TimeoutError) as exc:
            reason = one_line(str(exc)) or f"no metadata for topic {plan.target!r}"
            self._failed(tp, letter, _row(letter, plan, Outcome.FAILED, reason))
            return
        self._pending.add(future)

        def settled(done: asyncio.Future[object]) -> None:
            self._pending.discard(done)
            error = None if done.cancelled() else done.exception()
            if done.cancelled() or error is not None:
                reason = "cancelled" if error is None else one_line(str(error) or type(error).__name__)
                self._failed(tp, letter, _row(letter, plan, Outcome.FAILED, reason))
            else:
                self.report.add(_row(letter, plan, Outcome.SENT), keep=False)

        future.add_done_callback(settled)

    def _failed(self, tp: TopicPartition, letter: Letter, row: Row) -> None:
        self.report.add(row, keep=True)
        self._first_failed[tp] = min(self._first_failed.get(tp, letter.offset), letter.offset)

    def _claim_checks(self) -> ClaimCheckStore:
        if self._store is None:
            if self.s3 is None or not self.s3.configured:
                raise ConfigError("no S3 store configured (PIPELINE_S3_ENDPOINT) to fetch it from")
            self._store = ClaimCheckStore(self.s3)
        return self._store

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        """Past every record handled, never past one whose replay failed."""
        offsets = {tp: min(nxt, self._first_failed.get(tp, nxt)) for tp, nxt in self._next.items()}
        await consumer.commit({tp: OffsetAndMetadata(offset, "") for tp, offset in offsets.items()})
        self.report.committed = {tp.partition: offset for tp, offset in offsets.items()}

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.report)


async def answered_keys(
    settings: KafkaSettings, topic: str, limits: RecordLimits, stop: asyncio.Event | None = None
) -> frozenset[bytes]:
    """The keys (correlation ids) of every result on ``topic`` now (none if it does not
    exist). Held in memory: one entry per answered request the topic still retains."""
    consumer = make_consumer(settings, group_id=None, limits=limits)
    await start_client(consumer, settings, CONNECT_TIMEOUT_S)
    keys: set[bytes] = set()
    try:
        numbers = await topic_partitions(consumer, topic)
        if not numbers:
            return frozenset()
        partitions = [TopicPartition(topic, p) for p in sorted(numbers)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        reader = await ReadToEnd.now(consumer, partitions)
        async for tp, records in reader.batches(stop=stop):
            keys.update(r.key for r in records if r.key is not None and r.offset < reader.ends[tp])
    finally:
        await consumer.stop()
    return frozenset(keys)


async def replay(
    topic: str,
    *,
    settings: KafkaSettings,
    limits: RecordLimits,
    s3: S3Settings | None,
    options: ReplayOptions,
    on_progress: Callable[[ReplayReport], None] | None = None,
    stop: asyncio.Event | None = None,
) -> ReplayReport:
    """Replay the dead letters of ``topic`` as ``options`` say; see the module docstring.

    ``limits``: the producer's record limit (the topology's), so a large original fits.
    ``s3``: the store holding claim checks (None: a claim check cannot be replayed, and
    counts as failed). Raises :class:`~pipeline.errors.EndpointUnreachable` when Kafka
    does not answer and :class:`~pipeline.errors.ConfigError` when the topic is absent.
    """
    replayer = _Replayer(topic, settings=settings, limits=limits, s3=s3, options=options, on_progress=on_progress)
    return await replayer.run(stop)
