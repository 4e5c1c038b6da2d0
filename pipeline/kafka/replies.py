"""The result stage's side of reply topics: send a result to the reply topic it asks for.

The outbox asks :meth:`ReplyRedirector.redirect` of every output it sends (one place for
stateless, sequence and join stages alike). Only results bound for the topology's
result topic are candidates; dead letters and checkpoints never move. The rule
itself (header names, prefix) is :mod:`pipeline.contract.reply`; this module adds
what needs the broker: does the reply topic exist, does it have that partition?

A reply topic the broker does not know (the client deleted it, or never created
it) must not stall or stop the stage, since aiokafka would wait up to its send
timeout for the metadata and then fail the delivery. So its metadata is looked up
once with a short bound, a missing topic is remembered for :data:`NEGATIVE_TTL_S`,
and meanwhile its results go to the result topic (counted ``unknown-topic``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from pipeline.contract.reply import REPLY_PARTITION, REPLY_TOPIC, ReplyOutcome, reply_target
from pipeline.kafka.outbox import Outputs, OutRecord
from pipeline.observability.metrics import PipelineMetrics

log = logging.getLogger(__name__)

_REPLY_HEADERS = frozenset({REPLY_TOPIC, REPLY_PARTITION})

#: How long the first send to a new reply topic may wait for its metadata.
LOOKUP_TIMEOUT_S = 2.0
#: How long a reply topic found missing is not asked about again.
NEGATIVE_TTL_S = 30.0


class ReplyRedirector:
    """Rewrites results for ``result_topic`` that carry an honoured ``reply-topic``."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        *,
        result_topic: str,
        prefix: str,
        on_outcome: Callable[[ReplyOutcome], None] | None = None,
    ) -> None:
        self._producer = producer
        self.result_topic = result_topic
        self.prefix = prefix
        self._on_outcome = on_outcome
        self._missing: dict[str, float] = {}  # topic -> monotonic time until which it counts as absent

    def _for_result_topic(self, out: OutRecord) -> bool:
        """A result bound for the result topic: the only outputs a reply topic may take."""
        return not out.dead_letter and out.counts_as_result and out.topic == self.result_topic

    def asks(self, out: OutRecord) -> bool:
        """Whether :meth:`redirect` has anything to decide for ``out``: a result for the result
        topic carrying a ``reply-topic`` or ``reply-partition`` header (one pass over its
        headers, no coroutine: most results carry neither)."""
        if not self._for_result_topic(out):
            return False
        return any(v is not None and isinstance(k, str) and k.lower() in _REPLY_HEADERS for k, v in out.headers or ())

    async def redirect(self, out: OutRecord) -> OutRecord:
        """``out`` itself, or a copy addressed to its reply topic (and partition)."""
        if not self._for_result_topic(out):
            return out
        wanted = reply_target(out.headers, self.prefix)
        if wanted.outcome is None:
            return out
        outcome = wanted.outcome
        topic = wanted.topic or ""
        if wanted.honoured:
            partitions = await self._partitions(topic)
            if partitions is None:
                outcome = ReplyOutcome.UNKNOWN_TOPIC
            elif wanted.partition is not None and wanted.partition not in partitions:
                outcome = ReplyOutcome.UNKNOWN_PARTITION
        self._count(outcome)
        if outcome is not ReplyOutcome.HONOURED:
            log.debug("reply-topic %r ignored (%s): result to %s", wanted.topic, outcome, out.topic)
            return out
        return dataclasses.replace(out, topic=topic, partition=wanted.partition, redirected_from=(out.topic, out.partition))

    async def redirect_back(self, outputs: Outputs) -> Outputs:
        """The broker did not take these results at their reply topics (deleted since their
        metadata was read: the client is gone): back to the result topic, and the topics
        count as missing for :data:`NEGATIVE_TTL_S` (counted ``unreachable``)."""
        back = []
        for out in outputs:
            if out.redirected_from is None:
                back.append(out)
                continue
            log.warning("reply topic %s did not take a result: sent to %s instead", out.topic, out.redirected_from[0])
            self._missing[out.topic] = time.monotonic() + NEGATIVE_TTL_S
            self._count(ReplyOutcome.UNREACHABLE)
            topic, partition = out.redirected_from
            back.append(dataclasses.replace(out, topic=topic, partition=partition, redirected_from=None))
        return tuple(back)

    async def _partitions(self, topic: str) -> set[int] | None:
        until = self._missing.get(topic)
        if until is not None and time.monotonic() < until:
            return None  # before the cached metadata: a topic found gone may still be listed there
        known = self._producer.client.cluster.partitions_for_topic(topic)
        if known is not None:
            return set(known)
        try:
            found = await asyncio.wait_for(self._producer.partitions_for(topic), LOOKUP_TIMEOUT_S)
        except (KafkaError, asyncio.TimeoutError):
            found = None
        if not found:
            self._missing[topic] = time.monotonic() + NEGATIVE_TTL_S
            return None
        self._missing.pop(topic, None)
        return set(found)

    def _count(self, outcome: ReplyOutcome) -> None:
        if self._on_outcome is not None:
            self._on_outcome(outcome)


def stage_replies(
    producer: AIOKafkaProducer, stage: str, output_topic: str, prefix: str | None, metrics: PipelineMetrics
) -> ReplyRedirector | None:
    """A stage's router, counting into ``pipeline_reply_routes_total``; None for a stage
    that does not write the result topic (``prefix`` None)."""
    if prefix is None:
        return None
    routes = metrics.reply_routes
    return ReplyRedirector(
        producer,
        result_topic=output_topic,
        prefix=prefix,
        on_outcome=lambda outcome: routes.labels(stage, str(outcome)).inc(),
    )
