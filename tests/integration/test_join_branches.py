"""Issue 28 on the real stack: a join judges its branches by progress, never by a clock.

- A branch stage restarted into its group (a slow rejoin: on the embedded broker the new
  member waits for the old one's session) while a backlog is waiting: the join holds
  every window until the branch delivers, 0 expired.
- A branch whose stage is gone (its group has no live member) still gets its windows
  expired, only after ``branch_gone_after``, and the dead letters name the rule.

The embedded broker (Tansu) keeps a stopped member listed in DescribeGroups, so "gone"
is staged here as a branch stage that is not running at all (its group never had a
member); on Apache Kafka a stage stopped for good leaves its group and reads the same.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.contract.records import Record, read_dead_letter
from pipeline.contract.request import encode_request
from tests.helpers.dense_reference import random_features
from tests.helpers.kafka_io import collect, produce
from tests.helpers.topology_process import (
    PipelineProcess,
    collect_outputs,
    distinct_keys,
    pipeline_process,
    write_ensemble_topology,
)

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

ALL_BUT_SCORE = ["normalise", "classify", "join-result"]


def _requests(n: int, prefix: str) -> list[Record]:
    raw = random_features(n, 28)
    return [encode_request({"raw": raw[i : i + 1]}, correlation_id=f"{prefix}-{i}") for i in range(n)]


def test_a_branch_restarted_into_its_group_during_a_backlog_expires_nothing(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    n = 2000
    topo = write_ensemble_topology(tmp_path, window_ms=1000)
    with pipeline_process(topo, cli_env, tmp_path, stage=ALL_BUT_SCORE) as main:
        first = PipelineProcess(topo, cli_env, tmp_path / "score-1.log", stage="score").start()
        assert first.terminate() == 0, first.log()  # its member stays listed: the next one's join is slow
        started = time.monotonic()
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, _requests(n, "rejoin")))
        with pipeline_process(topo, cli_env, tmp_path, stage="score") as score:
            rejoined_s = time.monotonic() - started
            out = collect_outputs(kafka_bootstrap, topo, distinct_keys(n), timeout=120)
            assert score.metric("pipeline_results_total") > 0
        expired = main.metric("pipeline_join_expiries_total")
        behind_seen = main.metric("pipeline_upstream_state", branch="score", state="behind")
        assert main.terminate() == 0, main.log()
    dead = out.on(topo.dead_letter_topic)
    assert dead == [], [read_dead_letter(d.headers).reason for d in dead[:3]]
    assert expired == 0
    assert len({r.key for r in out.on(topo.result_topic)}) == n
    print(f"rejoin during a backlog: score ready after {rejoined_s:.1f} s, {n} joined, 0 expired (gauge now behind={behind_seen:g})")


def test_a_branch_that_is_gone_has_its_windows_expired_after_branch_gone_after(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    n, gone_after_s = 20, 6.0
    topo = write_ensemble_topology(tmp_path, window_ms=1000, branch_gone_after=f"{gone_after_s:g}s")
    with pipeline_process(topo, cli_env, tmp_path, stage=ALL_BUT_SCORE) as main:
        started_ms = int(time.time() * 1000)
        asyncio.run(produce(kafka_bootstrap, topo.input_topic, _requests(n, "gone")))
        out = asyncio.run(collect(kafka_bootstrap, [topo.dead_letter_topic], done=lambda rs: len(rs) >= n, timeout=60))
        gauge: dict[str, Any] = {s: main.metric("pipeline_upstream_state", branch="score", state=s) for s in ("gone", "behind")}
        expired = main.metric("pipeline_join_expiries_total", rule="gone")
        assert main.terminate() == 0, main.log()
        reasons = [read_dead_letter(r.headers).reason for r in out.records]
        assert len(reasons) == n, main.log()
    assert all(
        "missing score (have classify); rule: score gone (its group had no live member for 6 s)" in r for r in reasons
    ), reasons[:3]
    first_ms = min(r.timestamp for r in out.records)
    assert first_ms - started_ms >= gone_after_s * 1000, "no window closed before branch_gone_after"
    assert expired == n and gauge == {"gone": 1.0, "behind": 0.0}


async def test_a_partitions_end_is_read_from_a_fetch_answer_where_list_offsets_answers_short(kafka_bootstrap: str) -> None:
    """Tansu 0.6 answers ListOffsets below the end of its log, even on a topic nobody writes
    any more; the progress poll reads the ends a fetch reports, so no group looks caught up
    with records left (the backlog test's expired windows)."""
    import uuid

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.client import AIOKafkaClient
    from aiokafka.structs import TopicPartition

    from pipeline.kafka.progress import fetched_ends
    from tests.helpers.kafka_io import create_topic

    topic = f"ends-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_bootstrap, topic, 4)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = [await producer.send(topic, b"x" * 300, key=str(i).encode()) for i in range(20_000)]
        acked: dict[int, int] = {}
        for metadata in await asyncio.gather(*sent):
            acked[metadata.partition] = max(acked.get(metadata.partition, 0), metadata.offset + 1)
    finally:
        await producer.stop()
    tps = [TopicPartition(topic, p) for p in range(4)]
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
    client = AIOKafkaClient(bootstrap_servers=kafka_bootstrap)
    await consumer.start()
    await client.bootstrap()
    try:
        listed = await consumer.end_offsets(tps)
        ends = await fetched_ends(client, listed)
    finally:
        await consumer.stop()
        await client.close()
    short = {tp.partition: acked[tp.partition] - listed[tp] for tp in tps if listed[tp] < acked[tp.partition]}
    print(f"\nListOffsets short of the acknowledged end by {short or 'nothing'} records")
    assert {tp.partition: ends[tp] for tp in tps} == acked


async def test_a_groups_position_is_the_oldest_stamp_it_has_left(kafka_bootstrap: str) -> None:
    """Issue 28: a behind branch is judged by the timestamp of the oldest record its groups
    have left, read from the broker from each group's start offset to the end. Two groups on
    one partition (a fan-out) at different offsets each get their own; a partition whose
    later records are older (a redone request appended after newer ones) answers with the
    older stamp, not the one at the committed offset; records added later are read too."""
    import uuid

    from aiokafka import AIOKafkaProducer
    from aiokafka.client import AIOKafkaClient
    from aiokafka.structs import TopicPartition

    from pipeline.kafka.partition_reads import OldestLeft
    from tests.helpers.kafka_io import create_topic

    topic = f"stamps-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_bootstrap, topic, 3)
    base = 1_700_000_000_000
    p0, p1, p2 = (TopicPartition(topic, p) for p in range(3))

    async def send(partition: int, stamps: list[int]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
        await producer.start()
        try:
            await asyncio.gather(*[await producer.send(topic, b"x", partition=partition, timestamp_ms=t) for t in stamps])
        finally:
            await producer.stop()

    for partition in (0, 1):
        await send(partition, [base + 1_000 * partition + i for i in range(500)])
    # p2: in time order up to 300, then requests redone 6 s older than the record at 300.
    await send(2, [base + 10_000 + i for i in range(300)] + [base + 4_000 + i for i in range(5)])
    reads = OldestLeft(partition_bytes=4 << 10)  # small reads: several rounds, and a second poll
    client = AIOKafkaClient(bootstrap_servers=kafka_bootstrap)
    await client.bootstrap()
    try:
        starts = {("fast", p0): 420, ("slow", p0): 17, ("slow", p1): 0, ("done", p1): 500, ("score", p2): 290}
        ends = {p0: 500, p1: 500, p2: 305}
        stamps = await reads.oldest(client, starts, ends)
        for _ in range(10):  # what one poll's rounds did not reach, the next ones read
            if all(v is not None for k, v in stamps.items() if k != ("done", p1)):
                break
            stamps = await reads.oldest(client, starts, ends)
        assert stamps == {
            ("fast", p0): base + 420,
            ("slow", p0): base + 17,
            ("slow", p1): base + 1_000,
            ("done", p1): None,
            ("score", p2): base + 4_000,
        }
        await send(2, [base + 3_000])  # one more, older still: read on the next poll
        stamps = await reads.oldest(client, {("score", p2): 303}, {p2: 306})
        assert stamps == {("score", p2): base + 3_000}
        stamps = await reads.oldest(client, {("score", p2): 305}, {p2: 306})
        assert stamps == {("score", p2): base + 3_000}
    finally:
        await client.close()
