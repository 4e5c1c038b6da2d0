"""What each run unit does on Kafka: the topics it reads and writes, its group, what it watches.

The basis of the least-privilege ``KafkaUser`` of each unit (:mod:`pipeline.deploy.strimzi`),
derived from the topology exactly as :mod:`pipeline.runtime.stages` wires the stages (the
tests build the runtime's own stages and check every topic and group they use against this):

- every unit reads its inputs: a chain stage its input topic (the first one its priority
  lanes too, a stage with tenant quotas its delay topic), a graph step its input, a join
  its branches; and commits in its own consumer group;
- every unit writes its output, the dead-letter topic and the metrics topic (each worker
  publishes snapshots); a stage with a shadow its shadow topic, one with tenant quotas
  its delay topic (it reads back what it delayed); the unit writing the result topic
  every reply topic, ``<result_topic>.reply.*`` (:mod:`pipeline.contract.reply`);
- a stateful unit (a sequence stage, a join) reads and writes its state changelog, and
  watches the units upstream of it (:mod:`pipeline.kafka.progress`): their groups'
  committed offsets and members, and their input topics, whose end offsets it lists and
  whose records at the committed offsets it fetches (their timestamps are the branch's
  position), which is a Read.

Nothing else: no Create (the topics are ``KafkaTopic`` resources, or made beforehand), no
cluster operation (idempotent producers need only Write on a topic since Kafka 2.8). Under
``delivery: exactly_once`` a unit also writes and describes its transactional ids, which
all start with its group id and a dot (:mod:`pipeline.kafka.transactions`).

:func:`acl_rules` turns a unit's access into ACL rules, the one form both renderings use:
Strimzi ``KafkaUser`` resources (:mod:`pipeline.deploy.strimzi`) and bindings applied to a
cluster (:mod:`pipeline.deploy.kafka_acls`). :func:`client_rules` are a request-reply
client's: it writes the requests and reads its own reply topic, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.contract.reply import reply_headers, reply_prefix, reply_target
from pipeline.runtime.stages import chain_upstream
from pipeline.topology.model import SequenceStageConfig, StatelessStageConfig, Topology


@dataclass(frozen=True)
class UnitAccess:
    """The Kafka resources one run unit (``pipeline run --stage NAME``) uses, and how."""

    unit: str
    group_id: str
    reads: tuple[str, ...]
    """Topics it consumes (Read, Describe)."""
    writes: tuple[str, ...]
    """Topics it produces to (Write, Describe); a state or delay topic is in both."""
    reply_prefix: str | None = None
    """Every topic under this prefix is written (the unit writing the result topic)."""
    upstream: tuple[tuple[str, str], ...] = ()
    """``(group id, input topic)`` of each unit it watches: the group described, the topic read."""
    transactional: bool = False
    """``delivery: exactly_once``: its producers' transactional ids are ``<group id>.<unit>``."""


def unit_access(topology: Topology) -> list[UnitAccess]:
    """Per unit of ``topology``, in :func:`pipeline.deploy.units.run_units` order."""
    if topology.is_graph:
        return _graph_access(topology)
    side = (topology.dead_letter_topic, topology.metrics_topic)
    lanes = tuple(lane.topic for lane in topology.resolved_lanes()[:-1])
    found = []
    for index, (stage, edge) in enumerate(zip(topology.stages, topology.stage_topics(), strict=True)):
        stateful = isinstance(stage, SequenceStageConfig)
        state = (topology.state_topic(stage.name),) if stateful else ()
        tenants = stage.tenants if isinstance(stage, StatelessStageConfig) else None
        delay = tenants.delay_topic_for(edge.input) if tenants is not None else None
        delayed = (delay,) if delay else ()
        watched = chain_upstream(topology, stage.name) if stateful else ()
        shadow = topology.shadow_topic(stage.name)
        found.append(
            UnitAccess(
                unit=stage.name,
                group_id=topology.group_id(stage.name),
                reads=_unique(edge.input, *(lanes if index == 0 else ()), *delayed, *state),
                writes=_unique(edge.output, *((shadow,) if shadow else ()), *delayed, *state, *side),
                reply_prefix=reply_prefix(topology.result_topic) if edge.output == topology.result_topic else None,
                upstream=tuple((up.group_id, up.topic) for up in watched),
                transactional=topology.exactly_once,
            )
        )
    return found


def _graph_access(topology: Topology) -> list[UnitAccess]:
    graph = topology.graph()
    side = (topology.dead_letter_topic, topology.metrics_topic)
    result = reply_prefix(topology.result_topic)
    found = [
        UnitAccess(
            unit=name,
            group_id=topology.group_id(name),
            reads=(step.input_topic,),
            writes=_unique(step.output_topic, *side),
            reply_prefix=result if step.to_result else None,
            transactional=topology.exactly_once,
        )
        for name, step in ((name, graph.steps[name]) for name in graph.order)
    ]
    for name, join in graph.joins.items():
        state = f"{topology.name}.{name}.state"  # as pipeline.runtime.stages.build_join names it
        watched = (
            (topology.group_id(stage), topic) for branch in join.branches for stage, topic, _ in graph.chain(branch)
        )
        found.append(
            UnitAccess(
                unit=name,
                group_id=topology.group_id(name),
                reads=_unique(*join.input_topics, state),
                writes=_unique(join.output_topic, state, *side),
                reply_prefix=result if join.output_topic == topology.result_topic else None,
                upstream=tuple(dict.fromkeys(watched)),
                transactional=topology.exactly_once,
            )
        )
    return found


def _unique(*topics: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(topics))


Operation = Literal["Read", "Write", "Create", "Delete", "Describe"]
ResourceKind = Literal["topic", "group", "transactional-id"]
_ORDER: dict[str, int] = {"Read": 0, "Write": 1, "Create": 2, "Delete": 3, "Describe": 4}


@dataclass(frozen=True)
class AclRule:
    """Operations allowed on one resource (Kafka's ACL names, as Strimzi's ``simple`` ACLs)."""

    resource_type: ResourceKind
    name: str
    operations: tuple[Operation, ...]
    pattern: Literal["literal", "prefix"] = "literal"


class _Rules:
    """Rules gathered per resource, each resource's operations merged in a stable order."""

    def __init__(self) -> None:
        self._found: dict[tuple[str, str, str], list[Operation]] = {}

    def allow(self, kind: ResourceKind, name: str, *ops: Operation, pattern: str = "literal") -> None:
        granted = self._found.setdefault((kind, name, pattern), [])
        granted += [op for op in ops if op not in granted]

    def rules(self) -> list[AclRule]:
        return [
            AclRule(kind, name, tuple(sorted(ops, key=_ORDER.__getitem__)), pattern)  # type: ignore[arg-type]
            for (kind, name, pattern), ops in self._found.items()
        ]


def acl_rules(access: UnitAccess) -> list[AclRule]:
    """What ``access`` needs, as ACL rules: one per resource, its operations merged."""
    found = _Rules()
    for topic in access.reads:
        found.allow("topic", topic, "Read", "Describe")
    for topic in access.writes:
        found.allow("topic", topic, "Write", "Describe")
    if access.reply_prefix is not None:
        found.allow("topic", access.reply_prefix, "Write", "Describe", pattern="prefix")
    found.allow("group", access.group_id, "Read", "Describe")
    for group, topic in access.upstream:
        found.allow("group", group, "Describe")
        found.allow("topic", topic, "Read", "Describe")
    if access.transactional:
        found.allow("transactional-id", f"{access.group_id}.", "Write", "Describe", pattern="prefix")
    return found.rules()


def client_reply_topic(topology: Topology, client: str) -> str:
    """The reply topic of the client named ``client``: ``<result_topic>.reply.<client>``."""
    topic = reply_prefix(topology.result_topic) + client
    if not reply_target(reply_headers(topic, None), reply_prefix(topology.result_topic)).honoured:
        raise ValueError(f"client name {client!r} does not make a valid reply topic name ({topic!r})")
    return topic


def client_rules(topology: Topology, client: str) -> list[AclRule]:
    """A request-reply client's rules: Write on the request topics (the input and its lanes),
    and its own reply topic (:func:`client_reply_topic`) to create, read and delete. It sees
    no result, no dead letter and no other client's reply topic: a call whose request is
    dead-lettered ends by its timeout, as the client library's docs say for this setup."""
    found = _Rules()
    for topic in _unique(topology.input_topic, *(lane.topic for lane in topology.resolved_lanes())):
        found.allow("topic", topic, "Write", "Describe")
    found.allow("topic", client_reply_topic(topology, client), "Read", "Create", "Delete", "Describe")
    return found.rules()
