"""Run a topology's stages in one process until told to stop.

One asyncio loop runs every selected stage (each its own consumer group, so a
stage scales out by starting more processes with ``--stage``), the health
endpoints and the metrics-topic publisher. SIGTERM/SIGINT set a stop event;
stages then hand over in-flight work and commit within their drain timeout.

Shutdown is bounded in any state (a Triton outage with batches waiting in the
retry loop included): each stage drains and closes within 95 % of the
topology's ``drain_timeout_s`` (:mod:`pipeline.runtime.stages`), and whatever
still runs at 100 % is cancelled; work not finished by then is left uncommitted,
so the partitions' next owner replays it. The process then exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipeline.kafka.clients import ensure_topics, make_producer
from pipeline.kafka.copartition import check_copartitioned
from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.snapshot import publish_snapshots
from pipeline.observability.tracing import start_tracing
from pipeline.runtime.fused_models import ensure_fused_models
from pipeline.runtime.health import DEFAULT_HOST, DEFAULT_PORT, HealthServer
from pipeline.runtime.lag import refresh_lag
from pipeline.runtime.stages import build_stages, record_limits
from pipeline.runtime.watchdog import Liveness, Watchdog
from pipeline.settings import Endpoints
from pipeline.topology.model import Topology
from workers.runtime.stream_stage import StreamStage, bounded

log = logging.getLogger(__name__)


_CLOSE_S = 2.0  # the snapshot producer's and the health server's own close bounds


@dataclass
class RunningProcess:
    """What a caller (CLI, tests) can observe of a running topology."""

    health_port: int | None = None
    stages: list[StreamStage] | None = None
    watchdog: Watchdog | None = field(default=None, repr=False)

    def ready(self) -> bool:
        return not self.not_ready()

    def not_ready(self) -> list[str]:
        """Why ``/readyz`` is 503: stages not consuming, stalled partitions (empty: ready)."""
        if not self.stages:
            return ["no stages started"]
        problems = [f"stage {s.io.stage}: not consuming" for s in self.stages if not s.ready]
        if self.watchdog is not None:
            problems += [stall.describe() for stall in self.watchdog.check()]
        return problems


async def run_topology(
    topology: Topology,
    endpoints: Endpoints,
    *,
    only_stages: Sequence[str] = (),
    stop: asyncio.Event | None = None,
    http_port: int | None = None,
    http_host: str = DEFAULT_HOST,
    on_ready: Callable[[RunningProcess], None] | None = None,
    install_signal_handlers: bool = True,
) -> None:
    """Create missing topics, start the stages and serve until ``stop`` (or a signal).

    Health and metrics listen on ``http_host`` (loopback by default) and ``http_port``
    (default: the topology's, else :data:`~pipeline.runtime.health.DEFAULT_PORT`; 0: any free port).
    """
    stop = stop or asyncio.Event()
    if install_signal_handlers:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    metrics = PipelineMetrics(topology=topology.name)
    state_topics = topology.state_topics()
    created = await ensure_topics(
        endpoints.kafka,
        [*topology.topics(), *state_topics],
        partitions=topology.kafka.partitions,
        replication_factor=topology.kafka.replication_factor,
        compacted=state_topics,
        # Topics take the largest record any stage of this topology accepts or produces.
        limits=record_limits(topology, endpoints.kafka),
        configs=topology.kafka.topic_settings(),
    )
    if created:
        log.info("created topics: %s", ", ".join(created))
    # Fused chains' ensembles: pushed and loaded before any stage checks its model.
    await asyncio.to_thread(ensure_fused_models, topology, endpoints, only_stages)
    tracing = start_tracing(f"pipeline.{topology.name}")  # OTEL_* variables; off unless asked for
    try:
        await _serve(
            topology, endpoints, metrics, stop, only_stages=only_stages,
            http_port=health_port(topology, http_port), http_host=http_host, on_ready=on_ready,
        )
    finally:
        tracing.shutdown(_CLOSE_S)  # the last spans (the drain's) leave before the exit


async def _serve(
    topology: Topology,
    endpoints: Endpoints,
    metrics: PipelineMetrics,
    stop: asyncio.Event,
    *,
    only_stages: Sequence[str],
    http_port: int,
    http_host: str,
    on_ready: Callable[[RunningProcess], None] | None,
) -> None:
    """Build and run the stages, health server and snapshots until ``stop`` or a failure."""
    stages = build_stages(topology, endpoints, metrics, only_stages)
    await check_copartitioned(endpoints.kafka, [s.copartitioned_topics() for s in stages])
    state = RunningProcess(stages=stages, watchdog=Watchdog(stages, metrics))
    watchdog = state.watchdog
    assert watchdog is not None
    liveness = Liveness(stop)
    health = HealthServer(
        metrics,
        state.not_ready,
        host=http_host,
        port=http_port,
        not_live=liveness.problems,
        before_scrape=watchdog.check,
    )
    state.health_port = await health.start()
    snapshot_producer = make_producer(endpoints.kafka)
    await snapshot_producer.start()
    try:
        # Each stage checks its model is ready (and warms it up) before it consumes.
        await asyncio.gather(*(stage.start() for stage in state.stages or []))
        if on_ready is not None:
            on_ready(state)
        log.debug("topology %s running (health on %s:%s)", topology.name, http_host, state.health_port)  # the summary says it
        tasks = [asyncio.create_task(stage.run(stop), name=stage.io.stage) for stage in state.stages or []]
        tasks.append(asyncio.create_task(watchdog.run(stop), name="watchdog"))
        tasks.append(asyncio.create_task(refresh_lag(state.stages or [], stop), name="consumer-lag"))
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
        liveness.watch(tasks)
        # One stage failing stops the process (all stages drain and commit first):
        # a supervisor restarts it, rather than it running on half-alive.
        await _until_stop_or_failure(stop, tasks)
        stop.set()
        await _bounded_shutdown(tasks, topology.drain_timeout_s, time.monotonic())
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("%s failed: %r", task.get_name(), result)
                raise result
    finally:
        stop.set()
        await bounded(snapshot_producer.stop(), _CLOSE_S, "metrics producer close")
        await bounded(health.stop(), _CLOSE_S, "health server close")


def health_port(topology: Topology, asked: int | None = None) -> int:
    """The port asked for (``--http-port``), else the topology's, else the stable default."""
    for port in (asked, topology.http_port):
        if port is not None:
            return port
    return DEFAULT_PORT


async def _until_stop_or_failure(stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> None:
    """Return when ``stop`` is set (a signal) or a task ends (normally only by failing)."""
    stopped = asyncio.create_task(stop.wait(), name="stop-signal")
    try:
        await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()


async def _bounded_shutdown(tasks: list[asyncio.Task[None]], bound_s: float, started: float) -> None:
    """Give the tasks until ``bound_s`` after ``started`` to finish; cancel the rest."""
    remaining = max(0.0, bound_s - (time.monotonic() - started))
    _, late = await asyncio.wait(tasks, timeout=remaining)
    if late:
        log.error(
            "still running %.0fs after the stop: %s; cancelled (their unfinished records stay uncommitted)",
            bound_s, ", ".join(sorted(t.get_name() for t in late)),
        )
        for task in late:
            task.cancel()
        await asyncio.wait(late, timeout=_CLOSE_S)
