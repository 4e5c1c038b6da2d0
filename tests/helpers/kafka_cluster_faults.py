"""A three-broker Apache Kafka cluster of one test module's own, and the fault campaign's runs on it.

Replication faults (tests/integration/test_replication_faults.py) need what the session's
single broker cannot give: topics with three replicas, ``min.insync.replicas=2``, producers
with ``acks=all`` and idempotence, and brokers to kill, freeze and restart one at a time while
the others serve. This module starts that cluster on loopback (``EmbeddedStack(brokers=3)``),
points a CLI environment at it (the session's S3 store and Triton as usual), runs each
workload on a topology that asks for replicated topics (``kafka.replication_factor: 3`` and
``kafka.topic_configs: {min.insync.replicas: 2}``, which its worker creates them with) and
checks every topic has them, sends the workloads' records through idempotent producers, and
answers what a fault needs to know: which partition is busiest, who leads it, when leadership
has moved, and when every replica is back in sync.

The workloads' own producers (``tests/helpers/kafka_io.produce``) are not idempotent; the
records are sent here by an idempotent ``acks=all`` producer, as the issue asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import TopicPartition

from pipeline.embedded.kafka_broker import LOCALHOST
from pipeline.embedded.process import SupervisedProcess
from pipeline.embedded.stack import EmbeddedStack
from pipeline.errors import PipelineError
from pipeline.kafka.topic_partitions import topic_partitions
from pipeline.settings import Endpoints, KafkaSettings, S3Settings, TritonSettings
from pipeline.topology.loader import load_topology
from tests.helpers.fault_compare import RunOutputs
from tests.helpers.fault_workloads import Run, Workload, checked_references, finish_all, start_workers, wait_for_results
from tests.helpers.kafka_io import produce
from tests.helpers.topology_process import PipelineProcess

BROKERS = 3
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2
PARTITIONS = 2
"""The workloads' own partition count (tests/helpers/fault_workloads.py)."""
REPLICATED: dict[str, Any] = {
    "kafka": {
        "partitions": PARTITIONS,
        "replication_factor": REPLICATION_FACTOR,
        "topic_configs": {"min.insync.replicas": MIN_INSYNC_REPLICAS},
    }
}
"""The topology-level settings of every run here: its topics replicated on all three brokers."""
ADMIN_TIMEOUT_MS = 3000
"""An admin request to a frozen broker waits this long, then the next broker is asked."""


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class PartitionState:
    leader: int
    """-1: none (every replica that could lead is gone)."""
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def in_sync(self) -> bool:
        return self.leader >= 0 and set(self.isr) >= set(self.replicas)


class Cluster:
    """The cluster's stack, its bootstrap list and a CLI environment pointed at it."""

    def __init__(self, stack: EmbeddedStack, env: dict[str, str]) -> None:
        assert stack.kafka is not None
        self.stack = stack
        self.kafka = stack.kafka
        self.env = env
        self.bootstrap = self.kafka.bootstrap_servers
        self.node_ids = [node.node_id for node in self.kafka.nodes]

    def process(self, node_id: int) -> SupervisedProcess:
        return self.stack.process(f"kafka-broker-{node_id}")

    def bootstrap_without(self, node_id: int | None) -> str:
        """The bootstrap list less ``node_id``: a frozen broker accepts connections and never
        answers, so a client asking it first would wait out its request timeout."""
        return ",".join(f"{LOCALHOST}:{n.broker_port}" for n in self.kafka.nodes if n.node_id != node_id)

    # ---------------------------------------------------------------- what the cluster says

    def partitions(
        self, topics: Sequence[str] | None = None, *, without: int | None = None
    ) -> dict[TopicPartition, PartitionState]:
        """Leader, replicas and in-sync replicas of each partition of ``topics`` (None: all)."""
        return asyncio.run(_describe(self.bootstrap_without(without), topics))

    def broker_config(self, name: str) -> str:
        """One broker setting as node 1 reports it."""
        return asyncio.run(_broker_config(self.bootstrap, self.node_ids[0], name))

    def session_timeout_s(self) -> float:
        """``broker.session.timeout.ms``: a broker silent that long is fenced by the controller
        and its partitions get new leaders (KRaft's default, 9 s: the embedded cluster sets none)."""
        return int(self.broker_config("broker.session.timeout.ms")) / 1000

    def busiest(self, topics: Sequence[str], window_s: float = 1.0) -> tuple[TopicPartition, float]:
        """The partition of ``topics`` that took the most records over ``window_s``, and its rate."""
        grown = asyncio.run(_growth(self.bootstrap, topics, window_s))
        partition = max(grown, key=lambda tp: grown[tp])
        return partition, grown[partition] / window_s

    def leader(self, partition: TopicPartition) -> int:
        return self.partitions([partition.topic])[partition].leader

    def wait_led_elsewhere(self, partition: TopicPartition, node_id: int, timeout: float = 60.0) -> float:
        """Seconds until ``partition`` has a leader other than ``node_id``."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with contextlib.suppress(Exception):  # a broker gone or frozen mid-request: ask again
                state = self.partitions([partition.topic], without=node_id).get(partition)
                if state is not None and state.leader not in (-1, node_id):
                    return time.monotonic() - started
            time.sleep(0.1)
        raise AssertionError(f"{partition} still led by {node_id} (or by none) after {timeout:.0f} s")

    def wait_in_sync(self, timeout: float = 90.0) -> float:
        """Seconds until every broker is registered and every partition of every topic (the
        group offsets' included) has a leader and all its replicas in sync."""
        started = time.monotonic()
        behind: list[str] = []
        while time.monotonic() - started < timeout:
            with contextlib.suppress(Exception):
                if asyncio.run(_broker_count(self.bootstrap)) == len(self.node_ids):
                    states = self.partitions()
                    behind = [f"{tp.topic}-{tp.partition} {s}" for tp, s in states.items() if not s.in_sync]
                    if states and not behind:
                        return time.monotonic() - started
            time.sleep(0.2)
        raise AssertionError(f"replicas not in sync after {timeout:.0f} s: {behind[:5]}")

    def heal(self) -> None:
        """Every broker running and answering, every replica in sync: each fault starts from a
        whole cluster whatever the one before it left."""
        for node_id in self.node_ids:
            process = self.process(node_id)
            process.resume()  # a no-op unless a failed test left it frozen
            if not process.running():
                process.start()
        self.wait_in_sync()

    # ---------------------------------------------------------------- runs on the cluster

    def replicated_topics(self, topology_path: Path) -> list[str]:
        """The topology's topics, as its worker created them: checked to have three replicas
        and ``min.insync.replicas`` at 2 (the topology's ``kafka`` section asks for both)."""
        topology = load_topology(topology_path, self.env)
        assert topology.kafka.topic_settings() == {"min.insync.replicas": str(MIN_INSYNC_REPLICAS)}
        topics = [*topology.topics(), *topology.state_topics()]
        self._check_replicated(topics, topology.kafka.partitions)
        return topics

    def _check_replicated(self, topics: list[str], partitions: int) -> None:
        """Every partition of ``topics`` with three replicas, every topic with ``min.insync.replicas``
        at 2. Created on the controller first, the topics reach each broker a moment later: a
        broker asked before it has learned of one answers without it, so this asks again."""
        wanted = dict.fromkeys(topics, str(MIN_INSYNC_REPLICAS))
        deadline = time.monotonic() + 30
        while True:
            states = self.partitions(topics)
            configs = asyncio.run(_topic_configs(self.bootstrap, topics, "min.insync.replicas"))
            if (len(states) == len(topics) * partitions and configs == wanted) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(states) == len(topics) * partitions, f"partitions of {topics}: {sorted(states)}"
        for tp, state in states.items():
            assert len(state.replicas) == REPLICATION_FACTOR, f"{tp}: replicas {state.replicas}"
        assert configs == wanted, f"min.insync.replicas per topic: {configs}"

    def start_runs(self, workloads: Sequence[Workload], tmp_path: Path) -> list[Run]:
        """``fault_workloads.start_runs`` on replicated topics: the workers, started side by
        side, create them (the topology's ``kafka`` section); then each is checked."""
        runs = []
        for workload in workloads:
            topology = workload.topology(tmp_path, **REPLICATED)
            log = tmp_path / f"{workload.kind}-first.log"
            runs.append(Run(workload, topology, self.env, tmp_path, PipelineProcess(topology, self.env, log)))
        start_workers([run.worker for run in runs])  # each creates its topology's topics, replicated
        for run in runs:
            self.replicated_topics(run.topology.path)
        return runs

    def producing_runs(
        self, workloads: Sequence[Workload], tmp_path: Path, *, seconds: float, held_back: int = 0
    ) -> list[Run]:
        """``fault_workloads.producing_runs`` on the cluster, the records sent by an idempotent
        ``acks=all`` producer; returns once every worker has produced some results."""
        runs = self.start_runs(workloads, tmp_path)
        for run in runs:
            run.producer = producing(run, self.bootstrap, seconds=seconds, held_back=held_back)
        wait_for_results(runs, 40)
        return runs

    def references(self, workloads: Sequence[Workload], tmp_path: Path) -> dict[str, RunOutputs]:
        """``fault_workloads.reference_outputs`` on the same replicated topics: each workload
        once without a fault, complete, with neither dead letters nor duplicates."""
        runs = self.start_runs(workloads, tmp_path)
        for run in runs:
            run.producer = producing(run, self.bootstrap, seconds=0)
        return checked_references(runs, finish_all(runs, self.bootstrap))


def run_topics(runs: Iterable[Run], env: dict[str, str]) -> list[str]:
    """Every topic of the runs' topologies (state topics included)."""
    topics: list[str] = []
    for run in runs:
        topology = load_topology(run.topology.path, env)
        topics += [*topology.topics(), *topology.state_topics()]
    return topics


def producing(run: Run, bootstrap: str, *, seconds: float, held_back: int = 0) -> threading.Thread:
    """``Workload.producing`` through an idempotent ``acks=all`` producer: the run's records
    evenly over ``seconds`` (0: at once), the last ``held_back`` only once ``run.release`` is
    set (by ``Run.finish``), where the workload's tail may wait."""
    records = run.workload.records
    held = held_back if run.workload.tail_can_wait else 0
    now, tail = records[: len(records) - held], records[len(records) - held :]
    rate = len(now) / seconds if seconds > 0 else 0.0
    topic = run.topology.input_topic

    def send() -> None:
        asyncio.run(produce(bootstrap, topic, now, rate=rate, idempotent=True))
        if tail and run.release.wait(timeout=600):
            asyncio.run(produce(bootstrap, topic, tail, idempotent=True))

    thread = threading.Thread(target=send, name=f"produce-{run.workload.kind}")
    thread.start()
    return thread


def longest_pause_s(out: RunOutputs, start_ms: int, end_ms: int) -> float:
    """The longest time without a result written that began between ``start_ms`` and ``end_ms``
    (the fault): how long the topology stood still while the cluster failed over."""
    stamps = sorted({r.timestamp for records in out.results.values() for r in records})
    points = [start_ms, *[s for s in stamps if s > start_ms]]
    gaps = [b - a for a, b in itertools.pairwise(points) if a <= end_ms]
    return max(gaps, default=0) / 1000


@contextlib.contextmanager
def start_cluster(s3: S3Settings, triton: TritonSettings, log_dir: Path, state_dir: Path) -> Iterator[Cluster]:
    """Start the cluster (failing loudly when it cannot: nothing is skipped) and stop it on leaving.

    The environment is :func:`tests.conftest.cli_env`'s, pointed at this cluster instead of
    the session's broker, with idempotent producers asked for rather than detected."""
    stack = EmbeddedStack(services=("kafka",), broker="kafka", brokers=BROKERS, log_dir=log_dir)
    try:
        stack.start()
    except PipelineError as exc:
        raise AssertionError(f"the {BROKERS}-broker Apache Kafka cluster did not start: {exc}") from exc
    try:
        assert stack.kafka is not None
        print(f"\n{stack.kafka.summary()}")
        endpoints = Endpoints(
            kafka=KafkaSettings(bootstrap_servers=stack.kafka.bootstrap_servers), s3=s3, triton=triton
        )
        env = {
            **os.environ,
            **endpoints.environment(),
            "PIPELINE_STATE_DIR": str(state_dir),
            "PIPELINE_KAFKA_IDEMPOTENCE": "true",
        }
        yield Cluster(stack, env)
    finally:
        stack.stop()


# -------------------------------------------------------------------- admin requests


async def _admin(bootstrap: str) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=ADMIN_TIMEOUT_MS)
    await admin.start()
    return admin


async def _describe(bootstrap: str, topics: Sequence[str] | None) -> dict[TopicPartition, PartitionState]:
    admin = await _admin(bootstrap)
    try:
        described = await admin.describe_topics(list(topics) if topics is not None else None)
    finally:
        await admin.close()
    return {
        TopicPartition(topic["topic"], p["partition"]): PartitionState(
            p["leader"], tuple(p["replicas"]), tuple(p["isr"])
        )
        for topic in described
        for p in topic["partitions"]
    }


async def _broker_count(bootstrap: str) -> int:
    admin = await _admin(bootstrap)
    try:
        return len((await admin.describe_cluster())["brokers"])
    finally:
        await admin.close()


async def _broker_config(bootstrap: str, node_id: int, name: str) -> str:
    admin = await _admin(bootstrap)
    try:
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, str(node_id), {name: None})]
        )
    finally:
        await admin.close()
    [(_error, _message, _type, _name, entries)] = response.resources
    return str(entries[0][1])


async def _topic_configs(bootstrap: str, topics: list[str], name: str) -> dict[str, str | None]:
    """Setting ``name`` of each topic (None where the broker answered with an error: a topic
    it has not learned of yet)."""
    admin = await _admin(bootstrap)
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t, {name: None}) for t in topics]
        )
    finally:
        await admin.close()
    return {
        resource_name: str(entries[0][1]) if error == 0 and entries else None
        for response in responses
        for error, _message, _type, resource_name, entries in response.resources
    }


async def _growth(bootstrap: str, topics: Sequence[str], window_s: float) -> dict[TopicPartition, int]:
    """Records appended to each partition of ``topics`` over ``window_s``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [
            TopicPartition(topic, p) for topic in topics for p in sorted(await topic_partitions(consumer, topic) or ())
        ]
        before = await consumer.end_offsets(partitions)
        await asyncio.sleep(window_s)
        after = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    return {tp: after[tp] - before[tp] for tp in partitions}
