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
from dataclasses import dataclass, replace

from pipeline.errors import ConfigError
from pipeline.kafka.clients import ensure_topics, make_producer
from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.snapshot import publish_snapshots
from pipeline.runtime.health import HealthServer
from pipeline.settings import Endpoints
from pipeline.topology.model import StatelessStage as StatelessStageConfig
from pipeline.topology.model import DaliStage as DaliStageConfig
from pipeline.topology.model import SequenceStage as SequenceStageConfig
from pipeline.topology.model import Topology
from workers.base import StageIO, StreamStage
from workers.dali import DaliAudioBackend
from workers.join import JoinStage
from workers.routing import TensorRouting
from workers.sequence import SequenceStage
from workers.stateless import BatchingSettings, BatchingStage, RetryPolicy
from workers.triton_backend import TritonModelBackend

log = logging.getLogger(__name__)


@dataclass
class RunningProcess:
    """What a caller (CLI, tests) can observe of a running topology."""

    health_port: int | None = None
    stages: list[StreamStage] | None = None

    def ready(self) -> bool:
        return bool(self.stages) and all(s.ready for s in self.stages or [])


def build_stages(
    topology: Topology, endpoints: Endpoints, metrics: PipelineMetrics, only: Sequence[str] = ()
) -> list[StreamStage]:
    """One runtime stage object per selected topology stage (all when ``only`` is empty),
    and per join of a graph."""
    if topology.is_graph:
        return _graph_stages(topology, endpoints, metrics, only)
    _check_selection(topology, [s.name for s in topology.stages], only)
    stages: list[StreamStage] = []
    for config, (input_topic, output_topic) in zip(topology.stages, topology.stage_topics(), strict=True):
        if only and config.name not in only:
            continue
        io = StageIO(
            stage=config.name,
            group_id=topology.group_id(config.name),
            input_topic=input_topic,
            output_topic=output_topic,
            dead_letter_topic=topology.dead_letter_topic,
            max_pending=(
                config.max_pending_requests
                if isinstance(config, SequenceStageConfig)
                else config.batching.max_pending_requests
            ),
            emit_requests=output_topic != topology.result_topic,
        )
        if isinstance(config, StatelessStageConfig):
            routing = TensorRouting(config.input_map, config.output_map)
            stages.append(_triton_stage(io, config, routing, endpoints, metrics))
        elif isinstance(config, DaliStageConfig):
            stages.append(
                BatchingStage(
                    io,
                    DaliAudioBackend(
                        input_tensor=config.input_tensor,
                        output_tensor=config.output_tensor,
                        target_rate=config.sample_rate,
                        device=config.device,
                        max_batch_size=config.batching.max_batch_size or 64,
                        max_chunk_seconds=config.max_chunk_seconds,
                    ),
                    _batching_settings(config),
                    kafka=endpoints.kafka,
                    metrics=metrics,
                )
            )
        elif isinstance(config, SequenceStageConfig):
            stages.append(
                SequenceStage(
                    io,
                    config,
                    state_topic=topology.state_topic(config.name),
                    kafka=endpoints.kafka,
                    triton=endpoints.triton,
                    metrics=metrics,
                )
            )
        else:
            raise ConfigError(f"stage {config.name!r}: kind {config.kind!r} is not supported by this version")
    return stages


def _graph_stages(
    topology: Topology, endpoints: Endpoints, metrics: PipelineMetrics, only: Sequence[str]
) -> list[StreamStage]:
    """Steps and joins of a graph topology, wired by the compiled graph's topics."""
    graph = topology.graph()
    _check_selection(topology, [*graph.order, *graph.joins], only)
    stages: list[StreamStage] = []
    for name in graph.order:
        if only and name not in only:
            continue
        node, config = graph.steps[name], topology.stage(name)
        assert isinstance(config, StatelessStageConfig)
        io = StageIO(
            stage=name,
            group_id=topology.group_id(name),
            input_topic=node.input_topic,
            output_topic=node.output_topic,
            dead_letter_topic=topology.dead_letter_topic,
            max_pending=config.batching.max_pending_requests,
            emit_requests=not node.to_result,
        )
        routing = TensorRouting(
            config.input_map,
            config.output_map,
            carry=True,
            select=topology.outputs if node.to_result else None,
        )
        stages.append(_triton_stage(io, config, routing, endpoints, metrics))
    for name, join in graph.joins.items():
        if only and name not in only:
            continue
        io = StageIO(
            stage=name,
            group_id=topology.group_id(name),
            input_topic=join.input_topics[0],
            more_input_topics=join.input_topics[1:],
            output_topic=join.output_topic,
            dead_letter_topic=topology.dead_letter_topic,
        )
        stages.append(
            JoinStage(
                io,
                join,
                state_topic=f"{topology.name}.{name}.state",
                to_result=join.feeds == "result",
                select=topology.outputs if join.feeds == "result" else None,
                kafka=endpoints.kafka,
                metrics=metrics,
            )
        )
    return stages


def _triton_stage(
    io: StageIO,
    config: StatelessStageConfig,
    routing: TensorRouting,
    endpoints: Endpoints,
    metrics: PipelineMetrics,
) -> BatchingStage:
    """A stateless stage batching into its Triton model (chains and graph steps alike)."""
    return BatchingStage(
        io,
        TritonModelBackend(endpoints.triton, config.model, config.model_version),
        _batching_settings(config),
        kafka=endpoints.kafka,
        metrics=metrics,
        warmup=config.warmup,
        routing=routing,
    )


def _check_selection(topology: Topology, names: list[str], only: Sequence[str]) -> None:
    unknown = [name for name in only if name not in names]
    if unknown:
        raise ConfigError(
            f"topology {topology.name!r} has no stage {', '.join(map(repr, unknown))} (stages: {', '.join(names)})"
        )


def _batching_settings(config: StatelessStageConfig | DaliStageConfig) -> BatchingSettings:
    b = config.batching
    settings = BatchingSettings(
        max_batch_size=b.max_batch_size,
        max_queue_delay_s=b.max_queue_delay_ms / 1000,
        max_inflight_batches=b.max_inflight_batches,
        max_request_bytes=config.max_request_bytes,
    )
    if isinstance(config, DaliStageConfig):
        return settings
    return replace(
        settings,
        default_deadline_ms=None if config.deadline_ms is None else int(config.deadline_ms),
        default_priority=config.priority,
        default_timeout_ms=None if config.timeout_ms is None else int(config.timeout_ms),
        retry=RetryPolicy(
            max_attempts=config.retry.max_attempts,
            initial_backoff_s=config.retry.initial_backoff_ms / 1000,
            max_backoff_s=config.retry.max_backoff_ms / 1000,
        ),
    )


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
