"""Periodic metrics snapshots on a Kafka topic.

Prometheus scrapes the process; the snapshot topic lets stream consumers
(dashboards, autoscalers, other pipelines) read the same numbers with a plain
Kafka client. One JSON record per process per interval, keyed by process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from pipeline.observability.metrics import PipelineMetrics

log = logging.getLogger(__name__)


def process_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def publish_snapshots(
    producer: AIOKafkaProducer,
    topic: str,
    metrics: PipelineMetrics,
    *,
    topology: str,
    interval_s: float,
    stop: asyncio.Event,
) -> None:
    """Send a snapshot every ``interval_s`` and a last one at ``stop``."""
    key = process_id().encode()
    while True:
        stopping = stop.is_set()
        payload = {
            "topology": topology,
            "process": process_id(),
            "timestamp_ms": int(time.time() * 1000),
            "metrics": metrics.snapshot(),
        }
        try:
            await producer.send_and_wait(
                topic, json.dumps(payload).encode(), key=key, headers=[("content-type", b"application/json")]
            )
        except KafkaError as exc:
            log.warning("metrics snapshot not sent: %s", exc)
        if stopping:
            return
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except asyncio.TimeoutError:
            pass
