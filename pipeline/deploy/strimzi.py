"""Strimzi ``KafkaTopic`` resources for every topic a topology owns (``deploy k8s --strimzi``).

On a cluster whose Kafka is run by the Strimzi operator, topics are declared as resources,
reviewed and applied like the rest of the deployment, instead of being created by the first
worker that starts. Each resource carries what the workers would have created: the
topology's partition count, its replication factor (omitted when it is the broker's
default, -1: Strimzi then applies ``default.replication.factor``), the record size limit the
stages need (``max.message.bytes``), and ``cleanup.policy=compact`` for the state changelogs.

The fields are those of Strimzi's KafkaTopic CRD (``kafka.strimzi.io/v1``; the same spec as
``v1beta2``, which Strimzi before 0.49 serves: change ``apiVersion`` in an overlay there).
Topic names may hold characters a Kubernetes name may not (``_``, upper case), so the
resource is named after the topic and the topic itself is ``spec.topicName``.
"""

from __future__ import annotations

from pipeline.deploy.objects import DeployContext, Manifest, metadata
from pipeline.deploy.units import resource_name
from pipeline.runtime.stages import record_limits
from pipeline.settings import KafkaSettings

API_VERSION = "kafka.strimzi.io/v1"
CLUSTER_LABEL = "strimzi.io/cluster"


def kafka_topics(ctx: DeployContext, cluster: str) -> list[Manifest]:
    """One KafkaTopic per topic of the topology (state changelogs compacted), for ``cluster``."""
    topology = ctx.topology
    limits = record_limits(topology, KafkaSettings.model_construct(dead_letter_max_bytes=1 << 20))
    compacted = set(topology.state_topics())
    topics = [*topology.topics(), *topology.state_topics()]
    out = []
    for topic in dict.fromkeys(topics):
        labels = {**ctx.common_labels(), CLUSTER_LABEL: cluster}
        spec: Manifest = {"topicName": topic, "partitions": topology.kafka.partitions}
        if topology.kafka.replication_factor > 0:
            spec["replicas"] = topology.kafka.replication_factor
        config = dict(limits.topic_configs())
        if topic in compacted:
            config["cleanup.policy"] = "compact"
        spec["config"] = config
        name = resource_name(topology.name, "topic", topic.lower().replace("_", "-"))
        out.append({"apiVersion": API_VERSION, "kind": "KafkaTopic", "metadata": metadata(name, labels), "spec": spec})
    return out
