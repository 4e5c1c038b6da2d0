"""A KEDA ``ScaledObject`` per run unit: scale its Deployment on its consumer group's lag.

KEDA's Kafka scaler (https://keda.sh/docs/2.x/scalers/apache-kafka/) reads the group's
committed offsets against the topic's end offsets. One trigger per input topic (a join reads
two); the HPA follows the largest. The bootstrap servers come from the Deployment's own
environment (``bootstrapServersFromEnv``: KEDA resolves the container's ``envFrom``
ConfigMap), so they live in one place. Replicas are capped at the partition count: a consumer
group gives each partition to one member, so more would sit idle.
"""

from __future__ import annotations

from pipeline.deploy.objects import WORKER, DeployContext, Manifest, metadata, workload_kind
from pipeline.deploy.units import RunUnit, resource_name

BOOTSTRAP_VARIABLE = "PIPELINE_KAFKA_BOOTSTRAP_SERVERS"

OFFSET_RESET = "earliest"
"""What the stage consumers do without a committed offset (``make_consumer`` in
:mod:`pipeline.kafka.clients`): KEDA then counts the whole backlog as lag, as the group will."""

POLLING_INTERVAL_S = 15
SCALE_DOWN_WINDOW_S = 300
"""Every scale step is a consumer-group rebalance (stateful stages restore their state):
scale down only on a lag that stayed low for five minutes."""


def max_replicas(ctx: DeployContext) -> int:
    """The requested maximum, capped at the partitions of the topics the topology creates."""
    partitions = ctx.topology.kafka.partitions
    wanted = ctx.options.max_replicas or partitions
    return min(wanted, partitions)


def scaled_object(ctx: DeployContext, unit: RunUnit) -> Manifest:
    name = resource_name(ctx.topology.name, unit.name)
    triggers: list[Manifest] = []
    for topic in unit.input_topics:
        trigger: Manifest = {
            "type": "kafka",
            "metadata": {
                "bootstrapServersFromEnv": BOOTSTRAP_VARIABLE,
                "consumerGroup": unit.group_id,
                "topic": topic,
                "lagThreshold": str(ctx.options.lag_threshold),
                "offsetResetPolicy": OFFSET_RESET,
            },
        }
        if ctx.options.keda_auth:
            trigger["authenticationRef"] = {"name": ctx.options.keda_auth}
        triggers.append(trigger)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata(name, ctx.labels(WORKER, name)),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": workload_kind(ctx.options), "name": name},
            "minReplicaCount": min(ctx.options.min_replicas, max_replicas(ctx)),
            "maxReplicaCount": max_replicas(ctx),
            "pollingInterval": POLLING_INTERVAL_S,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S}}
                }
            },
            "triggers": triggers,
        },
    }
