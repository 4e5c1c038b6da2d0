"""What a client needs to know about a topology, read once from its YAML file."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pipeline.contract.reply import reply_prefix
from pipeline.topology.lanes import find_lane
from pipeline.topology.loader import load_topology
from pipeline.topology.model import DaliStageConfig, SequenceStageConfig, Topology


@dataclass(frozen=True)
class TopologyEndpoint:
    """The topics of a topology, its input tensor names when it declares them, and whether
    a stream's last result is a ``summary`` (a sequence stage with a post-processor)."""

    topology: Topology
    input_names: tuple[str, ...]
    stream_summary: bool

    @classmethod
    def of(cls, topology: Topology | str | os.PathLike[str]) -> TopologyEndpoint:
        topo = topology if isinstance(topology, Topology) else load_topology(topology)
        first, last = topo.stages[0], topo.stages[-1]
        if topo.inputs:
            names: tuple[str, ...] = tuple(topo.inputs)
        elif isinstance(first, (DaliStageConfig, SequenceStageConfig)):
            names = (first.input_tensor,)
        else:
            names = ()  # a model's inputs: known to Triton, not to the topology file
        summary = isinstance(last, SequenceStageConfig) and last.postprocess is not None
        return cls(topology=topo, input_names=names, stream_summary=summary)

    @property
    def input_topic(self) -> str:
        return self.topology.input_topic

    def lane_topic(self, lane: str | None) -> str:
        """Where a request of ``lane`` goes (None: the input topic, the default lane); an
        unknown lane is a one-line :class:`~pipeline.errors.ConfigError` naming the lanes."""
        found = find_lane(self.topology.resolved_lanes(), lane)
        return self.input_topic if found is None else found.topic

    @property
    def result_topic(self) -> str:
        return self.topology.result_topic

    @property
    def dead_letter_topic(self) -> str:
        return self.topology.dead_letter_topic

    @property
    def reply_prefix(self) -> str:
        return reply_prefix(self.topology.result_topic)
