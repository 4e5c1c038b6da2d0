"""The units a topology runs as: what ``pipeline run TOPOLOGY --stage NAME`` accepts.

A chain runs one unit per stage; a graph runs one per step and one per join node
(:func:`pipeline.runtime.stages.build_stages` builds exactly these, and a join is selected
with ``--stage join-NAME`` like any step). Each unit is its own consumer group, so each is a
Deployment of its own that scales on its own lag.

Kubernetes names are DNS-1035 labels (63 characters, a letter first); ``<topology>-<unit>``
can exceed that (both names may be 64 characters), so long names are shortened with a hash of
the full name to stay unique.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from pipeline.topology.model import Topology

_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_MAX_NAME = 63


@dataclass(frozen=True)
class RunUnit:
    """One ``--stage`` selection: its consumer group and the topics that group reads."""

    name: str
    group_id: str
    input_topics: tuple[str, ...]


def run_units(topology: Topology) -> list[RunUnit]:
    """Every unit of ``topology``, in the order ``pipeline run`` starts them."""
    if topology.is_graph:
        graph = topology.graph()
        steps = [(name, (graph.steps[name].input_topic,)) for name in graph.order]
        joins = [(name, join.input_topics) for name, join in graph.joins.items()]
        selected = steps + joins
    else:
        lanes = tuple(lane.topic for lane in topology.resolved_lanes()[:-1])  # the first stage reads them too
        selected = [
            (s.name, (t.input, *(lanes if index == 0 else ())))
            for index, (s, t) in enumerate(zip(topology.stages, topology.stage_topics(), strict=True))
        ]
    return [RunUnit(name, topology.group_id(name), topics) for name, topics in selected]


def resource_name(*parts: str) -> str:
    """A valid Kubernetes object name made of ``parts``; unique for distinct ``parts``."""
    name = "-".join(parts)
    if not name[:1].isalpha():
        name = f"p-{name}"
    if len(name) <= _MAX_NAME and _DNS_LABEL.fullmatch(name):
        return name
    digest = hashlib.sha256("/".join(parts).encode()).hexdigest()[:8]
    return f"{name[: _MAX_NAME - len(digest) - 1].rstrip('-')}-{digest}"
