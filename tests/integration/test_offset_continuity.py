"""A stage never moves past an offset the broker skipped (issue 25).

Sixteen producers write one partition at once, the way the embedded broker (Tansu 0.6.0)
sometimes answers a fetch at offset X from X+1, while a real stage runtime tails it and
echoes each record. Its output must equal its input record by record: nothing lost,
nothing twice, in offset order. Every skip the broker made is counted as
``pipeline_offsets_skipped_total`` and fetched again.

It runs on Tansu whichever broker the session uses (``tansu_bootstrap``): Apache Kafka
answers no fetch past a record, so there the guard would have nothing to catch.

``PIPELINE_TEST_OFFSET_GUARD=off`` runs the same test without the guard (aiokafka's own
unpacking): it then fails with the records the stage never received (figures in
docs/streaming.md, "Offsets the broker skips").
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from pipeline.kafka import continuity
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import KafkaSettings
from tests.helpers.kafka_io import collect, header
from tests.helpers.offset_continuity import echo_stage, guard_enabled, offset_guard, produce_concurrently

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PRODUCERS = 16
RATE_PER_S = 31.0  # per producer: eight real-time audio streams' chunk rate, twice over
DURATION_S = 15.0


async def test_a_stage_gets_every_record_of_a_partition_many_producers_write(tansu_bootstrap: str) -> None:
    topic = f"continuity-{uuid.uuid4().hex[:8]}"
    output = f"{topic}.out"
    admin = AIOKafkaAdminClient(bootstrap_servers=tansu_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1), NewTopic(output, 1, 1)])
    finally:
        await admin.close()

    metrics = PipelineMetrics()
    detections_before = continuity.DETECTIONS.total
    with offset_guard(guard_enabled()):
        stage = echo_stage(KafkaSettings(bootstrap_servers=tansu_bootstrap), topic, output, metrics)
        stop = asyncio.Event()
        running = asyncio.create_task(stage.run(stop))
        try:
            traffic = await produce_concurrently(
                tansu_bootstrap, topic, producers=PRODUCERS, partitions=1, rate_per_s=RATE_PER_S, duration_s=DURATION_S
            )
            written = traffic.written[0]
            started = time.monotonic()
            echoed = await collect(tansu_bootstrap, [output], done=lambda rs: len(rs) >= len(written), timeout=30)
            # Anything the stage had not received by now it never will: give it a last second.
            if len(echoed.records) < len(written):
                echoed = await collect(tansu_bootstrap, [output], done=lambda rs: len(rs) >= len(written), timeout=1)
        finally:
            stop.set()
            await asyncio.wait_for(running, 30)
    detections = continuity.DETECTIONS.total - detections_before
    counted = sum(
        sample.value
        for family in metrics.registry.collect()
        if family.name == "pipeline_offsets_skipped"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("topic") == topic
    )
    offsets = [int(header(r, "source-offset") or -1) for r in echoed.records]
    missing = sorted(set(range(len(written))) - set(offsets))
    print(
        f"\noffset continuity: {PRODUCERS} producers on one partition for {DURATION_S:g}s, {len(written)} records, "
        f"echoed {len(echoed.records)} (in {time.monotonic() - started:.1f}s after the last send), "
        f"broker skips caught {detections} (pipeline_offsets_skipped_total {counted:g}), missing {missing[:10]}"
    )
    assert missing == [], f"the stage never received offsets {missing[:20]} of {len(written)}"
    assert offsets == list(range(len(written))), "outputs out of order or duplicated"
    assert [r.value for r in echoed.records] == written, "an output differs from its input"
    assert counted == detections, "every skip the stage's fetches caught is counted"
