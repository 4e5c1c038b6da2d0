"""Check that topics which must be co-partitioned are.

A stateful stage keeps the state of input partition ``p`` in partition ``p`` of
its state topic, and a join reads partition ``p`` of every branch topic on one
worker. Both silently go wrong when the partition counts differ (a state topic
created by hand, or auto-created by the broker with its default count): restore
would read another partition's keys. So the runtime checks at start and refuses
to run with a one-line error instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from aiokafka.admin import AIOKafkaAdminClient

from pipeline.errors import ConfigError
from pipeline.settings import KafkaSettings


async def partition_counts(settings: KafkaSettings, topics: Iterable[str]) -> dict[str, int]:
    """The number of partitions of each topic (topics that do not exist are left out)."""
    wanted = list(dict.fromkeys(topics))
    admin = AIOKafkaAdminClient(**settings.client_kwargs(), request_timeout_ms=15_000)
    await admin.start()
    try:
        described = await admin.describe_topics(wanted)
    finally:
        await admin.close()
    return {t["topic"]: len(t["partitions"]) for t in described if t.get("partitions")}


async def check_copartitioned(settings: KafkaSettings, groups: Sequence[Sequence[str]]) -> None:
    """Each group of topics must have one partition count; ConfigError naming them if not."""
    counts = await partition_counts(settings, (t for group in groups for t in group))
    for group in groups:
        found = {t: counts[t] for t in group if t in counts}
        if len(set(found.values())) > 1:
            listed = ", ".join(f"{t} has {n}" for t, n in found.items())
            raise ConfigError(f"topics that must be co-partitioned differ in partition count: {listed}")
