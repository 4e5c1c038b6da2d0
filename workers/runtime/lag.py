"""Consumer lag of one stage: per partition, and its sum for the stage's consumer group.

Lag is the number of records between the consumer's position and the partition's
end (high watermark). It is observed cheaply after every fetch (the fetch
response carries the high watermark), and refreshed from the brokers' end
offsets every few seconds (:meth:`ConsumerLag.refresh`), because a paused or
starved consumer fetches nothing, which is exactly when its lag grows.

``pipeline_consumer_group_lag{group}`` sums the partitions this process holds;
a group spread over several processes is ``sum by (group)`` in Prometheus (each
partition is held by one member). Partitions handed away are dropped from both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from pipeline.observability.metrics import PipelineMetrics

log = logging.getLogger(__name__)

_POSITION_TIMEOUT_S = 1.0  # a partition still resetting its position is skipped this round


class ConsumerLag:
    """The lag gauges of one stage's consumer."""

    def __init__(self, stage: str, group: str, metrics: PipelineMetrics) -> None:
        self._stage = stage
        self._partition_gauge = metrics.consumer_lag
        self._group_gauge = metrics.consumer_group_lag.labels(stage, group)
        self._lags: dict[TopicPartition, int] = {}

    def observe(self, consumer: AIOKafkaConsumer, tp: TopicPartition, last_offset: int) -> None:
        """After a fetch: records between the last one fetched and the partition's end."""
        high = consumer.highwater(tp)
        if high is not None:
            self._set(tp, max(0, high - (last_offset + 1)))

    async def refresh(self, consumer: AIOKafkaConsumer, held: Collection[TopicPartition]) -> None:
        """Ask the brokers for the end of every partition ``held``; forget the others."""
        for tp in set(self._lags) - set(held):
            del self._lags[tp]
            with contextlib.suppress(KeyError):
                self._partition_gauge.remove(self._stage, tp.topic, str(tp.partition))
        try:
            ends = await consumer.end_offsets(list(held)) if held else {}
            for tp, end in ends.items():
                position = await asyncio.wait_for(consumer.position(tp), _POSITION_TIMEOUT_S)
                self._set(tp, max(0, end - position))
        except (KafkaError, asyncio.TimeoutError) as exc:  # a rebalance or a broker away: next round
            log.debug("%s: lag not refreshed: %r", self._stage, exc)
        self._group_gauge.set(sum(self._lags.values()))

    def _set(self, tp: TopicPartition, lag: int) -> None:
        self._lags[tp] = lag
        self._partition_gauge.labels(self._stage, tp.topic, str(tp.partition)).set(lag)
        self._group_gauge.set(sum(self._lags.values()))
