"""The Triton gRPC client factory: URL parsing, channel options, TLS configuration errors.

No server is needed: gRPC channels connect lazily, so building a client only
checks the configuration (the TLS handshake itself is tested against a real
tritonserver in tests/integration/test_triton_tls.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE

from pipeline.errors import ConfigError
from pipeline.settings import Endpoints, TritonSettings
from pipeline.triton.client import (
    MAX_PINGS_WITHOUT_DATA,
    aio_client,
    channel_args,
    grpc_target,
    sync_client,
)
from tests.helpers.tls_certs import make_ca, write_cert

_TLS_ENV = (
    "PIPELINE_TRITON_GRPC_URL",
    "PIPELINE_TRITON_SSL",
    "PIPELINE_TRITON_SSL_ROOT_CERT",
    "PIPELINE_TRITON_SSL_CLIENT_KEY",
    "PIPELINE_TRITON_SSL_CLIENT_CERT",
)


@pytest.fixture(autouse=True)
def _no_triton_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _TLS_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    return write_cert(tmp_path / "ca.pem", make_ca("unit test CA"))


# ------------------------------------------------------------------ grpc_target


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("triton:8001", ("triton:8001", False)),
        ("127.0.0.1:8001/", ("127.0.0.1:8001", False)),
        ("grpc://triton:8001", ("triton:8001", False)),
        ("http://triton:8001", ("triton:8001", False)),
        ("grpcs://triton:8001", ("triton:8001", True)),
        ("GRPCS://triton:8001/", ("triton:8001", True)),
        ("https://triton.example.com:443", ("triton.example.com:443", True)),
        ("  grpcs://[::1]:8001  ", ("[::1]:8001", True)),
    ],
)
def test_grpc_target(url: str, expected: tuple[str, bool]) -> None:
    assert grpc_target(url) == expected


# ------------------------------------------------------------------ channel_args


def test_channel_args_are_complete_with_defaults() -> None:
    """tritonclient ignores its own defaults when channel_args is given: every one must be here."""
    args = channel_args(TritonSettings(grpc_url="t:8001"))
    keys = [key for key, _ in args]
    assert len(keys) == len(set(keys)), "a channel option is set twice"
    assert dict(args) == {
        "grpc.max_send_message_length": MAX_GRPC_MESSAGE_SIZE,
        "grpc.max_receive_message_length": MAX_GRPC_MESSAGE_SIZE,
        "grpc.initial_reconnect_backoff_ms": 200,
        "grpc.min_reconnect_backoff_ms": 200,
        "grpc.max_reconnect_backoff_ms": 1000,
        "grpc.keepalive_time_ms": 30_000,
        "grpc.keepalive_timeout_ms": 10_000,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": MAX_PINGS_WITHOUT_DATA,
    }


def test_channel_args_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_TRITON_MAX_MESSAGE_BYTES", str(64 * 2**20))
    monkeypatch.setenv("PIPELINE_TRITON_KEEPALIVE_TIME_MS", "60000")
    monkeypatch.setenv("PIPELINE_TRITON_KEEPALIVE_TIMEOUT_MS", "5000")
    monkeypatch.setenv("PIPELINE_TRITON_KEEPALIVE_PERMIT_WITHOUT_CALLS", "false")
    args = dict(channel_args(TritonSettings(grpc_url="t:8001")))
    assert args["grpc.max_send_message_length"] == 64 * 2**20
    assert args["grpc.max_receive_message_length"] == 64 * 2**20
    assert args["grpc.keepalive_time_ms"] == 60_000
    assert args["grpc.keepalive_timeout_ms"] == 5_000
    assert args["grpc.keepalive_permit_without_calls"] == 0


def test_non_positive_sizes_and_times_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_message_bytes"):
        TritonSettings(grpc_url="t:8001", max_message_bytes=0)
    with pytest.raises(ValueError, match="keepalive_time_ms"):
        TritonSettings(grpc_url="t:8001", keepalive_time_ms=-1)


# ------------------------------------------------------------------ TLS settings


def test_tls_files_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_TRITON_SSL_ROOT_CERT", "/etc/triton/ca.pem")
    monkeypatch.setenv("PIPELINE_TRITON_SSL_CLIENT_KEY", "/etc/triton/client.key")
    monkeypatch.setenv("PIPELINE_TRITON_SSL_CLIENT_CERT", "/etc/triton/client.pem")
    settings = TritonSettings(grpc_url="grpcs://t:8001")
    assert settings.ssl_root_cert == Path("/etc/triton/ca.pem")
    assert settings.ssl_client_key == Path("/etc/triton/client.key")
    assert settings.ssl_client_cert == Path("/etc/triton/client.pem")
    env = Endpoints(triton=settings).environment()
    assert env["PIPELINE_TRITON_SSL_ROOT_CERT"] == "/etc/triton/ca.pem"
    assert env["PIPELINE_TRITON_SSL_CLIENT_KEY"] == "/etc/triton/client.key"
    assert env["PIPELINE_TRITON_SSL_CLIENT_CERT"] == "/etc/triton/client.pem"


def test_tls_client_builds_with_a_readable_ca(ca_file: Path) -> None:
    for settings in (
        TritonSettings(grpc_url="grpcs://127.0.0.1:1", ssl_root_cert=ca_file),
        TritonSettings(grpc_url="127.0.0.1:1", ssl=True, ssl_root_cert=ca_file),
        TritonSettings(grpc_url="grpcs://127.0.0.1:1"),  # the system's root certificates
    ):
        sync_client(settings).close()


async def test_aio_client_builds_with_tls(ca_file: Path) -> None:
    client = aio_client(TritonSettings(grpc_url="grpcs://127.0.0.1:1", ssl_root_cert=ca_file))
    await client.close()


def _config_error(settings: TritonSettings) -> str:
    with pytest.raises(ConfigError) as raised:
        sync_client(settings)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_no_url_is_a_config_error() -> None:
    assert "PIPELINE_TRITON_GRPC_URL" in _config_error(TritonSettings(grpc_url=None))
    assert "host:port" in _config_error(TritonSettings(grpc_url="grpcs://"))


def test_missing_certificate_file_is_one_line(tmp_path: Path, ca_file: Path) -> None:
    missing = tmp_path / "nope.pem"
    message = _config_error(TritonSettings(grpc_url="grpcs://t:1", ssl_root_cert=missing))
    assert "PIPELINE_TRITON_SSL_ROOT_CERT" in message and str(missing) in message
    message = _config_error(
        TritonSettings(
            grpc_url="grpcs://t:1", ssl_root_cert=ca_file,
            ssl_client_key=missing, ssl_client_cert=ca_file,
        )
    )
    assert "PIPELINE_TRITON_SSL_CLIENT_KEY" in message


def test_unreadable_certificate_is_one_line(tmp_path: Path) -> None:
    message = _config_error(TritonSettings(grpc_url="grpcs://t:1", ssl_root_cert=tmp_path))
    assert "PIPELINE_TRITON_SSL_ROOT_CERT" in message


def test_client_key_without_certificate_is_a_config_error(ca_file: Path) -> None:
    message = _config_error(TritonSettings(grpc_url="grpcs://t:1", ssl_client_key=ca_file))
    assert "PIPELINE_TRITON_SSL_CLIENT_CERT" in message


def test_certificates_with_a_plaintext_url_are_refused_not_ignored(ca_file: Path) -> None:
    message = _config_error(TritonSettings(grpc_url="t:8001", ssl_root_cert=ca_file))
    assert "grpcs://" in message and "PIPELINE_TRITON_SSL" in message
