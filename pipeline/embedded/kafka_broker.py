"""Apache Kafka 4.x in KRaft mode as the embedded broker: one node or a small loopback cluster.

Tansu (the default, see :mod:`pipeline.embedded.services`) speaks the Kafka protocol but has
no idempotent or transactional producers and no replication. This module runs the real
broker from Apache's own jars, which ``scripts/install.sh --kafka`` (or ``--test``)
resolves from Maven Central into ``.cache/kafka/<version>/lib``: nothing here downloads.

Each node is a combined broker + controller (``process.roles=broker,controller``) with a
static voter set, so one node and three nodes differ only in how many voters are listed.
The JVM is started directly (no ``kafka-server-start.sh``), so the supervised pid is the
broker itself and its resident memory can be read from ``/proc``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pipeline.embedded.kafka_security import SCRAM_MECHANISM, SUPER_USER, BrokerSecurity
from pipeline.embedded.process import ServiceStartError, SupervisedProcess, die_with_parent, free_ports, port_open
from pipeline.errors import PipelineError
from pipeline.settings import KafkaSettings

KAFKA_VERSION = "4.4.0"
"""Must equal ``kafka.version`` in scripts/kafka/pom.xml (a unit test checks)."""
KAFKA_LIB_ENV = "PIPELINE_KAFKA_LIB"
LOCALHOST = "127.0.0.1"
JVM_OPTS = ("-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:TieredStopAtLevel=1")
"""Small heap; C1 only (``TieredStopAtLevel=1``): on two busy cores it cut a node's start-up from
11-23 s to 8-14 s and its RSS by ~35 MiB, at the cost of peak throughput a test stack does not
need. ``$PIPELINE_KAFKA_JVM_OPTS`` (space-separated) replaces them, e.g. for benchmarks."""
_REPO_ROOT = Path(__file__).resolve().parents[2]
_INSTALL_HINT = "run `scripts/install.sh --test` (or `scripts/install.sh --kafka`) to fetch them from Maven Central"

# Kafka prints every config key at INFO each time a config object is built (thousands of
# lines per start); those two loggers are held at WARN so the log shows what happened.
LOG4J2_PROPERTIES = """\
status = warn
shutdownHook = disable
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = warn
logger.kafkaconfig.name = kafka.server.KafkaConfig
logger.kafkaconfig.level = warn
"""


def kafka_lib_dir() -> Path:
    """The folder of broker jars: ``$PIPELINE_KAFKA_LIB``, else the install script's cache."""
    override = os.environ.get(KAFKA_LIB_ENV)
    lib = Path(override) if override else _REPO_ROOT / ".cache" / "kafka" / KAFKA_VERSION / "lib"
    if not any(lib.glob("kafka_2.13-*.jar")):
        raise PipelineError(f"Apache Kafka {KAFKA_VERSION}'s broker jars are not in {lib}; {_INSTALL_HINT}")
    return lib


def installed() -> bool:
    """Whether this machine can run the embedded Apache Kafka: a ``java`` to run it and the
    broker's jars where :func:`kafka_lib_dir` looks (the install script fetches them
    wherever Java and Maven are present)."""
    try:
        kafka_lib_dir()
        java_binary()
    except PipelineError:
        return False
    return True


def java_binary() -> Path:
    """``$JAVA_HOME/bin/java``, else ``java`` on PATH: the broker needs Java 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return Path(home) / "bin" / "java"
    found = shutil.which("java")
    if found is None:
        raise PipelineError("Apache Kafka needs Java 17 or newer and no `java` is on PATH (apt-get install openjdk-17-jre-headless)")
    return Path(found)


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (``kafka-storage random-uuid``).

    One that starts with ``-`` would read as an option on the StorageTool command line."""
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not value.startswith("-"):
            return value


@dataclass(frozen=True)
class KafkaNode:
    """One combined broker + controller: its id, its two loopback ports and its log dir."""

    node_id: int
    broker_port: int
    controller_port: int
    data_dir: Path

    @property
    def voter(self) -> str:
        return f"{self.node_id}@{LOCALHOST}:{self.controller_port}"


def server_properties(
    node: KafkaNode, cluster: Sequence[KafkaNode], security: Mapping[str, str] | None = None
) -> str:
    """``server.properties`` for ``node`` in ``cluster`` (every node, ``node`` included);
    ``security`` (:meth:`BrokerSecurity.server_settings`) makes the client listener ``SASL_SSL``
    (or ``SSL``, TLS alone).

    Internal topics get the cluster's size as replication factor (at most 3) so a single
    node works at all and three nodes survive the loss of one; the transaction log's
    min ISR is 2 once there are two replicas to lose. ``group.initial.rebalance.delay.ms=0``:
    the 3 s default only helps a group whose members all start together, and makes every
    test's first poll wait. ``controlled.shutdown.enable=false``: the stack stops all nodes
    at once, and a controlled shutdown would wait for a quorum that is leaving too.

    Two limits of a production broker are relaxed, so that what the project must handle can
    reach it on this development broker as on Tansu: ``log.message.timestamp.after.max.ms``
    (Kafka 4's default refuses records stamped more than an hour ahead; before 4.0 there was
    no limit, and a topic may still raise it) and ``group.min.session.timeout.ms`` (6 s by
    default; the zombie test freezes a worker past a 3 s session).
    """
    if node not in cluster:
        raise ValueError(f"node {node.node_id} is not in the cluster")
    replicas = min(len(cluster), 3)
    listener = (security or {}).get("inter.broker.listener.name", "PLAINTEXT")  # SASL_SSL or SSL when secured
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": ",".join(n.voter for n in cluster),
        "listeners": f"{listener}://{LOCALHOST}:{node.broker_port},CONTROLLER://{LOCALHOST}:{node.controller_port}",
        "advertised.listeners": f"{listener}://{LOCALHOST}:{node.broker_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(node.data_dir),
        "num.partitions": "1",
        "default.replication.factor": str(replicas),  # -1 topics (the topology default) get every node, up to three
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min(replicas, 2)),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min(replicas, 2)),
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "log.message.timestamp.after.max.ms": str((1 << 63) - 1),
        "controlled.shutdown.enable": "false",
        **(security or {}),
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def _private(path: Path, content: bytes) -> Path:
    """Write ``content`` to ``path``, readable by this user only (it may hold passwords or keys)."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(content)
    return path


def _argfile(arguments: Sequence[str]) -> bytes:
    """A Java launcher ``@argfile``: one argument per line, each quoted (they may hold spaces)."""
    for argument in arguments:
        if any(c in argument for c in "\"\n\\"):
            raise ValueError("an argument file line may not hold quotes, backslashes or newlines")
    return "".join(f'"{argument}"\n' for argument in arguments).encode()


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (``VmRSS`` in ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise PipelineError(f"no VmRSS for pid {pid}")


class ApacheKafka:
    """A KRaft cluster of ``nodes`` combined nodes on loopback, data in a temporary folder.

    The stack runs :meth:`processes` itself (so they stop, die and restart like its other
    services), then calls :meth:`wait_ready`. While the cluster is first launched a node
    counts as healthy as soon as its JVM runs: a node of three cannot answer clients until
    a quorum of voters is up, and the stack starts its services one after another, so
    waiting per node would serialise three JVM start-ups on two cores. Readiness is then
    checked once for all: every broker registered and answering metadata requests. A node
    restarted later (``kill()`` then ``start()``) waits for exactly that before returning.
    """

    def __init__(
        self, log_dir: Path, nodes: int = 1, *, start_timeout: float = 120.0, security: BrokerSecurity | None = None
    ) -> None:
        if nodes < 1:
            raise ValueError("a Kafka cluster needs at least one node")
        self.lib = kafka_lib_dir()
        self.java = java_binary()
        self.log_dir = log_dir
        self.start_timeout = start_timeout
        self.work_dir = Path(tempfile.mkdtemp(prefix="pipeline-kafka-"))
        self.cluster_id = new_cluster_id()
        ports = free_ports(2 * nodes)  # distinct: a broker's and a controller's listener per node
        self.nodes = [
            KafkaNode(i, ports[2 * i - 2], ports[2 * i - 1], self.work_dir / f"node-{i}" / "data")
            for i in range(1, nodes + 1)
        ]
        self.security = security
        self.started_at: float | None = None
        self.startup_seconds: float | None = None
        self._processes: list[SupervisedProcess] = []
        self._launching = False

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{LOCALHOST}:{n.broker_port}" for n in self.nodes)

    def process_name(self, node: KafkaNode) -> str:
        """``kafka-broker`` for a single node, as with Tansu (fault tests look it up by that name)."""
        return "kafka-broker" if len(self.nodes) == 1 else f"kafka-broker-{node.node_id}"

    def _config_dir(self, node: KafkaNode) -> Path:
        return self.work_dir / f"node-{node.node_id}"

    def _jvm(self) -> list[str]:
        log4j = self.work_dir / "log4j2.properties"
        return [
            str(self.java),
            *(os.environ.get("PIPELINE_KAFKA_JVM_OPTS", "").split() or JVM_OPTS),
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            f"{self.lib}/*",
        ]

    def prepare(self) -> None:
        """Write each node's ``server.properties`` and format its storage (in parallel: one JVM each)."""
        self.started_at = time.monotonic()
        (self.work_dir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
        formats: list[tuple[KafkaNode, subprocess.Popen[bytes], Path]] = []
        for node in self.nodes:
            config = self._config_dir(node) / "server.properties"
            config.parent.mkdir(parents=True, exist_ok=True)
            tool = ["kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(config)]
            security = None
            if self.security is not None:
                security = self.security.server_settings(
                    _private(config.with_name("keystore.pem"), self.security.keystore_pem()),
                    _private(config.with_name("truststore.pem"), self.security.truststore_pem()),
                )
                # the users' passwords go in an argument file the launcher reads, not in argv
                tool = [f"@{_private(config.with_name('format.args'), _argfile([*tool, *self.security.format_arguments()]))}"]
            _private(config, server_properties(node, self.nodes, security).encode())
            log = self.log_dir / f"kafka-format-{node.node_id}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            argv = [*self._jvm(), *tool]
            with open(log, "wb") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
            formats.append((node, proc, log))
        for node, proc, log in formats:
            try:
                code = proc.wait(timeout=self.start_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = None
            if code != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                raise ServiceStartError(f"formatting Kafka node {node.node_id} failed ({code}); last lines of {log}:\n{tail}")

    def processes(self) -> list[SupervisedProcess]:
        """One supervised JVM per node (see the class docstring for when one is healthy)."""
        self._launching = True
        self._processes = [
            SupervisedProcess(
                name=self.process_name(node),
                argv=[*self._jvm(), "kafka.Kafka", str(self._config_dir(node) / "server.properties")],
                log_dir=self.log_dir,
                healthy=functools.partial(self._node_healthy, node),
                start_timeout=self.start_timeout,
                stop_timeout=15,
            )
            for node in self.nodes
        ]
        return list(self._processes)

    def _node_healthy(self, node: KafkaNode) -> bool:
        if self._launching:
            return True  # wait_ready checks the whole cluster once every node runs
        return port_open(LOCALHOST, node.broker_port) and cluster_answers(
            self.admin_settings(f"{LOCALHOST}:{node.broker_port}"), len(self.nodes)
        )

    def admin_settings(self, bootstrap_servers: str | None = None) -> KafkaSettings:
        """Client settings that log in as the super user (plaintext without security), at
        ``bootstrap_servers`` (default: every node). Every field given: nothing comes from
        the ``PIPELINE_KAFKA_*`` environment, which may be another broker's."""
        security, sasl = self.security, self.security is not None and self.security.sasl
        certificate = security.admin_certificate if security is not None else None
        return KafkaSettings(
            bootstrap_servers=bootstrap_servers or self.bootstrap_servers,
            security_protocol=("SASL_SSL" if sasl else "SSL") if security is not None else "PLAINTEXT",
            sasl_mechanism=SCRAM_MECHANISM if sasl else None,
            sasl_username=SUPER_USER if sasl else None,
            sasl_password=security.admin_password if security is not None and sasl else None,
            ssl_cafile=str(security.tls.ca_cert) if security is not None else None,
            ssl_certfile=str(certificate[0]) if certificate else None,
            ssl_keyfile=str(certificate[1]) if certificate else None,
        )

    def wait_ready(self) -> None:
        """Wait until every broker is registered and answers; records :attr:`startup_seconds`."""
        try:
            self._wait_ready()
        finally:
            self._launching = False

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            dead = [p for p in self._processes if not p.running()]
            if dead:
                raise ServiceStartError(f"{dead[0].name} exited while starting; last lines of {dead[0].log_path}:\n{dead[0].tail()}")
            if all(port_open(LOCALHOST, n.broker_port) for n in self.nodes) and cluster_answers(self.admin_settings(), len(self.nodes)):
                if self.started_at is not None:
                    self.startup_seconds = time.monotonic() - self.started_at
                return
            time.sleep(0.3)
        first = self._processes[0]
        raise ServiceStartError(
            f"Apache Kafka was not ready after {self.start_timeout:.0f}s; last lines of {first.log_path}:\n{first.tail()}"
        )

    def rss(self) -> list[int]:
        """Resident memory of each running node's JVM, in bytes."""
        return [rss_bytes(p.pid) for p in self._processes if p.pid is not None and p.running()]

    def summary(self) -> str:
        """One line with the figures people ask about: start-up time and memory per node."""
        rss = ", ".join(f"{r / 2**20:.0f}" for r in self.rss())
        took = f"{self.startup_seconds:.1f}s" if self.startup_seconds is not None else "?"
        return f"Apache Kafka {KAFKA_VERSION} ({len(self.nodes)} node(s)) ready in {took}; RSS MiB per node: {rss}"

    def terminate(self) -> None:
        """SIGTERM every node at once; the stack's ``stop()`` then reaps each.

        Stopped one by one, the last nodes keep trying to reach voters that are already
        gone until their own turn comes; signalled together, they leave together."""
        for process in self._processes:
            if process.pid is not None and process.running():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGTERM)

    def cleanup(self) -> None:
        """Remove the nodes' data and configs (after the processes have stopped)."""
        shutil.rmtree(self.work_dir, ignore_errors=True)


READY_PROBE_GROUP = "pipeline-embedded-ready"
"""A group no one joins: the readiness probe asks its coordinator to describe it."""


def cluster_answers(settings: KafkaSettings, expected_brokers: int, timeout: float = 5.0) -> bool:
    """True when a metadata request lists ``expected_brokers`` brokers and a group coordinator
    answers. A fresh cluster creates ``__consumer_offsets`` on the first FindCoordinator and
    answers every group's request with COORDINATOR_NOT_AVAILABLE, then NOT_COORDINATOR or
    COORDINATOR_LOAD_IN_PROGRESS, for about a second (measured: 0.9 s on one node): the
    stack is ready once that is over, so a first worker's log does not open with aiokafka's
    coordinator errors.

    aiokafka is asynchronous and the stack is started from synchronous code that may itself
    run inside an event loop, so the probe gets a loop of its own on a worker thread."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-probe")
    try:
        future = pool.submit(asyncio.run, _broker_count(settings, timeout))
        with contextlib.suppress(Exception):  # any failure just means "not yet"
            return future.result(timeout=timeout + 5) >= expected_brokers
        return False
    finally:
        pool.shutdown(wait=False)


async def _broker_count(settings: KafkaSettings, timeout: float) -> int:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**settings.client_kwargs(), request_timeout_ms=int(timeout * 1000))
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
        described = await admin.describe_consumer_groups([READY_PROBE_GROUP])
        if any(error_code for response in described for error_code, *_ in response.groups):
            return 0  # the group coordinator is not ready yet
        return len(cluster["brokers"])
    finally:
        await admin.close()
