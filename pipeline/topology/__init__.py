"""Topology files: the YAML that describes one streaming inference pipeline.

:func:`load_topology` reads and validates a file into a :class:`Topology`;
:func:`check_compatibility` checks it against the models Triton serves.
"""

from pipeline.topology.compat import check_compatibility
from pipeline.topology.loader import load_topology, parse_topology
from pipeline.topology.model import (
    Batching,
    DaliStageConfig,
    KafkaSection,
    RetryConfig,
    SequenceStageConfig,
    Stage,
    StageTopics,
    StatelessStageConfig,
    Topology,
    TritonSection,
)

__all__ = [
    "Batching",
    "DaliStageConfig",
    "KafkaSection",
    "RetryConfig",
    "SequenceStageConfig",
    "Stage",
    "StageTopics",
    "StatelessStageConfig",
    "Topology",
    "TritonSection",
    "check_compatibility",
    "load_topology",
    "parse_topology",
]
