"""Priority lanes end to end: high-lane requests overtake a backlog on the default lane.

Real broker, real Triton, `pipeline run` in a subprocess on a dense_classifier topology
with a `high` lane (as topologies/lanes.yaml). 50,000 requests wait on the input topic
before the stage starts; while the stage serves them, 200 requests go to the high lane.
Every one of those is answered within a stated bound, before the backlog is finished,
and every backlog request still gets its one result, in its partition's order.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from pipeline.client import Client
from pipeline.contract.records import Record
from pipeline.contract.request import encode_request
from pipeline.errors import ConfigError
from pipeline.kafka.clients import ensure_topics
from pipeline.settings import KafkaSettings
from tests.helpers.cli import assert_one_line_error, ok, run_cli
from tests.helpers.dense_reference import random_features
from tests.helpers.figures import FaultFigures, report
from tests.helpers.kafka_io import collect, produce
from tests.helpers.topology_process import TopologyFiles, pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow, pytest.mark.exclusive]  # measures time: alone

BACKLOG = 50_000
HIGH = 200
HIGH_RATE = 100.0  # per second: the 200 arrive over 2 s while the backlog is served
HIGH_BOUND_S = 5.0
"""Every high-lane request answered within this (send to result on the result topic).
Measured on the project's 2-core machine (the figures this test prints), with the stage
holding up to 1,024 default-lane records (a high request waits behind those): p50 0.4 s,
max 0.6 s on a quiet machine; p50 0.7 s, max 1.2 s with other test runs beside it. Four
times the worst seen leaves room for a loaded CI machine and is still well under the time
the backlog itself takes (10 to 18 s), which the overtaking assertion checks as well."""
PENDING = 1024


def _lanes_topology(tmp_path: Path) -> TopologyFiles:
    return write_topology(
        tmp_path,
        stage={"batching": {"max_queue_delay_ms": 5.0, "max_inflight_batches": 4, "max_pending_requests": PENDING}},
        extra={"lanes": [{"name": "high", "priority": 1}]},
    )


def _records(prefix: str, n: int, seed: int) -> list[Record]:
    features = random_features(n, seed)
    return [encode_request({"features": features[i : i + 1]}, correlation_id=f"{prefix}-{i}") for i in range(n)]


async def _serve_and_overtake(
    bootstrap: str, topo: TopologyFiles, high_topic: str
) -> tuple[dict[str, float], dict[str, float], dict[str, float], list[tuple[int, str]]]:
    """Send the high lane's requests while the backlog is served; read the result topic
    until every request has its result. Returns send times, result times (monotonic, by
    correlation id), and the results in topic order as (partition, id)."""
    consumer = AIOKafkaConsumer(
        topo.result_topic, topo.dead_letter_topic, bootstrap_servers=bootstrap,
        auto_offset_reset="earliest", group_id=None, enable_auto_commit=False,
    )
    await consumer.start()
    sent: dict[str, float] = {}
    answered: dict[str, float] = {}
    dead: dict[str, float] = {}
    order: list[tuple[int, str]] = []
    started = asyncio.Event()

    async def read() -> None:
        deadline = time.monotonic() + 600
        while len(answered) + len(dead) < BACKLOG + HIGH and time.monotonic() < deadline:
            for part in (await consumer.getmany(timeout_ms=100)).values():
                now = time.monotonic()
                for record in part:
                    cid = record.key.decode()
                    (dead if record.topic == topo.dead_letter_topic else answered)[cid] = now
                    if record.topic == topo.result_topic:
                        order.append((record.partition, cid))
                if len(answered) >= 1000:
                    started.set()  # the backlog is being served

    async def send_high() -> None:
        await started.wait()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
        await producer.start()
        try:
            deliveries = []
            begin = time.monotonic()
            for i, record in enumerate(_records("high", HIGH, seed=2)):
                await asyncio.sleep(max(0.0, begin + i / HIGH_RATE - time.monotonic()))
                sent[f"high-{i}"] = time.monotonic()
                deliveries.append(await producer.send(high_topic, record.value, key=record.key, headers=record.headers))
            await asyncio.gather(*deliveries)
        finally:
            await producer.stop()

    try:
        await asyncio.gather(read(), send_high())
    finally:
        await consumer.stop()
    return sent, answered, dead, order


def test_high_lane_overtakes_a_50k_backlog_and_nothing_is_lost(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = _lanes_topology(tmp_path)
    high_topic = f"{topo.input_topic}.lane.high"
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    asyncio.run(ensure_topics(settings, [topo.input_topic, high_topic, topo.result_topic], partitions=4))
    backlog = _records("bulk", BACKLOG, seed=1)
    asyncio.run(produce(kafka_bootstrap, topo.input_topic, backlog))

    with pipeline_process(topo, cli_env, tmp_path) as worker:
        sent, answered, dead, order = asyncio.run(_serve_and_overtake(kafka_bootstrap, topo, high_topic))
        by_lane = {
            lane: worker.metric("pipeline_lane_requests_total", stage="classify", lane=lane)
            for lane in ("high", "default")
        }
        lag_topics = {
            topic: worker.metric("pipeline_consumer_lag", stage="classify", topic=topic)
            for topic in (topo.input_topic, high_topic)
        }
        assert worker.terminate(timeout=60) == 0, worker.log()

    assert dead == {}, f"dead letters: {list(dead)[:5]}"
    high_ids = [f"high-{i}" for i in range(HIGH)]
    bulk_ids = [f"bulk-{i}" for i in range(BACKLOG)]
    missing = [cid for cid in [*high_ids, *bulk_ids] if cid not in answered]
    assert missing == [], f"{len(missing)} requests without a result, e.g. {missing[:5]}"
    assert len(order) == BACKLOG + HIGH, "a request answered more than once"

    latencies = np.array([answered[cid] - sent[cid] for cid in high_ids])
    p50, p99, worst = np.percentile(latencies, 50), np.percentile(latencies, 99), latencies.max()
    last_high = max(answered[cid] for cid in high_ids)
    bulk_done_then = sum(1 for cid in bulk_ids if answered[cid] <= last_high)
    bulk_drain_s = max(answered[cid] for cid in bulk_ids) - min(answered[cid] for cid in bulk_ids)
    report(
        FaultFigures(
            scenario="priority lanes: 200 high requests during a 50k backlog",
            topology="dense",
            sent=BACKLOG + HIGH,
            results=len(order),
            duplicates=0,
            exact_duplicates=True,
            dead_letters=len(dead),
            lost=len(missing),
            note=(
                f"high send->result p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {worst * 1000:.0f} ms "
                f"(bound {HIGH_BOUND_S:.0f} s); backlog answered when the last high one was: "
                f"{bulk_done_then}/{BACKLOG}; backlog served in {bulk_drain_s:.1f} s"
            ),
        )
    )
    assert worst <= HIGH_BOUND_S, f"a high-lane request took {worst:.2f} s (p50 {p50:.3f}, p99 {p99:.3f})"
    # Overtaking: the high lane was done while most of the backlog was still waiting.
    assert bulk_done_then < BACKLOG * 0.9, f"{bulk_done_then} of the backlog were answered before the high lane"

    # Order within the default lane: each partition's backlog results in produce order.
    produced: dict[int, list[str]] = defaultdict(list)
    requests = asyncio.run(
        collect(kafka_bootstrap, [topo.input_topic], done=lambda rs: len(rs) >= BACKLOG, timeout=120)
    ).records
    for record in requests:
        produced[record.partition].append(record.key.decode())
    results: dict[int, list[str]] = defaultdict(list)
    for partition, cid in order:
        if cid.startswith("bulk-"):
            results[partition].append(cid)
    assert results == produced

    assert by_lane == {"high": HIGH, "default": BACKLOG}
    assert lag_topics == {topo.input_topic: 0, high_topic: 0}


def test_client_and_produce_pick_the_lane_and_refuse_an_unknown_one(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    topo = _lanes_topology(tmp_path)
    high_topic = f"{topo.input_topic}.lane.high"

    refused = run_cli(cli_env, "produce", "--topology", str(topo.path), "--lane", "nosuch", "--random")
    assert_one_line_error(refused, "no lane 'nosuch' in this topology (lanes: high, default)")

    with pipeline_process(topo, cli_env, tmp_path) as worker:
        ok(run_cli(cli_env, "produce", "--topology", str(topo.path), "--lane", "high", "--random", "--count", "3"))

        async def call() -> None:
            async with Client(topo.path, kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap), timeout=60) as client:
                result = await client.infer({"features": random_features(1, 3)}, lane="high")
                assert result.outputs["logits"].shape == (1, 4)
                with pytest.raises(ConfigError, match=r"^no lane 'nosuch' in this topology \(lanes: high, default\)$"):
                    await client.infer({"features": random_features(1, 3)}, lane="nosuch")
                await client.infer({"features": random_features(1, 4)})  # the default lane

        asyncio.run(call())
        assert worker.metric("pipeline_lane_requests_total", lane="high") == 4
        assert worker.metric("pipeline_lane_requests_total", lane="default") == 1
        assert worker.terminate(timeout=60) == 0, worker.log()

    on_high = asyncio.run(collect(kafka_bootstrap, [high_topic], done=lambda rs: len(rs) >= 4, timeout=30)).records
    assert len(on_high) == 4
