"""Committing a consumer's offsets past its acknowledged outputs, when that is safe.

The outbox's partition lines (:class:`pipeline.kafka.ordering.OrderedOffsets`) say how far
each partition may be committed: up to the first record whose outputs the broker has not
acknowledged. This is the one place those offsets go to the broker, and the rules of when
they must not: never while the worker's membership is unconfirmed (a zombie's commit would
overwrite its partitions' new owner's), and a refused commit is never an error (after a
rebalance the new owner replays from the last commit; a transient failure is retried on
the outbox's next commit, the offsets still marked uncommitted). Kept apart from
:class:`pipeline.kafka.outbox.Outbox`, whose :meth:`~pipeline.kafka.outbox.Outbox.commit` calls it.
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from pipeline.kafka.membership import LineFence
from pipeline.kafka.ordering import OrderedOffsets

log = logging.getLogger(__name__)


async def commit_acknowledged(
    consumer: AIOKafkaConsumer,
    offsets: OrderedOffsets[Any],
    fence: LineFence,
    partitions: list[TopicPartition] | None = None,
) -> None:
    """Commit each partition (of ``partitions``; None: all) past its acknowledged outputs,
    where that moved since its last commit."""
    committable = offsets.committable()
    if partitions is not None:
        committable = {tp: o for tp, o in committable.items() if tp in partitions}
    if not committable:
        return
    if fence.closed():
        return  # a zombie commits nothing: the partitions' new owner does
    try:
        await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in committable.items()})
    except (CommitFailedError, IllegalStateError) as exc:
        # A rebalance took the partitions; their new owner replays from the last commit.
        log.warning("commit of %s skipped: %s", committable, exc)
        return
    except KafkaError as exc:
        log.warning("commit failed, will retry: %s", exc)
        return
    offsets.mark_committed(committable)
