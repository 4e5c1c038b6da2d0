"""Builders for a stateless stage's several models: its routed backend and its shadow.

From the topology's ``routes``/``route_by``/``shadow`` (pipeline/topology/routes.py)
to the worker objects (workers/stateless/routes.py, workers/stateless/routed_backend.py,
workers/stateless/shadow.py). A stage without routes gets its one :class:`TritonModelBackend`,
exactly as before; without a shadow, no mirror.
"""

from __future__ import annotations

from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.traffic_metrics import TrafficMetrics
from pipeline.settings import TritonSettings
from pipeline.topology.model import StatelessStageConfig, Topology
from pipeline.triton.client import triton_call_span
from pipeline.triton.replicas import one_server, replica_settings, replica_spec
from pipeline.triton.shared_memory import SharedMemoryOptions
from workers.stateless.backend import BatchBackend
from workers.stateless.features import RouteAssigner
from workers.stateless.fleet_backend import FleetBackend
from workers.stateless.routed_backend import RoutedBackend
from workers.stateless.routes import Route, RouteTable
from workers.stateless.shadow import ShadowMirror
from workers.stateless.tensor_map import TensorMap
from workers.stateless.triton_backend import TritonModelBackend


def stateless_backend(
    triton: TritonSettings, config: StatelessStageConfig, stage: str, metrics: PipelineMetrics
) -> tuple[BatchBackend, RouteAssigner | None]:
    """The stage's backend, and the route assigner of each request (None: one model)."""
    if config.routes is None:

        def model_on(server: TritonSettings) -> TritonModelBackend:
            return TritonModelBackend(
                server,
                config.model,
                config.model_version,
                call_timeout_s=config.call_timeout_s,
                shared_memory=SharedMemoryOptions(**config.shared_memory.model_dump()),
                stage=stage,
                count_shared_memory=lambda outcome: metrics.triton_shared_memory.labels(stage, outcome).inc(),
            )

        spec = replica_spec(triton.grpc_url or "")
        if not spec.several:
            return model_on(triton), None
        first = spec.endpoints[0] if spec.endpoints else "{}:{}".format(*spec.dns_names[0])
        fleet = FleetBackend(
            spec,
            lambda endpoint: model_on(replica_settings(triton, endpoint)),
            name=config.model,
            call_span=triton_call_span(replica_settings(triton, first), config.model, config.model_version),
        )
        return fleet, None
    one_server(triton, f"stage {stage!r} with routes")
    table = RouteTable(
        [Route(r.name, r.model, r.model_version, r.weight) for r in config.routes], by_task=config.route_by == "task"
    )
    backend = RoutedBackend(
        triton, table, stage=stage, metrics=TrafficMetrics.of(metrics), call_timeout_s=config.call_timeout_s
    )
    return backend, backend.assign


def shadow_mirror(
    triton: TritonSettings,
    config: StatelessStageConfig,
    topology: Topology,
    stage: str,
    metrics: PipelineMetrics,
) -> ShadowMirror | None:
    shadow = config.shadow
    topic = topology.shadow_topic(config.name)
    if shadow is None or topic is None:
        return None
    one_server(triton, f"stage {stage!r} with a shadow")
    return ShadowMirror(
        TritonModelBackend(triton, shadow.model, shadow.model_version, call_timeout_s=config.call_timeout_s),
        stage=stage,
        topic=topic,
        max_inflight=shadow.max_inflight,
        # The shadow's results are responses of its own: never forwarded as a next stage's request.
        tensor_map=TensorMap(config.input_map, config.output_map),
        counter=TrafficMetrics.of(metrics).shadow,
    )
