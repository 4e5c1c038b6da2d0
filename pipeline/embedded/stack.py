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
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from pydantic import SecretStr
from typing_extensions import Self

from pipeline.embedded.process import SupervisedProcess, free_port
from pipeline.embedded.services import (
    LOCALHOST,
    TlsFiles,
    TritonPorts,
    broker_process,
    s3_process,
    triton_process,
)
from pipeline.endpoints import state_dir
from pipeline.modelstore.repository import scan_repository
from pipeline.modelstore.store import ModelStore
from pipeline.settings import Endpoints, KafkaSettings, S3Settings, TritonSettings

Progress = Callable[[str], None]


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
    ``triton_tls`` serves Triton's gRPC port over TLS (a ``grpcs://`` URL).
    """

    def __init__(
        self,
        *,
        model_repository: Path | None = None,
        log_dir: Path | None = None,
        services: tuple[str, ...] = ("kafka", "s3", "triton"),
        s3: S3Settings | None = None,
        triton_tls: TlsFiles | None = None,
    ) -> None:
        unknown = set(services) - {"kafka", "s3", "triton"}
        if unknown:
            raise ValueError(f"unknown services: {sorted(unknown)}")
        if "triton" in services and "s3" not in services and s3 is None:
            raise ValueError("the embedded Triton needs an S3 model store: embedded or `s3=`")
        self.services = services
        self.triton_tls = triton_tls
        self.model_repository = model_repository or default_model_repository()
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="pipeline-stack-"))
        self.endpoints = Endpoints(
            kafka=KafkaSettings(bootstrap_servers=None),
            triton=TritonSettings(grpc_url=None),
            s3=s3 or S3Settings(endpoint=None),
        )
        self._processes: list[SupervisedProcess] = []

    @property
    def processes(self) -> list[SupervisedProcess]:
        return list(self._processes)

    def start(self, progress: Progress | None = None) -> Endpoints:
        say = progress or (lambda _msg: None)
        try:
            if "kafka" in self.services:
                say("starting Kafka-protocol broker (Tansu)")
                port = free_port()
                self._run(broker_process(port, self.log_dir))
                self.endpoints.kafka.bootstrap_servers = f"{LOCALHOST}:{port}"
            if "s3" in self.services:
                say("starting S3 model store (moto)")
                self._start_s3()
                say(f"pushing {self.model_repository} to s3://{self.endpoints.s3.bucket}")
                self._push_models()
            if "triton" in self.services:
                say("starting Triton Inference Server (models from S3)")
                self._start_triton()
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

    def _push_models(self) -> None:
        store = ModelStore(self.endpoints.s3)
        store.ensure_bucket()
        store.push(scan_repository(self.model_repository))

    def _start_triton(self) -> None:
        ports = TritonPorts(http=free_port(), grpc=free_port(), metrics=free_port())
        s3 = self.endpoints.s3
        s3_env = {"AWS_DEFAULT_REGION": s3.region}
        if s3.access_key is not None and s3.secret_key is not None:
            s3_env["AWS_ACCESS_KEY_ID"] = s3.access_key.get_secret_value()
            s3_env["AWS_SECRET_ACCESS_KEY"] = s3.secret_key.get_secret_value()
        self._run(
            triton_process(
                ports,
                s3.triton_repository_url(),
                self.log_dir,
                state_dir() / "triton-backends",
                s3_env,
                self.triton_tls,
            )
        )
        # This server's own TLS settings, whatever PIPELINE_TRITON_SSL_* says.
        tls = self.triton_tls
        triton = self.endpoints.triton
        triton.grpc_url = f"{'grpcs://' if tls else ''}{LOCALHOST}:{ports.grpc}"
        triton.ssl = False
        triton.ssl_root_cert = tls.ca_cert if tls else None
        triton.ssl_client_key = triton.ssl_client_cert = None
        self.endpoints.triton.http_url = f"{LOCALHOST}:{ports.http}"
        self.endpoints.triton.metrics_url = f"http://{LOCALHOST}:{ports.metrics}/metrics"

    def dead(self) -> list[SupervisedProcess]:
        """Services that have exited on their own (the supervisor reports them)."""
        return [p for p in self._processes if not p.running()]

    def stop(self) -> None:
        """Stop every service, newest first; safe to call twice."""
        while self._processes:
            self._processes.pop().stop()

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
