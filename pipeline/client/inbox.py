"""The client's reader: one consumer, no group, positioned at the end before any request leaves.

It reads the client's own reply topic (or, with ``reply="shared"``, the topology's
result topic) and the dead-letter topic, decodes each record with the tools' one
classifier (:func:`pipeline.tools.decoding.classify`) and hands it to
:class:`~pipeline.client.waiters.Waiters`. No consumer group: each client reads
every partition it needs itself, nothing is committed, and many clients do not
rebalance one another.

Dead letters stay on the dead-letter topic (one outcome per record; ``pipeline
replay`` reads them there). A client with a reply topic skips, before decoding, every
dead letter whose ``reply-topic`` header is not its own, so it only decodes its own.
A least-privilege client may not read the dead-letter topic at all (it holds other
clients' requests; ``pipeline deploy acls --client``): it is then given none, and a call
whose request is dead-lettered ends by its timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from pipeline.client.waiters import Waiters
from pipeline.contract.reply import REPLY_TOPIC
from pipeline.kafka.clients import RecordLimits, isolation_level, make_consumer
from pipeline.settings import KafkaSettings
from pipeline.tools.connect import start_client
from pipeline.tools.decoding import Kind, classify

log = logging.getLogger(__name__)


class Inbox:
    """Reads ``reply_topics`` and ``dead_letter_topic`` from their ends into ``waiters``."""

    def __init__(
        self,
        settings: KafkaSettings,
        waiters: Waiters,
        *,
        reply_topics: Sequence[str],
        dead_letter_topic: str | None,
        own_reply_topic: str | None,
        limits: RecordLimits,
        committed_only: bool = False,
    ) -> None:
        self._settings = settings
        self._waiters = waiters
        self._topics = [*reply_topics, *([dead_letter_topic] if dead_letter_topic else [])]
        self._dead_letter_topic = dead_letter_topic
        self._own = own_reply_topic.encode() if own_reply_topic else None
        self._consumer: AIOKafkaConsumer = make_consumer(
            settings, group_id=None, limits=limits,
            # A topology under exactly-once writes its results in transactions: read only committed ones.
            isolation_level=isolation_level(committed_only),
        )  # fmt: skip
        self._task: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None

    async def start(self, partitions: dict[str, set[int]], timeout_s: float) -> None:
        """Assign ``partitions`` (topic -> ids, every one of the topics read) and resolve
        each position to its current end, so a reply produced after this returns is read
        and nothing older is."""
        await start_client(self._consumer, self._settings, timeout_s)
        assigned = [TopicPartition(topic, p) for topic in self._topics for p in sorted(partitions[topic])]
        self._consumer.assign(assigned)
        await self._consumer.seek_to_end(*assigned)
        for tp in assigned:
            await asyncio.wait_for(self._consumer.position(tp), timeout_s)
        self._task = asyncio.create_task(self._run(), name="pipeline-client-inbox")

    @property
    def topics(self) -> list[str]:
        return list(self._topics)

    async def _run(self) -> None:
        try:
            while True:
                batches = await self._consumer.getmany(timeout_ms=500, max_records=2000)
                for records in batches.values():
                    for record in records:
                        if record.topic == self._dead_letter_topic and not self._mine(record.headers):
                            continue
                        consumed = classify(record)
                        if consumed.kind in (Kind.RESULT, Kind.DEAD_LETTER):
                            self._waiters.deliver(consumed)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client cannot read replies any more: fail every call
            log.exception("pipeline client: reading replies failed")
            self.failure = exc
            self._waiters.fail_all(exc)

    def _mine(self, headers: Sequence[tuple[str, bytes]] | None) -> bool:
        """With a reply topic: only dead letters that carry it (shared: all of them)."""
        if self._own is None:
            return True
        return any(name.lower() == REPLY_TOPIC and value == self._own for name, value in headers or ())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._consumer.stop()
