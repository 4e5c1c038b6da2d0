"""The embedded stack: broker, S3 model store and Triton, started in dependency order.

Triton reads its model repository *from the S3 bucket* (``s3://…/models``),
exactly as it reads a MinIO bucket in production; the local ``sample_models/``
folder is only the source that is pushed to the bucket first.

Start it from the main thread: children are tied to the thread that spawned
them (``PR_SET_PDEATHSIG``), which is what guarantees no orphans.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, cast

from pydantic import SecretStr
from typing_extensions import Self

from pipeline.embedded import kafka_broker
from pipeline.embedded.kafka_broker import KAFKA_VERSION, ApacheKafka
from pipeline.embedded.process import SupervisedProcess, free_port, free_ports
from pipeline.embedded.services import (
    LOCALHOST,
    TlsFiles,
    TritonPorts,
    broker_process,
    s3_environment,
    s3_process,
    triton_process,
)
from pipeline.endpoints import state_dir
from pipeline.errors import ConfigError
from pipeline.modelstore.repository import scan_repository
from pipeline.modelstore.store import ModelStore
from pipeline.settings import Endpoints, KafkaSettings, S3Settings, TritonSettings

Progress = Callable[[str], None]
BrokerStorage = Literal["s3", "memory"]
Broker = Literal["tansu", "kafka"]
BROKER_STORAGE_ENV = "PIPELINE_EMBEDDED_BROKER_STORAGE"
BROKER_ENV = "PIPELINE_EMBEDDED_BROKER"


def default_broker() -> Broker:
    """The broker ``pipeline up`` and ``pipeline run`` start when none is named:
    ``$PIPELINE_EMBEDDED_BROKER`` (``kafka`` or ``tansu``), else Apache Kafka wherever it is
    installed (Java and its jars: :func:`pipeline.embedded.kafka_broker.installed`), else Tansu.

    Apache Kafka first (issue 25): it is what users run, and Tansu 0.6 answers some fetches
    past a record while several producers write one partition (every consumer here guards
    against that, :mod:`pipeline.kafka.continuity`) and has no idempotent or transactional
    producers. Tansu stays the fallback where there is no Java: one 11 MiB process that starts
    in 0.2 s, against Apache Kafka's 280 MiB and 5 s (measured 2026-11-27, this machine)."""
    chosen = os.environ.get(BROKER_ENV, "").strip().lower()
    if chosen:
        if chosen not in ("tansu", "kafka"):
            raise ConfigError(f"{BROKER_ENV}={chosen!r}: expected 'kafka' or 'tansu'")
        return cast(Broker, chosen)
    return "kafka" if kafka_broker.installed() else "tansu"


def default_model_repository() -> Path:
    """``./sample_models`` when run from a checkout, else the one beside the package."""
    here = Path.cwd() / "sample_models"
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[2] / "sample_models"


class EmbeddedStack:
    """Start, health-check and stop the three services; a context manager.

    ``services`` selects a subset (e.g. only ``("kafka",)`` for a broker test);
    Triton needs S3 and is started after the models are pushed to it; pass
    ``s3=`` to run the embedded Triton against an external store instead.
    ``triton_tls`` serves Triton's gRPC port over TLS (a ``grpcs://`` URL);
    ``triton_args`` are more ``tritonserver`` flags (e.g. ``--trace-config ...``).

    ``broker_storage``: where the broker keeps its log. ``"memory"`` (the default) keeps
    it in the broker process: a restart starts empty. ``"s3"`` puts it in ``broker_bucket``
    of the stack's S3 store (embedded or ``s3=``), so a broker that crashes and restarts
    on the same port has every acknowledged record and committed offset: what broker
    fault tests need. It is not the default because the S3 store here is moto, a Python
    server: on a 2-core machine each produce or commit round trip took ~9 ms instead of
    ~1 ms, a raw Kafka echo moved 12,000 records/s instead of 26,000, and at 2,500/s
    offered its latency grew without bound (``benchmarks.stateless``, case a). Unset, it is
    ``$PIPELINE_EMBEDDED_BROKER_STORAGE`` (``memory`` or ``s3``), else ``memory``.

    ``broker``: ``"tansu"`` (the default: one small binary, starts in well under a second) or
    ``"kafka"``, Apache Kafka in KRaft mode from the jars ``scripts/install.sh --kafka`` fetches:
    slower to start and heavier, but it has what Tansu lacks (idempotent and transactional
    producers, replication). ``brokers`` > 1 starts that many Kafka nodes as one cluster.
    Apache Kafka keeps its log on local disk, so ``broker_storage`` applies to Tansu only.
    """

    def __init__(
        self,
        *,
        model_repository: Path | None = None,
        log_dir: Path | None = None,
        services: tuple[str, ...] = ("kafka", "s3", "triton"),
        s3: S3Settings | None = None,
        triton_tls: TlsFiles | None = None,
        triton_args: Sequence[str] = (),
        broker_storage: BrokerStorage | None = None,
        broker_bucket: str | None = None,
        broker: Broker = "tansu",
        brokers: int = 1,
        tritons: int = 1,
    ) -> None:
        if broker not in ("tansu", "kafka"):
            raise ValueError(f"unknown broker {broker!r}: 'tansu' or 'kafka'")
        if brokers < 1 or (brokers > 1 and broker != "kafka"):
            raise ConfigError("more than one broker needs broker='kafka' (Tansu runs one node)")
        if broker == "kafka" and broker_storage == "s3":
            raise ConfigError("Apache Kafka keeps its log on local disk: broker_storage='s3' is for Tansu")
        if tritons < 1:
            raise ConfigError(f"tritons must be at least 1, not {tritons}")
        self.broker, self.brokers, self.tritons = broker, brokers, tritons
        self.triton_replicas: list[TritonSettings] = []
        """Each Triton server's own endpoints; ``endpoints.triton.grpc_url`` lists them all
        (comma-separated), which is how a stage spreads over them."""
        self.kafka: ApacheKafka | None = None
        unknown = set(services) - {"kafka", "s3", "triton"}
        if unknown:
            raise ValueError(f"unknown services: {sorted(unknown)}")
        if "triton" in services and "s3" not in services and s3 is None:
            raise ValueError("the embedded Triton needs an S3 model store: embedded or `s3=`")
        self.services = services
        self.triton_tls = triton_tls
        self.triton_args = list(triton_args)
        self.model_repository = model_repository or default_model_repository()
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="pipeline-stack-"))
        self.endpoints = Endpoints(
            kafka=KafkaSettings(bootstrap_servers=None),
            triton=TritonSettings(grpc_url=None),
            s3=s3 or S3Settings(endpoint=None),
        )
        has_s3 = "s3" in services or s3 is not None
        # Apache Kafka keeps its log in its own log.dirs on disk; "memory" only says S3 is not used.
        self.broker_storage = _broker_storage(broker_storage, has_s3=has_s3) if broker == "tansu" else "memory"
        # One bucket per broker: brokers sharing a store never read each other's log.
        self.broker_bucket = broker_bucket or f"kafka-log-{secrets.token_hex(4)}"
        self._processes: list[SupervisedProcess] = []

    @property
    def processes(self) -> list[SupervisedProcess]:
        return list(self._processes)

    def start(self, progress: Progress | None = None) -> Endpoints:
        say = progress or (lambda _msg: None)
        try:
            # S3 first: the broker may keep its log there.
            if "s3" in self.services:
                say("starting S3 model store (moto)")
                self._start_s3()
                say(f"pushing {self.model_repository} to s3://{self.endpoints.s3.bucket}")
                self._push_models()
            if "kafka" in self.services and self.broker == "kafka":
                say(f"starting Apache Kafka {KAFKA_VERSION} (KRaft, {self.brokers} node(s))")
                self._start_apache_kafka()
                assert self.kafka is not None
                say(self.kafka.summary())
            elif "kafka" in self.services:
                say(f"starting Kafka-protocol broker (Tansu, log in {self.broker_storage})")
                self._start_broker()
            if "triton" in self.services:
                for index in range(self.tritons):
                    say(f"starting Triton Inference Server {index + 1} of {self.tritons} (models from S3)")
                    self._start_triton(index)
        except BaseException:
            self.stop()
            raise
        return self.endpoints

    def _run(self, process: SupervisedProcess) -> None:
        self._processes.append(process)
        process.start()

    def _start_s3(self) -> None:
        port = free_port()
        self._run(s3_process(port, self.log_dir))
        s3 = self.endpoints.s3
        s3.endpoint = f"http://{LOCALHOST}:{port}"
        # moto accepts any credentials; random ones prove nothing relies on defaults.
        s3.access_key = SecretStr(f"embedded-{secrets.token_hex(4)}")
        s3.secret_key = SecretStr(secrets.token_hex(16))

    def _start_broker(self) -> None:
        port = free_port()
        log_store = None
        if self.broker_storage == "s3":
            log_store = self.endpoints.s3.model_copy(update={"bucket": self.broker_bucket})
            ModelStore(log_store).ensure_bucket()
        self._run(broker_process(port, self.log_dir, log_store))
        self.endpoints.kafka.bootstrap_servers = f"{LOCALHOST}:{port}"

    def _start_apache_kafka(self) -> None:
        self.kafka = ApacheKafka(self.log_dir, self.brokers)
        self.kafka.prepare()
        for process in self.kafka.processes():
            self._run(process)
        self.kafka.wait_ready()
        self.endpoints.kafka.bootstrap_servers = self.kafka.bootstrap_servers

    def _push_models(self) -> None:
        store = ModelStore(self.endpoints.s3)
        store.ensure_bucket()
        store.push(scan_repository(self.model_repository))

    def _start_triton(self, index: int = 0) -> None:
        """One more Triton on the same store: ``triton``, then ``triton-2``, ``triton-3``..."""
        http, grpc, metrics = free_ports(3)
        ports = TritonPorts(http=http, grpc=grpc, metrics=metrics)
        s3 = self.endpoints.s3
        self._run(
            triton_process(
                ports,
                s3.triton_repository_url(),
                self.log_dir,
                state_dir() / "triton-backends",
                s3_environment(s3),
                self.triton_tls,
                self.triton_args,
                name="triton" if index == 0 else f"triton-{index + 1}",
            )
        )
        # This server's own TLS settings, whatever PIPELINE_TRITON_SSL_* says.
        tls = self.triton_tls
        replica = TritonSettings(
            grpc_url=f"{'grpcs://' if tls else ''}{LOCALHOST}:{ports.grpc}",
            http_url=f"{LOCALHOST}:{ports.http}",
            metrics_url=f"http://{LOCALHOST}:{ports.metrics}/metrics",
            ssl=False,
            ssl_root_cert=tls.ca_cert if tls else None,
            ssl_client_key=None,
            ssl_client_cert=None,
        )
        self.triton_replicas.append(replica)
        # The stack's Triton: every replica's gRPC endpoint; the first one's HTTP and metrics.
        first = self.triton_replicas[0]
        triton = self.endpoints.triton
        triton.grpc_url = ",".join(str(r.grpc_url) for r in self.triton_replicas)
        triton.ssl = False
        triton.ssl_root_cert = tls.ca_cert if tls else None
        triton.ssl_client_key = triton.ssl_client_cert = None
        triton.http_url, triton.metrics_url = first.http_url, first.metrics_url

    def process(self, name: str) -> SupervisedProcess:
        """The running service called ``name`` (``kafka-broker``, ``s3``, ``triton``)."""
        found = [p for p in self._processes if p.name == name]
        if not found:
            raise KeyError(f"no service {name!r} in this stack")
        return found[0]

    def dead(self) -> list[SupervisedProcess]:
        """Services that have exited on their own (the supervisor reports them)."""
        return [p for p in self._processes if not p.running()]

    def stop(self) -> None:
        """Stop every service, newest first; safe to call twice."""
        if self.kafka is not None:
            self.kafka.terminate()
        while self._processes:
            self._processes.pop().stop()
        if self.kafka is not None:
            self.kafka.cleanup()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]


def _broker_storage(chosen: BrokerStorage | None, *, has_s3: bool) -> BrokerStorage:
    """``chosen``, else the environment's choice, else memory."""
    value = chosen or os.environ.get(BROKER_STORAGE_ENV) or "memory"
    if value not in ("s3", "memory"):
        raise ConfigError(f"{BROKER_STORAGE_ENV} must be 's3' or 'memory', not {value!r}")
    if value == "s3" and not has_s3:
        raise ConfigError("the broker keeps its log in S3 only in a stack with an S3 store (embedded or `s3=`)")
    return cast(BrokerStorage, value)


def child_pids_of(pid: int) -> list[int]:
    """Every live process whose parent is ``pid`` (for tests that check for orphans)."""
    children: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(entry))
    return children
