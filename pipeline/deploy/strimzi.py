"""Strimzi ``KafkaTopic`` resources for every topic a topology owns (``deploy k8s --strimzi``),
and a least-privilege ``KafkaUser`` per run unit (``--strimzi-users``).

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

**Users.** With ``--strimzi-users`` each run unit gets a ``KafkaUser`` named like its
Deployment, whose ``simple`` ACLs allow exactly what the unit does
(:mod:`pipeline.deploy.access`): Read on the topics it consumes, Write on those it
produces, Describe on both; Read on its consumer group; Describe on the groups it watches
and Read on their inputs (a stateful unit judging how far the units before it are); Write on
the reply topics (a ``prefix`` ACL) for the unit writing the result. Nothing on the cluster,
no Create, no other group: a stage's user reads only its inputs (and the inputs of the units
it watches), writes only its outputs, and cannot create topics or join another group.
Authentication is ``scram-sha-512`` rather than ``tls``: the User Operator's Secret (named
after the user) holds the password under ``password``, which becomes the worker's
``PIPELINE_KAFKA_SASL_PASSWORD`` through a ``secretKeyRef`` (one variable, no file; the
username is the resource's name), the form the workers' Kafka settings already take;
``tls`` would mount a client certificate and key into every pod, and needs a listener with
TLS client authentication. The Deployment (or StatefulSet) of the unit then
logs in as its user (:func:`user_login`): mechanism ``SCRAM-SHA-512``, over ``SASL_SSL``
with the cluster CA from ``<cluster>-cluster-ca-cert`` (``--no-strimzi-tls``:
``SASL_PLAINTEXT``, a listener without TLS). The User Operator reconciles KafkaUsers (and
writes their Secrets) in the namespace it watches, the Kafka cluster's own by default: deploy
there, or point ``watchedNamespace`` at the pipeline's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.deploy.access import AclRule, UnitAccess, acl_rules, client_rules, unit_access
from pipeline.deploy.kafka_acls import unit_user
from pipeline.deploy.objects import DeployContext, Manifest, metadata
from pipeline.deploy.units import resource_name
from pipeline.runtime.stages import record_limits
from pipeline.settings import KafkaSettings

API_VERSION = "kafka.strimzi.io/v1"
"""Of KafkaTopic and KafkaUser: Strimzi 1.0 serves ``v1`` only (``v1beta2`` was removed),
0.49 to 0.51 both; before 0.49 set ``v1beta2`` in an overlay (the specs written here are
valid in both)."""
CLUSTER_LABEL = "strimzi.io/cluster"
AUTHENTICATION = "scram-sha-512"
SASL_MECHANISM = "SCRAM-SHA-512"
SCRAM_KEY = "password"
"""The key holding a SCRAM-SHA-512 user's password in the Secret the User Operator writes."""
CA_KEY = "ca.crt"
CA_DIR = "/etc/kafka-ca"
CA_VOLUME = "kafka-ca"


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
        config = {**topology.kafka.topic_settings(), **limits.topic_configs()}
        if topic in compacted:
            config["cleanup.policy"] = "compact"
        spec["config"] = config
        name = resource_name(topology.name, "topic", topic.lower().replace("_", "-"))
        out.append({"apiVersion": API_VERSION, "kind": "KafkaTopic", "metadata": metadata(name, labels), "spec": spec})
    return out


def user_name(ctx: DeployContext, unit: str) -> str:
    """The KafkaUser (and SCRAM username, and Secret) of ``unit``: its Deployment's name."""
    return unit_user(ctx.topology, unit)


def cluster_ca_secret(cluster: str) -> str:
    """The Secret holding the public certificate of the cluster CA, which signs the brokers'."""
    return f"{cluster}-cluster-ca-cert"


def kafka_users(ctx: DeployContext, cluster: str) -> list[Manifest]:
    """One KafkaUser per run unit of the topology, for ``cluster``."""
    return [kafka_user(ctx, access, cluster) for access in unit_access(ctx.topology)]


def kafka_user(ctx: DeployContext, access: UnitAccess, cluster: str) -> Manifest:
    return _user(ctx, user_name(ctx, access.unit), acl_rules(access), cluster)


def client_users(ctx: DeployContext, cluster: str) -> list[Manifest]:
    """One KafkaUser per ``--strimzi-client NAME``: principal ``User:NAME``, a client's ACLs only."""
    return [_user(ctx, name, client_rules(ctx.topology, name), cluster) for name in ctx.options.strimzi_clients]


def _user(ctx: DeployContext, name: str, rules: list[AclRule], cluster: str) -> Manifest:
    labels = {**ctx.common_labels(), CLUSTER_LABEL: cluster}
    return {
        "apiVersion": API_VERSION,
        "kind": "KafkaUser",
        "metadata": metadata(name, labels),
        "spec": {
            "authentication": {"type": AUTHENTICATION},
            "authorization": {"type": "simple", "acls": simple_acls(rules)},
        },
    }


def acls(access: UnitAccess) -> list[Manifest]:
    """The ``simple`` ACLs of ``access`` (:func:`pipeline.deploy.access.acl_rules`)."""
    return simple_acls(acl_rules(access))


STRIMZI_RESOURCE = {"topic": "topic", "group": "group", "transactional-id": "transactionalId"}
"""Kafka's resource kinds as Strimzi's ``KafkaUser`` names them."""


def simple_acls(rules: list[AclRule]) -> list[Manifest]:
    """Rules as Strimzi's ``simple`` authorization entries."""
    return [
        {
            "resource": {"type": STRIMZI_RESOURCE[rule.resource_type], "name": rule.name, "patternType": rule.pattern},
            "operations": list(rule.operations),
            "host": "*",
        }
        for rule in rules
    ]


@dataclass(frozen=True)
class Login:
    """What a worker container adds to log in as its unit's KafkaUser."""

    env: list[Manifest]
    volume_mounts: list[Manifest] = field(default_factory=list)
    volumes: list[Manifest] = field(default_factory=list)


def user_login(ctx: DeployContext, unit: str) -> Login:
    """The ``PIPELINE_KAFKA_*`` variables (and the cluster CA's volume) of a worker of ``unit``.

    Set in the container's ``env``, they win over the same names in the workers' Secret
    (``envFrom``); the password is only referenced, never written into a manifest.
    """
    cluster = ctx.options.strimzi_cluster
    assert cluster is not None, "strimzi_users without strimzi_cluster"  # DeployOptions refuses it
    user = user_name(ctx, unit)
    tls = ctx.options.strimzi_tls
    env: list[Manifest] = [
        {"name": "PIPELINE_KAFKA_SECURITY_PROTOCOL", "value": "SASL_SSL" if tls else "SASL_PLAINTEXT"},
        {"name": "PIPELINE_KAFKA_SASL_MECHANISM", "value": SASL_MECHANISM},
        {"name": "PIPELINE_KAFKA_SASL_USERNAME", "value": user},
        {"name": "PIPELINE_KAFKA_SASL_PASSWORD", "valueFrom": {"secretKeyRef": {"name": user, "key": SCRAM_KEY}}},
    ]
    if not tls:
        return Login(env)
    env.append({"name": "PIPELINE_KAFKA_SSL_CAFILE", "value": f"{CA_DIR}/{CA_KEY}"})
    items = [{"key": CA_KEY, "path": CA_KEY}]
    volume = {"name": CA_VOLUME, "secret": {"secretName": cluster_ca_secret(cluster), "items": items}}
    return Login(env, [{"name": CA_VOLUME, "mountPath": CA_DIR, "readOnly": True}], [volume])
