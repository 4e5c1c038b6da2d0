"""Where ``produce`` and ``consume`` point: topics, the model, and the Kafka/Triton endpoints.

Either a topology file names everything (its input topic, result and
dead-letter topics, the first stage's model, optionally its endpoints), or
flags do; a flag given next to ``--topology`` overrides that part of it, so a
test or a demo can reuse a topology's model while writing to its own topic.
Endpoint precedence matches ``pipeline run``: the topology's own, else the
environment (``PIPELINE_*``), else a running ``pipeline up`` stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.endpoints import resolve_endpoints
from pipeline.errors import ConfigError
from pipeline.settings import KafkaSettings, TritonSettings
from pipeline.topology.lanes import find_lane
from pipeline.topology.model import Topology


@dataclass(frozen=True)
class Target:
    """A resolved destination: the topology (if any) and the model it serves first (if any)."""

    topology: Topology | None
    model: str | None
    model_version: str = ""

    @classmethod
    def load(cls, topology_file: Path | None, *, model: str | None = None) -> Target:
        """Read ``topology_file`` if given; ``model`` overrides the first stage's model."""
        topology = None
        if topology_file is not None:
            from pipeline.topology.loader import load_topology

            topology = load_topology(topology_file)
        version = ""
        if model is None and topology is not None:
            first = topology.stages[0]
            model = getattr(first, "model", None)  # a DALI stage has no Triton model
            version = getattr(first, "model_version", "") or ""
            if routes := getattr(first, "routes", None):  # several models: their first route's
                model, version = routes[0].model, routes[0].model_version
        return cls(topology=topology, model=model, model_version=version)

    def input_topic(self, override: str | None, lane: str | None = None) -> str:
        """Where requests go: ``--topic``, else the topic of the topology's ``--lane``, else
        its ``input_topic``."""
        if override and lane:
            raise ConfigError("--topic and --lane both name the destination: give one")
        if override:
            return override
        if self.topology is None:
            raise ConfigError("say where to produce: --topic TOPIC or --topology FILE" + (" (--lane needs --topology)" if lane else ""))
        found = find_lane(self.topology.resolved_lanes(), lane)
        return self.topology.input_topic if found is None else found.topic

    def output_topics(self, overrides: list[str] | None) -> list[str]:
        """Where results come from: ``--topic``s, else the result and dead-letter topics."""
        if overrides:
            return list(dict.fromkeys(overrides))
        if self.topology is None:
            raise ConfigError("say what to consume: --topic TOPIC (repeatable) or --topology FILE")
        return [self.topology.result_topic, self.topology.dead_letter_topic]

    def kafka(self) -> KafkaSettings:
        """Kafka settings: the topology's bootstrap servers, else the environment/embedded stack.

        TLS and SASL options always come from the environment.
        """
        if self.topology is not None and self.topology.kafka.bootstrap_servers:
            return KafkaSettings().model_copy(
                update={"bootstrap_servers": self.topology.kafka.bootstrap_servers}
            )
        return resolve_endpoints(need=("kafka",)).kafka

    def triton(self) -> TritonSettings:
        """Triton settings, resolved like :meth:`kafka` (asked only when metadata is needed)."""
        if self.topology is not None and self.topology.triton.grpc_url:
            return TritonSettings().model_copy(update={"grpc_url": self.topology.triton.grpc_url})
        return resolve_endpoints(need=("triton",)).triton
