"""Every record every stage consumed has an outcome: the audit the fault campaigns share.

The comparison with a fault-free reference (:mod:`tests.helpers.fault_compare`) judges
what reaches the result topic. A record lost between two stages shows there only
indirectly, or not at all: a sequence stage turns a missing chunk into a ``gap`` result,
a join into an expired window. So this audit walks the topology hop by hop: for each
stage, each record on its input topics (every offset, across every restart and
rebalance, read back from the log) must have, on that stage's output topic, a record
standing for the same thing (same key and, for stream chunks, the same ``chunk_index``;
a ``gap`` result does not count), or a dead letter naming its position
(``source-topic/-partition/-offset``). Duplicates are not its concern.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.contract.errors import BadRequest
from pipeline.contract.request import decode_request
from pipeline.contract.response import decode_response
from pipeline.topology import load_topology
from pipeline.topology.model import Topology
from tests.helpers.fault_compare import Rec, read_to_end
from tests.helpers.kafka_io import header


@dataclass(frozen=True)
class Hop:
    """One stage: the topics it reads and the one its outcomes go to."""

    stage: str
    inputs: tuple[str, ...]
    output: str


@dataclass
class Audit:
    """Per hop, the input positions that have no outcome (empty everywhere: all accounted for)."""

    consumed: dict[str, int] = field(default_factory=dict)
    unaccounted: dict[str, list[str]] = field(default_factory=dict)

    def problems(self) -> list[str]:
        return [
            f"stage {stage}: {len(missing)} of {self.consumed[stage]} input records have no outcome, e.g. {missing[:3]}"
            for stage, missing in self.unaccounted.items()
            if missing
        ]

    def line(self) -> str:
        return ", ".join(f"{stage} {self.consumed[stage]} in / {len(self.unaccounted[stage])} without outcome"
                         for stage in self.consumed)


def hops(topology: Topology) -> list[Hop]:
    if topology.is_graph:
        graph = topology.graph()
        steps = [Hop(name, (node.input_topic,), node.output_topic) for name, node in graph.steps.items()]
        joins = [Hop(name, tuple(join.input_topics), join.output_topic) for name, join in graph.joins.items()]
        return steps + joins
    return [
        Hop(stage.name, (input_topic,), output_topic)
        for stage, (input_topic, output_topic) in zip(topology.stages, topology.stage_topics(), strict=True)
    ]


def _identity(record: Rec, *, result: bool) -> Hashable:
    """What the record stands for: its key, and its chunk index when it is a stream's chunk."""
    try:
        params = (decode_response if result else decode_request)(record.value, record.headers).parameters
    except (BadRequest, ValueError, KeyError):
        params = {}
    index = params.get("chunk_index", header(record, "chunk-index"))
    return (record.key, None if index is None else str(index))


def _position(record: Rec) -> tuple[str | None, str | None, str | None]:
    return (header(record, "source-topic"), header(record, "source-partition"), header(record, "source-offset"))


def audit_outcomes(bootstrap: str, topology_path: Path) -> Audit:
    """Read every stage's topics to their end now and account for each consumed record."""
    topology = load_topology(topology_path)
    stages = hops(topology)
    topics = sorted({t for hop in stages for t in (*hop.inputs, hop.output)} | {topology.dead_letter_topic})
    return account(stages, asyncio.run(read_to_end(bootstrap, topics)), topology.dead_letter_topic, topology.result_topic)


def account(stages: list[Hop], records: list[Rec], dead_letter_topic: str, result_topic: str) -> Audit:
    """The audit of ``records`` (everything the topics of ``stages`` and the dead-letter topic hold)."""
    by_topic: dict[str, list[Rec]] = {}
    for record in records:
        by_topic.setdefault(record.topic, []).append(record)
    dead = {_position(r) for r in by_topic.get(dead_letter_topic, [])}
    out = Audit()
    for hop in stages:
        result = hop.output == result_topic
        produced = {
            _identity(r, result=result)
            for r in by_topic.get(hop.output, [])
            if header(r, "result-type") != "gap"
        }
        consumed = [r for topic in hop.inputs for r in by_topic.get(topic, [])]
        out.consumed[hop.stage] = len(consumed)
        out.unaccounted[hop.stage] = [
            f"{r.topic}[{r.partition}]@{r.offset}"
            for r in consumed
            if _identity(r, result=False) not in produced
            and (r.topic, str(r.partition), str(r.offset)) not in dead
        ]
    return out
