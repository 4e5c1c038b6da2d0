"""The startup summary of ``pipeline run``: one block a person reads once, or one JSON record.

Why: the first thing an operator needs after start-up is where this process reads and
writes (topics, consumer groups), what it talks to (Kafka, Triton) and where to probe
it (health/metrics URL). Built once from the running stages, it is printed as a short
block in text mode and logged as one record with the same fields under ``summary`` in
JSON mode, so a log shipper gets it as data. It names no credential: endpoints are
host:port strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from pipeline.settings import Endpoints
from pipeline.topology.model import Topology
from workers.runtime.stage_io import StageIO


@dataclass(frozen=True)
class StageLine:
    name: str
    inputs: list[str]
    output: str
    group: str


@dataclass(frozen=True)
class StartupSummary:
    topology: str
    stages: list[StageLine]
    results: str
    dead_letters: str
    kafka: str
    triton: str
    health_url: str
    process: int = 1
    processes: int = 1

    @classmethod
    def of(
        cls,
        topology: Topology,
        stages: Sequence[StageIO],
        endpoints: Endpoints,
        health_url: str,
        *,
        process: int = 1,
        processes: int = 1,
    ) -> StartupSummary:
        return cls(
            topology=topology.name,
            stages=[StageLine(io.stage, io.input_topics, io.output_topic, io.group_id) for io in stages],
            results=topology.result_topic,
            dead_letters=topology.dead_letter_topic,
            kafka=str(endpoints.kafka.bootstrap_servers),
            triton=str(endpoints.triton.grpc_url),
            health_url=health_url,
            process=process,
            processes=processes,
        )

    def headline(self) -> str:
        names = ", ".join(stage.name for stage in self.stages)
        which = f" (process {self.process} of {self.processes})" if self.processes > 1 else ""
        return f"topology {self.topology} running stages {names}{which}; health/metrics on {self.health_url}"

    def lines(self) -> list[str]:
        """The headline, then one line per stage, the outputs and the endpoints."""
        stages = [f"  {s.name}: {', '.join(s.inputs)} -> {s.output}, group {s.group}" for s in self.stages]
        return [
            self.headline(),
            *stages,
            f"  results: {self.results}  dead letters: {self.dead_letters}",
            f"  kafka: {self.kafka}  triton: {self.triton}  processes: {self.processes}",
        ]

    def fields(self) -> dict[str, object]:
        return asdict(self)
