"""Consumer lag bookkeeping: per partition, the group's sum, partitions handed away forgotten.

What the brokers answer is stood in by a plain object with the three consumer calls
the lag reads (``highwater``, ``end_offsets``, ``position``); the real consumer and
broker are exercised by ``tests/integration/test_prometheus_scrape.py``.
"""

from __future__ import annotations

from typing import cast

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from pipeline.observability.metrics import PipelineMetrics
from workers.runtime.lag import ConsumerLag

TP0, TP1 = TopicPartition("in", 0), TopicPartition("in", 1)


class _Brokers:
    def __init__(self, ends: dict[TopicPartition, int], positions: dict[TopicPartition, int]) -> None:
        self.ends, self.positions = ends, positions

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.ends.get(tp)

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.ends[tp] for tp in partitions}

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]


def _samples(metrics: PipelineMetrics, name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(s.labels.values()): s.value for family in metrics.registry.collect() if family.name == name
        for s in family.samples
    }


async def test_refresh_reads_the_ends_sums_the_group_and_forgets_revoked_partitions() -> None:
    metrics = PipelineMetrics()
    lag = ConsumerLag("classify", "t.classify", metrics)
    assert _samples(metrics, "pipeline_consumer_group_lag") == {("classify", "t.classify"): 0.0}
    brokers = _Brokers({TP0: 100, TP1: 50}, {TP0: 40, TP1: 50})
    consumer = cast(AIOKafkaConsumer, brokers)
    await lag.refresh(consumer, {TP0, TP1})  # a paused consumer fetches nothing: the ends still move
    assert _samples(metrics, "pipeline_consumer_lag") == {("classify", "in", "0"): 60.0, ("classify", "in", "1"): 0.0}
    assert _samples(metrics, "pipeline_consumer_group_lag") == {("classify", "t.classify"): 60.0}
    lag.observe(consumer, TP1, 39)  # a fetch ending at offset 39 of 50
    assert _samples(metrics, "pipeline_consumer_group_lag") == {("classify", "t.classify"): 70.0}
    await lag.refresh(consumer, {TP1})  # partition 0 handed away
    assert _samples(metrics, "pipeline_consumer_lag") == {("classify", "in", "1"): 0.0}
    assert _samples(metrics, "pipeline_consumer_group_lag") == {("classify", "t.classify"): 0.0}
