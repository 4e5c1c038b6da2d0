"""The stage registry: from a topology's stage kind to a running stage object.

``STAGE_BUILDERS`` maps each ``kind`` of the topology file (``stateless``,
``dali``, ``sequence``) to a builder; graph topologies add their joins. Each
builder turns the validated topology configuration (pydantic) into the stage's
own plain settings (dataclasses), so the stages never see the topology model
and a new kind is one builder plus one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from pipeline.contract.reply import reply_prefix
from pipeline.contract.request import DEFAULT_MAX_VALUE_BYTES
from pipeline.deadletter.claim_check import ClaimCheckStore
from pipeline.errors import ConfigError
from pipeline.extras import DALI, require
from pipeline.failure_policy import RetryPolicy
from pipeline.kafka.clients import RecordLimits
from pipeline.kafka.progress import Upstream
from pipeline.observability.metrics import PipelineMetrics
from pipeline.runtime.tenant_settings import tenancy_settings, with_delay_topic
from pipeline.runtime.traffic import shadow_mirror, stateless_backend
from pipeline.settings import Endpoints, KafkaSettings
from pipeline.topology.graph import JoinNode
from pipeline.topology.model import (
    DaliStageConfig,
    RetryConfig,
    SequenceStageConfig,
    Stage,
    StatelessStageConfig,
    Topology,
)
from workers.join.stage import JoinSettings, JoinStage
from workers.runtime.stage_io import StageIO
from workers.runtime.stream_stage import StreamStage
from workers.sequence import SequenceSettings, SequenceStage
from workers.sequence.checkpoints import CheckpointPolicy
from workers.sequence.postprocess import VadSettings
from workers.stateless.dali import DaliAudioBackend, DaliSettings
from workers.stateless.features import FeatureParts
from workers.stateless.fleet_backend import FleetBackend
from workers.stateless.padding import Padder
from workers.stateless.stage import BatchingSettings, BatchingStage
from workers.stateless.tenancy.stage import TenantBatchingStage
from workers.stateless.tensor_map import TensorMap
from workers.stateless.triton_backend import TritonModelBackend


@dataclass(frozen=True)
class BuildContext:
    """What every builder gets besides the stage's own configuration."""

    topology: Topology
    endpoints: Endpoints
    metrics: PipelineMetrics
    io: StageIO


def build_stateless(ctx: BuildContext, config: Stage, tensor_map: TensorMap | None = None) -> StreamStage:
    """A stateless stage batching into its Triton model, or its routes' models (chains and
    graph steps alike), with its shadow when it has one (:mod:`pipeline.runtime.traffic`)."""
    assert isinstance(config, StatelessStageConfig)
    tensor_map = tensor_map or TensorMap(config.input_map, config.output_map)
    backend, assign_route = stateless_backend(ctx.endpoints.triton, config, ctx.io.stage, ctx.metrics)
    padder = None
    if config.padding is not None:
        assert isinstance(backend, (TritonModelBackend, FleetBackend))  # the topology refuses padding with routes
        model = backend
        padder = Padder(config.padding, config.name, model.model, lambda: model.description)
    parts = FeatureParts(
        tensor_map=tensor_map,
        padding=padder,
        assign_route=assign_route,
        shadow=shadow_mirror(ctx.endpoints.triton, config, ctx.topology, ctx.io.stage, ctx.metrics),
        warmup=config.warmup,
    )
    tenancy = tenancy_settings(config.tenants, ctx.io.input_topic)
    io, settings, kafka = with_delay_topic(ctx.io, tenancy), batching_settings(config), ctx.endpoints.kafka
    if tenancy is None:
        return BatchingStage(io, backend, settings, kafka=kafka, metrics=ctx.metrics, parts=parts)
    return TenantBatchingStage(io, backend, settings, tenancy=tenancy, kafka=kafka, metrics=ctx.metrics, parts=parts)


def build_dali(ctx: BuildContext, config: Stage) -> StreamStage:
    assert isinstance(config, DaliStageConfig)
    require(f"stage {config.name!r} (kind: dali)", DALI)  # DALI itself is imported on the stage's thread
    # The settings share their field names with the topology's, but for the batch size.
    same = {f.name: getattr(config, f.name) for f in fields(DaliSettings) if f.name != "max_batch_size"}
    backend = DaliAudioBackend(DaliSettings(**same, max_batch_size=config.batching.max_batch_size or 64))
    return BatchingStage(ctx.io, backend, batching_settings(config), kafka=ctx.endpoints.kafka, metrics=ctx.metrics)


def build_sequence(ctx: BuildContext, config: Stage) -> StreamStage:
    assert isinstance(config, SequenceStageConfig)
    post = config.postprocess
    # The settings share their field names with the topology's; only these two differ in type.
    differ = ("retry", "vad", "checkpoint", "upstream", "upstream_gone_after_s")
    same = {f.name: getattr(config, f.name) for f in fields(SequenceSettings) if f.name not in differ}
    settings = SequenceSettings(
        **same,
        upstream=chain_upstream(ctx.topology, config.name),
        upstream_gone_after_s=config.upstream_gone_after,
        retry=retry_policy(config.retry),
        # Under exactly-once a transaction commits a chunk's results with the state covering them.
        checkpoint=CheckpointPolicy(1) if ctx.io.exactly_once else CheckpointPolicy(**config.checkpoint.model_dump()),
        vad=None if post is None else VadSettings(**post.model_dump(exclude={"kind"})),
    )
    return SequenceStage(
        ctx.io,
        settings,
        state_topic=ctx.topology.state_topic(config.name),
        kafka=ctx.endpoints.kafka,
        triton=ctx.endpoints.triton,
        metrics=ctx.metrics,
    )


def build_join(ctx: BuildContext, node: JoinNode) -> StreamStage:
    to_result = node.feeds == "result"
    outputs = ctx.topology.outputs
    same = {name: getattr(node, name) for name in ("name", "branches", "input_topics", "mode", "window_ms")}
    graph = ctx.topology.graph()
    settings = JoinSettings(
        **same,
        max_open=ctx.topology.max_open_joins,
        to_result=to_result,
        keep=tuple(outputs) if to_result and outputs is not None else None,
        upstream=tuple(
            Upstream(ctx.topology.group_id(stage), topic, branch, depth)
            for branch in node.branches
            for stage, topic, depth in graph.chain(branch)
        ),
        branch_gone_after_s=node.branch_gone_after_s,
        max_wait_s=node.max_wait_s,
    )
    return JoinStage(
        ctx.io,
        settings,
        state_topic=f"{ctx.topology.name}.{node.name}.state",
        kafka=ctx.endpoints.kafka,
        metrics=ctx.metrics,
    )


def chain_upstream(topology: Topology, name: str) -> tuple[Upstream, ...]:
    """The stages before ``name`` in a chain (their groups and inputs), nearest first: a
    sequence stage closes a stream as idle only once they are caught up, or gone."""
    index = [s.name for s in topology.stages].index(name)
    topics = topology.stage_topics()
    found: list[Upstream] = []
    for i in range(index - 1, -1, -1):
        if topics[i].output != topics[i + 1].input:
            break  # a stage writing elsewhere does not feed this one
        found.append(Upstream(topology.group_id(topology.stages[i].name), topics[i].input, "", index - 1 - i))
    return tuple(found)


StageBuilder = Callable[[BuildContext, Stage], StreamStage]
STAGE_BUILDERS: dict[str, StageBuilder] = {
    "stateless": build_stateless,
    "dali": build_dali,
    "sequence": build_sequence,
}


def build_stages(
    topology: Topology, endpoints: Endpoints, metrics: PipelineMetrics, only: Sequence[str] = ()
) -> list[StreamStage]:
    """One runtime stage per selected topology stage (all when ``only`` is empty),
    and per join of a graph."""
    if topology.is_graph:
        return _graph_stages(topology, endpoints, metrics, only)
    limits, claim_checks = record_limits(topology, endpoints.kafka), claim_check_store(endpoints)
    _check_selection(topology, [s.name for s in topology.stages], only)
    stages: list[StreamStage] = []
    for index, (config, (input_topic, output_topic)) in enumerate(zip(topology.stages, topology.stage_topics(), strict=True)):
        if only and config.name not in only:
            continue
        builder = STAGE_BUILDERS.get(config.kind)
        if builder is None:
            raise ConfigError(f"stage {config.name!r}: kind {config.kind!r} is not supported by this version")
        io = StageIO(
            stage=config.name,
            group_id=topology.group_id(config.name),
            input_topic=input_topic,
            output_topic=output_topic,
            lanes=topology.resolved_lanes() if index == 0 else (),
            dead_letter_topic=topology.dead_letter_topic,
            max_pending=(
                config.max_pending_requests
                if isinstance(config, SequenceStageConfig)
                else config.batching.max_pending_requests
            ),
            emit_requests=output_topic != topology.result_topic,
            reply_prefix=reply_prefix(topology.result_topic) if output_topic == topology.result_topic else None,
            limits=limits,
            claim_checks=claim_checks,
            drain_timeout_s=topology.drain_timeout_s * DRAIN_SHARE,
            exactly_once=topology.exactly_once,
            close_timeout_s=topology.drain_timeout_s * CLOSE_STEP_SHARE,
            stall_after_s=stall_after_s(config),
        )
        stages.append(builder(BuildContext(topology, endpoints, metrics, io), config))
    return stages


def _graph_stages(
    topology: Topology, endpoints: Endpoints, metrics: PipelineMetrics, only: Sequence[str]
) -> list[StreamStage]:
    """Steps and joins of a graph topology, wired by the compiled graph's topics."""
    graph = topology.graph()
    limits, claim_checks = record_limits(topology, endpoints.kafka), claim_check_store(endpoints)
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
            reply_prefix=reply_prefix(topology.result_topic) if node.to_result else None,
            limits=limits,
            claim_checks=claim_checks,
            drain_timeout_s=topology.drain_timeout_s * DRAIN_SHARE,
            exactly_once=topology.exactly_once,
            close_timeout_s=topology.drain_timeout_s * CLOSE_STEP_SHARE,
            stall_after_s=stall_after_s(config),
        )
        tensor_map = TensorMap(
            config.input_map,
            config.output_map,
            carry=True,
            keep=topology.outputs if node.to_result else None,
        )
        stages.append(build_stateless(BuildContext(topology, endpoints, metrics, io), config, tensor_map))
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
            drain_timeout_s=topology.drain_timeout_s * DRAIN_SHARE,
            exactly_once=topology.exactly_once,
            close_timeout_s=topology.drain_timeout_s * CLOSE_STEP_SHARE,
            # A join record legitimately waits up to its window for the other branches.
            stall_after_s=join.window_ms / 1000 + JOIN_STALL_MARGIN_S,
            limits=limits,
            claim_checks=claim_checks,
            reply_prefix=reply_prefix(topology.result_topic) if join.output_topic == topology.result_topic else None,
        )
        stages.append(build_join(BuildContext(topology, endpoints, metrics, io), join))
    return stages


def record_limits(topology: Topology, kafka: KafkaSettings) -> RecordLimits:
    """The topology's record limits: its largest accepted request value (a stage's
    ``max_request_bytes``; sequence stages decode up to the contract's default) plus
    headroom; dead letters over ``kafka.dead_letter_max_bytes`` become claim checks."""
    largest = max(
        (getattr(stage, "max_request_bytes", DEFAULT_MAX_VALUE_BYTES) for stage in topology.stages),
        default=DEFAULT_MAX_VALUE_BYTES,
    )
    return RecordLimits.for_values(int(largest), dead_letter_max_bytes=kafka.dead_letter_max_bytes)


def claim_check_store(endpoints: Endpoints) -> ClaimCheckStore | None:
    """Where oversized dead letters keep their payload: the S3 store when one is
    configured; else none (such payloads are not kept, and counted)."""
    return ClaimCheckStore(endpoints.s3) if endpoints.s3.configured else None


def _check_selection(topology: Topology, names: list[str], only: Sequence[str]) -> None:
    unknown = [name for name in only if name not in names]
    if unknown:
        raise ConfigError(
            f"topology {topology.name!r} has no stage {', '.join(map(repr, unknown))} (stages: {', '.join(names)})"
        )


JOIN_STALL_MARGIN_S = 60.0
DRAIN_SHARE = 0.7
CLOSE_STEP_SHARE = 0.05
"""Of the topology's ``drain_timeout_s``, a stage drains (release, flush, commit) within
70 % and gives each of its five closing steps (abandon, outbox, consumer, producer,
backend) 5 %: its whole shutdown fits in 95 %, and the runner cancels whatever still
runs at 100 % (see :mod:`pipeline.runtime.runner`)."""


def stall_after_s(config: Stage) -> float:
    """The watchdog's threshold: the topology's, or twice the stage's call bound (plus,
    for a sequence stage, the time a chunk may wait for a missing one)."""
    if config.stall_after_s is not None:
        return config.stall_after_s
    if isinstance(config, DaliStageConfig):
        return 2 * config.run_timeout_s
    if isinstance(config, SequenceStageConfig):
        return 2 * config.call_timeout_s + config.gap_timeout_s
    return 2 * config.call_timeout_s


def retry_policy(config: RetryConfig) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=config.max_attempts,
        initial_backoff_s=config.initial_backoff_ms / 1000,
        max_backoff_s=config.max_backoff_ms / 1000,
    )


def batching_settings(config: StatelessStageConfig | DaliStageConfig) -> BatchingSettings:
    b = config.batching
    common = b.model_dump(include={"max_batch_size", "max_inflight_batches", "max_batch_bytes", "hold_partial_batches"})
    common.update(max_queue_delay_s=b.max_queue_delay_ms / 1000, max_request_bytes=config.max_request_bytes)
    if isinstance(config, DaliStageConfig):
        return BatchingSettings(**common)
    return BatchingSettings(
        **common,
        default_deadline_ms=None if config.deadline_ms is None else int(config.deadline_ms),
        default_priority=config.priority,
        default_timeout_ms=None if config.timeout_ms is None else int(config.timeout_ms),
        retry=retry_policy(config.retry),
    )
