"""Resolve which Kafka, Triton and S3 a command talks to.

Order, per service: the environment (``PIPELINE_*``), else a running embedded
stack started by ``pipeline up`` (found through its state file), else an
error that says how to fix it. With ``PIPELINE_NO_EMBEDDED=1`` (``--no-embedded``)
the embedded stack is never used: a production shell whose variables are
missing must fail, not quietly talk to a throwaway broker on localhost.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import SecretStr

from pipeline.errors import ConfigError
from pipeline.processes import pid_alive
from pipeline.settings import Endpoints

NO_EMBEDDED_VARIABLE = "PIPELINE_NO_EMBEDDED"


def embedded_allowed() -> bool:
    """False when ``PIPELINE_NO_EMBEDDED`` is set to a true value (``--no-embedded`` sets it)."""
    return os.environ.get(NO_EMBEDDED_VARIABLE, "").strip().lower() not in ("1", "true", "yes", "on")


def state_dir() -> Path:
    """Where ``pipeline up`` keeps its state file and service logs."""
    override = os.environ.get("PIPELINE_STATE_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "streaming-inference-pipeline"


def state_file() -> Path:
    return state_dir() / "stack.json"


def write_stack_state(environment: dict[str, str], log_dir: Path) -> None:
    """Announce a running embedded stack (this process) to other `pipeline` commands."""
    state_dir().mkdir(parents=True, exist_ok=True)
    path = state_file()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "environment": environment, "log_dir": str(log_dir)}))
    tmp.chmod(0o600)  # holds the (throwaway) S3 keys
    tmp.replace(path)


def clear_stack_state() -> None:
    state_file().unlink(missing_ok=True)


def read_stack_state() -> dict[str, object] | None:
    """The running embedded stack's state, or None when none is running."""
    path = state_file()
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not isinstance(pid := state.get("pid"), int) or not pid_alive(pid):
        return None
    return state


def resolve_endpoints(*, need: tuple[str, ...] = ("kafka", "triton", "s3")) -> Endpoints:
    """Endpoints from the environment, completed from a running ``pipeline up`` stack.

    ``need`` names the services the caller cannot work without; a missing one
    is a :class:`ConfigError` with a one-line remedy.
    """
    endpoints = Endpoints()
    state = read_stack_state() if embedded_allowed() else None
    if state is not None:
        embedded = state.get("environment", {})
        assert isinstance(embedded, dict)
        if not endpoints.kafka.configured:
            endpoints.kafka.bootstrap_servers = embedded.get("PIPELINE_KAFKA_BOOTSTRAP_SERVERS")
        if not endpoints.triton.configured:
            endpoints.triton.grpc_url = embedded.get("PIPELINE_TRITON_GRPC_URL")
            endpoints.triton.http_url = embedded.get("PIPELINE_TRITON_HTTP_URL")
            endpoints.triton.metrics_url = embedded.get("PIPELINE_TRITON_METRICS_URL")
        if not endpoints.s3.configured:
            endpoints.s3.endpoint = embedded.get("PIPELINE_S3_ENDPOINT")
            endpoints.s3.bucket = embedded.get("PIPELINE_S3_BUCKET", endpoints.s3.bucket)
            if endpoints.s3.access_key is None and "AWS_ACCESS_KEY_ID" in embedded:
                endpoints.s3.access_key = SecretStr(embedded["AWS_ACCESS_KEY_ID"])
                endpoints.s3.secret_key = SecretStr(embedded["AWS_SECRET_ACCESS_KEY"])
    missing = [
        name
        for name, ok in (
            ("kafka", endpoints.kafka.configured),
            ("triton", endpoints.triton.configured),
            ("s3", endpoints.s3.configured),
        )
        if name in need and not ok
    ]
    if missing:
        variables = {
            "kafka": "PIPELINE_KAFKA_BOOTSTRAP_SERVERS",
            "triton": "PIPELINE_TRITON_GRPC_URL",
            "s3": "PIPELINE_S3_ENDPOINT",
        }
        names = ", ".join(variables[m] for m in missing)
        if not embedded_allowed():
            raise ConfigError(
                f"no {'/'.join(missing)} endpoint configured and the embedded stack is refused "
                f"({NO_EMBEDDED_VARIABLE}/--no-embedded): set {names} or pass the endpoint's flag"
            )
        raise ConfigError(
            f"no {'/'.join(missing)} endpoint configured: set {names} "
            "or start the embedded stack with `pipeline up`"
        )
    return endpoints
