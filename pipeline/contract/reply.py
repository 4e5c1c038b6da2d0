"""Reply topics: a request may name the topic (and partition) its result goes to.

Many client instances calling one topology should not each read every result. As
in Spring Kafka's ``ReplyingKafkaTemplate`` (``kafka_replyTopic`` /
``kafka_replyPartition``), a request carries ``reply-topic`` and optionally
``reply-partition``; the stage that writes the topology's result topic sends the
result there instead. Our names follow the contract's kebab-case headers
(``correlation-id``, ``deadline``) and carry UTF-8 text like every other header;
Spring's partition header is a 4-byte binary integer, which no other header here is.

The pipeline must not become a way to write anywhere: only topics under the
topology's **reply prefix**, ``<result_topic>.reply.``, are honoured. Anything else
is ignored (the result goes to the result topic, as without the header) and counted.
Dead letters never follow the header: every record's one outcome stays where
``pipeline replay`` and operators look for it, the dead-letter topic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.contract import headers as h
from pipeline.contract.errors import BadRequest, TextEnum

REPLY_TOPIC = "reply-topic"
REPLY_PARTITION = "reply-partition"
#: What follows the result topic's name in every reply topic.
REPLY_INFIX = ".reply."
#: Kafka's own rule for topic names (legal characters, at most 249 of them).
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_PARTITION = re.compile(r"[0-9]{1,10}")
_MAX_PARTITION = (1 << 31) - 1


class ReplyOutcome(TextEnum):
    """What a stage did with a request's ``reply-topic`` (the ``outcome`` metric label)."""

    HONOURED = "honoured"
    OUTSIDE_PREFIX = "outside-prefix"  # not under <result_topic>.reply.: refused
    BAD_HEADER = "bad-header"  # unreadable, repeated with other values, not a topic name
    UNKNOWN_TOPIC = "unknown-topic"  # under the prefix, but the broker does not have it
    UNKNOWN_PARTITION = "unknown-partition"  # the reply topic has no such partition
    UNREACHABLE = "unreachable"  # honoured, then the broker refused it there (topic deleted): result topic


@dataclass(frozen=True)
class ReplyTarget:
    """Where a result asks to go. ``outcome`` None: no ``reply-topic`` header at all."""

    topic: str | None = None
    partition: int | None = None
    outcome: ReplyOutcome | None = None

    @property
    def honoured(self) -> bool:
        return self.outcome is ReplyOutcome.HONOURED


def reply_prefix(result_topic: str) -> str:
    """The namespace of a topology's reply topics: ``<result_topic>.reply.``."""
    return result_topic + REPLY_INFIX


def reply_target(headers: h.HeaderPairs | None, prefix: str) -> ReplyTarget:
    """Read ``reply-topic``/``reply-partition`` and apply the prefix rule (pure: no broker).

    A topic under ``prefix`` (and longer than it) is honoured; a bad or repeated
    ``reply-partition`` makes the whole header set ``bad-header`` rather than a guess.
    """
    try:
        topic = h.get_header(headers, REPLY_TOPIC)
        partition_text = h.get_header(headers, REPLY_PARTITION)
    except BadRequest:
        return ReplyTarget(outcome=ReplyOutcome.BAD_HEADER)
    if topic is None:
        return ReplyTarget()
    if not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        return ReplyTarget(outcome=ReplyOutcome.BAD_HEADER)
    if not topic.startswith(prefix) or len(topic) == len(prefix):
        return ReplyTarget(topic=topic, outcome=ReplyOutcome.OUTSIDE_PREFIX)
    partition = None
    if partition_text is not None:
        text = partition_text.strip()
        if not _PARTITION.fullmatch(text) or int(text) > _MAX_PARTITION:
            return ReplyTarget(topic=topic, outcome=ReplyOutcome.BAD_HEADER)
        partition = int(text)
    return ReplyTarget(topic=topic, partition=partition, outcome=ReplyOutcome.HONOURED)


def reply_headers(topic: str, partition: int | None = None) -> h.Headers:
    """The headers a client adds to ask for its results on ``topic`` (``partition``)."""
    pairs = [(REPLY_TOPIC, topic)]
    if partition is not None:
        pairs.append((REPLY_PARTITION, str(partition)))
    return h.encode_headers(pairs)
