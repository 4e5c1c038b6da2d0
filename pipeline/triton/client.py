"""The one place that builds Triton gRPC clients (sync and asyncio).

Every caller (the admin wrapper, the stage backends, tests, benchmarks) gets
its channel from here, so they all honour the same settings: TLS when the URL
says ``grpcs://`` or ``PIPELINE_TRITON_SSL`` is on, certificates from
``PIPELINE_TRITON_SSL_*`` files, message-size limits, quick reconnects and
keepalive. Before it existed only the admin client honoured TLS and the
workers silently spoke plaintext.

``tritonclient`` uses ``channel_args``, when given, *instead of* its own
defaults (message sizes and keepalive options are then ignored), so
:func:`channel_args` returns the complete list. Certificate files are read
here, not by ``tritonclient``, so a bad path is a one-line
:class:`~pipeline.errors.ConfigError` rather than a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_aio

from pipeline.errors import ConfigError
from pipeline.observability.tracing import CallSpan
from pipeline.settings import TritonSettings
from pipeline.triton.replicas import replica_spec

# gRPC reconnects with exponential backoff up to two minutes; keep retries
# quick so a restarted server is seen the moment it listens again.
RECONNECT_BACKOFF_MS = {"initial": 200, "min": 200, "max": 1000}

# At most this many keepalive pings while no data flows (gRPC's and tritonclient's
# default). Triton's server defaults allow one data-less ping per 5 minutes and
# answer a third early one with GOAWAY "too_many_pings", failing calls in flight;
# 0 (unlimited) would hit that on any call that runs longer than 3 keepalive periods.
MAX_PINGS_WITHOUT_DATA = 2

_TLS_SCHEMES = ("grpcs", "https")


def grpc_target(url: str) -> tuple[str, bool]:
    """``host:port`` for gRPC, and whether TLS is implied by a ``grpcs://``/``https://`` scheme."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        return scheme.rstrip("/"), False
    return rest.rstrip("/"), scheme.lower() in _TLS_SCHEMES


def channel_args(settings: TritonSettings) -> list[tuple[str, Any]]:
    """The complete gRPC channel options (they replace tritonclient's defaults)."""
    return [
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["initial"]),
        ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["min"]),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["max"]),
        ("grpc.keepalive_time_ms", settings.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(settings.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", MAX_PINGS_WITHOUT_DATA),
    ]


def _read_pem(path: Path | None, variable: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"cannot read {variable} file {str(path)!r}: {reason}") from None


def _credentials(settings: TritonSettings) -> grpc.ChannelCredentials:
    if (settings.ssl_client_key is None) != (settings.ssl_client_cert is None):
        raise ConfigError(
            "mutual TLS needs both PIPELINE_TRITON_SSL_CLIENT_KEY "
            "and PIPELINE_TRITON_SSL_CLIENT_CERT"
        )
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem(settings.ssl_root_cert, "PIPELINE_TRITON_SSL_ROOT_CERT"),
        private_key=_read_pem(settings.ssl_client_key, "PIPELINE_TRITON_SSL_CLIENT_KEY"),
        certificate_chain=_read_pem(settings.ssl_client_cert, "PIPELINE_TRITON_SSL_CLIENT_CERT"),
    )


def _connection(settings: TritonSettings) -> tuple[str, grpc.ChannelCredentials | None]:
    """(``host:port``, TLS credentials or None for plaintext), checked."""
    if not settings.grpc_url:
        raise ConfigError("no Triton endpoint configured: set PIPELINE_TRITON_GRPC_URL")
    if replica_spec(settings.grpc_url).several:
        raise ConfigError(
            f"Triton URL {settings.grpc_url!r} names several replicas and this talks to one server: "
            "give it one of them (the stages spread over all of them)"
        )
    target, scheme_tls = grpc_target(settings.grpc_url)
    if not target:
        raise ConfigError(f"Triton URL {settings.grpc_url!r} has no host:port")
    if settings.ssl or scheme_tls:
        return target, _credentials(settings)
    if settings.ssl_root_cert or settings.ssl_client_key or settings.ssl_client_cert:
        raise ConfigError(
            f"Triton TLS certificates are configured but {settings.grpc_url!r} is plaintext: "
            "use a grpcs:// URL or set PIPELINE_TRITON_SSL=true"
        )
    return target, None


def sync_client(settings: TritonSettings) -> triton_grpc.InferenceServerClient:
    """A blocking client for ``settings.grpc_url``; close it (or use it as a context manager)."""
    target, creds = _connection(settings)
    args = channel_args(settings)
    return triton_grpc.InferenceServerClient(target, creds=creds, channel_args=args)


def aio_client(settings: TritonSettings) -> triton_aio.InferenceServerClient:
    """An asyncio client for ``settings.grpc_url``; ``await client.close()`` when done."""
    target, creds = _connection(settings)
    args = channel_args(settings)
    return triton_aio.InferenceServerClient(target, creds=creds, channel_args=args)


def triton_call_span(settings: TritonSettings, model: str, model_version: str = "") -> CallSpan:
    """How a ``ModelInfer`` call is traced: a CLIENT span with the RPC semantic-convention
    attributes (``rpc.*``, ``server.*``) and the model."""
    target, _ = grpc_target(settings.grpc_url or "")
    host, _, port = target.rpartition(":")
    attributes: dict[str, str | int] = {
        "rpc.system": "grpc",
        "rpc.service": "inference.GRPCInferenceService",
        "rpc.method": "ModelInfer",
        "server.address": host or target,
        "triton.model.name": model,
        "triton.model.version": model_version,
    }
    if port.isdigit():
        attributes["server.port"] = int(port)
    return CallSpan("inference.GRPCInferenceService/ModelInfer", remote=True, attributes=attributes)
