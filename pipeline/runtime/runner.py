"""Run a topology's stages in one process until told to stop.

One asyncio loop runs every selected stage (each its own consumer group, so a
stage scales out by starting more processes with ``--stage``), the health
endpoints and the metrics-topic publisher. SIGTERM/SIGINT set a stop event;
stages then hand over in-flight work and commit within their drain timeout.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.kafka.clients import ensure_topics, make_producer
from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.snapshot import publish_snapshots
from pipeline.runtime.health import HealthServer
from pipeline.runtime.stages import build_stages
from pipeline.settings import Endpoints
from pipeline.topology.model import Topology
from workers.base import StreamStage

log = logging.getLogger(__name__)


@dataclass
class RunningProcess:
    """What a caller (CLI, tests) can observe of a running topology."""

    health_port: int | None = None
    stages: list[StreamStage] | None = None

    def ready(self) -> bool:
        return bool(self.stages) and all(s.ready for s in self.stages or [])


async def run_topology(
    topology: Topology,
    endpoints: Endpoints,
    *,
    only_stages: Sequence[str] = (),
    stop: asyncio.Event | None = None,
    http_port: int | None = None,
    on_ready: Callable[[RunningProcess], None] | None = None,
    install_signal_handlers: bool = True,
) -> None:
    """Create missing topics, start the stages and serve until ``stop`` (or a signal)."""
    stop = stop or asyncio.Event()
    if install_signal_handlers:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    metrics = PipelineMetrics()
    state_topics = topology.state_topics()
    created = await ensure_topics(
        endpoints.kafka,
        [*topology.topics(), *state_topics],
        partitions=topology.kafka.partitions,
        replication_factor=topology.kafka.replication_factor,
        compacted=state_topics,
    )
    if created:
        log.info("created topics: %s", ", ".join(created))
    state = RunningProcess(stages=build_stages(topology, endpoints, metrics, only_stages))
    health = HealthServer(metrics, state.ready, port=topology.http_port if http_port is None else http_port)
    state.health_port = await health.start()
    snapshot_producer = make_producer(endpoints.kafka)
    await snapshot_producer.start()
    try:
        # Each stage checks its model is ready (and warms it up) before it consumes.
        await asyncio.gather(*(stage.start() for stage in state.stages or []))
        if on_ready is not None:
            on_ready(state)
        log.info("topology %s running (health on :%s)", topology.name, state.health_port)
        tasks = [asyncio.create_task(stage.run(stop), name=stage.io.stage) for stage in state.stages or []]
        tasks.append(
            asyncio.create_task(
                publish_snapshots(
                    snapshot_producer,
                    topology.metrics_topic,
                    metrics,
                    topology=topology.name,
                    interval_s=topology.metrics_interval_s,
                    stop=stop,
                ),
                name="metrics-snapshots",
            )
        )
        # One stage failing stops the process (all stages drain and commit first):
        # a supervisor restarts it, rather than it running on half-alive.
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        stop.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("%s failed: %r", task.get_name(), result)
                raise result
    finally:
        stop.set()
        await snapshot_producer.stop()
        await health.stop()
