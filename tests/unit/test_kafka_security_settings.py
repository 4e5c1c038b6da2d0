"""Kafka TLS/SASL settings reach aiokafka's clients as configured (no server needed).

TLS, SASL/SCRAM-SHA-512, mutual TLS and ACLs are also tested against a real broker, the
embedded Apache Kafka (``tests/integration/test_kafka_tls.py``,
``tests/integration/test_kafka_acls.py``). Tansu, the other embedded broker, cannot
authenticate a client (0.6.0: with ``--authentication`` it offers SCRAM only and refuses
``tansu user create`` itself; without it every SASL handshake is
``UnsupportedSaslMechanismError``). These tests pin what reaches aiokafka: mechanism, user,
password, protocol and a verifying TLS context, read from the same ``PIPELINE_KAFKA_*``
variables as in production.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import ssl
from pathlib import Path
from typing import Any

import certifi
import pytest
from pydantic import SecretStr

from pipeline.errors import ConfigError
from pipeline.kafka.clients import make_consumer, make_producer
from pipeline.settings import Endpoints, KafkaSettings, S3Settings
from tests.helpers.tls_certs import issue, make_ca, write_cert, write_key


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    return write_cert(tmp_path / "ca.pem", make_ca("kafka test CA"))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No Kafka variable of the developer's shell may leak into a test."""
    for name in list(os.environ):
        if name.startswith("PIPELINE_KAFKA_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)
    return monkeypatch


def _ca_subjects(context: ssl.SSLContext) -> list[str]:
    """Common names of the CA certificates ``context`` trusts (loaded ones; not a capath's)."""
    names = []
    for cert in context.get_ca_certs():
        for rdn in cert["subject"]:
            names += [str(pair[1]) for pair in rdn if pair[0] == "commonName"]
    return names


def test_sasl_ssl_from_environment_reaches_aiokafka(clean_env: pytest.MonkeyPatch, ca_file: Path) -> None:
    clean_env.setenv("PIPELINE_KAFKA_BOOTSTRAP_SERVERS", "broker-1:9093,broker-2:9093")
    clean_env.setenv("PIPELINE_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    clean_env.setenv("PIPELINE_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    clean_env.setenv("PIPELINE_KAFKA_SASL_USERNAME", "pipeline")
    password = secrets.token_hex(12)
    clean_env.setenv("PIPELINE_KAFKA_SASL_PASSWORD", password)
    clean_env.setenv("PIPELINE_KAFKA_SSL_CAFILE", str(ca_file))
    settings = KafkaSettings()
    assert password not in repr(settings), "the password must not show in logs or tracebacks"

    kwargs = settings.client_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "pipeline"
    assert kwargs["sasl_plain_password"] == password
    context = kwargs["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert _ca_subjects(context) == ["kafka test CA"], "only the configured CA is trusted"

    async def built() -> list[Any]:
        producer = make_producer(settings)
        consumer = make_consumer(settings, "requests", group_id="g")
        return [producer.client, consumer._client]

    # What aiokafka's own client (shared by producer and consumer) will connect with.
    for client in asyncio.run(built()):
        assert client._security_protocol == "SASL_SSL"
        assert client._sasl_mechanism == "SCRAM-SHA-512"
        assert client._sasl_plain_username == "pipeline"
        assert client._sasl_plain_password == password
        assert client._ssl_context.verify_mode == ssl.CERT_REQUIRED


def test_sasl_plaintext_defaults_to_plain_and_has_no_tls(clean_env: pytest.MonkeyPatch) -> None:
    settings = KafkaSettings(
        bootstrap_servers="b:9092", security_protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password=SecretStr("p")
    )
    kwargs = settings.client_kwargs()
    assert kwargs["sasl_mechanism"] == "PLAIN"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("u", "p")
    assert "ssl_context" not in kwargs


def test_plaintext_passes_no_security_options(clean_env: pytest.MonkeyPatch) -> None:
    kwargs = KafkaSettings(bootstrap_servers="b:9092").client_kwargs()
    assert kwargs["security_protocol"] == "PLAINTEXT"
    assert not {"ssl_context", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password"} & set(kwargs)


def test_ssl_without_cafile_trusts_the_system_roots(clean_env: pytest.MonkeyPatch) -> None:
    context = KafkaSettings(bootstrap_servers="b:9093", security_protocol="SSL").ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert "kafka test CA" not in _ca_subjects(context)


def test_client_certificate_is_loaded_for_mutual_tls(clean_env: pytest.MonkeyPatch, tmp_path: Path, ca_file: Path) -> None:
    client = issue(make_ca("client CA"), "pipeline-worker", server=False)
    settings = KafkaSettings(
        bootstrap_servers="b:9093",
        security_protocol="SSL",
        ssl_cafile=str(ca_file),
        ssl_certfile=str(write_cert(tmp_path / "client.pem", client)),
        ssl_keyfile=str(write_key(tmp_path / "client.key", client)),
    )
    settings.ssl_context()  # load_cert_chain raises if the key does not match the certificate
    other = issue(make_ca("client CA"), "someone-else", server=False)
    mismatched = settings.model_copy(update={"ssl_keyfile": str(write_key(tmp_path / "other.key", other))})
    with pytest.raises(ConfigError, match="PIPELINE_KAFKA_SSL_KEYFILE"):
        mismatched.ssl_context()


def test_missing_ca_file_is_one_line_config_error(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = KafkaSettings(bootstrap_servers="b:9093", security_protocol="SSL", ssl_cafile=str(tmp_path / "nope.pem"))
    with pytest.raises(ConfigError) as raised:
        settings.client_kwargs()
    message = str(raised.value)
    assert "\n" not in message
    assert f"PIPELINE_KAFKA_SSL_CAFILE={tmp_path / 'nope.pem'}" in message


def test_environment_hands_tls_and_sasl_to_a_child_but_not_the_password(
    clean_env: pytest.MonkeyPatch, ca_file: Path
) -> None:
    settings = KafkaSettings(
        bootstrap_servers="b:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="u",
        sasl_password=SecretStr("p"),
        ssl_cafile=str(ca_file),
    )
    plaintext = Endpoints(kafka=KafkaSettings(bootstrap_servers="b:9092")).environment()
    assert [name for name in plaintext if name.startswith("PIPELINE_KAFKA_")] == ["PIPELINE_KAFKA_BOOTSTRAP_SERVERS"]
    env = Endpoints(kafka=settings).environment()
    assert "PIPELINE_KAFKA_SASL_PASSWORD" not in env, "secrets come only from the environment itself"
    for name, value in env.items():
        clean_env.setenv(name, value)
    clean_env.setenv("PIPELINE_KAFKA_SASL_PASSWORD", "p")
    child = KafkaSettings()
    assert child.client_kwargs().keys() == settings.client_kwargs().keys()
    for field in ("bootstrap_servers", "security_protocol", "sasl_mechanism", "sasl_username", "ssl_cafile"):
        assert getattr(child, field) == getattr(settings, field)


def test_s3_ca_bundle_prefers_its_own_file(monkeypatch: pytest.MonkeyPatch, ca_file: Path) -> None:
    monkeypatch.delenv("PIPELINE_S3_CA_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    assert S3Settings(endpoint="https://s3:9000").ca_bundle() == certifi.where()
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
    assert S3Settings(endpoint="https://s3:9000").ca_bundle() == "/etc/ssl/certs/ca-certificates.crt"
    monkeypatch.setenv("PIPELINE_S3_CA_FILE", str(ca_file))
    settings = S3Settings(endpoint="https://s3:9000")
    assert settings.ca_bundle() == str(ca_file)
    assert Endpoints(s3=settings).environment()["PIPELINE_S3_CA_FILE"] == str(ca_file)


def test_static_membership_names_each_supervised_child_and_reaches_the_stage_consumer(clean_env: pytest.MonkeyPatch) -> None:
    """KIP-345: one stable name per process, ``<name>-<index>`` under ``--processes N``, the
    same after each restart; the stage's consumer joins with it, tools never do."""
    from pipeline.cli.kafka_props import property_fields

    assert property_fields([("group.instance.id", "pod-3")]) == {"group_instance_id": "pod-3"}
    clean_env.setenv("PIPELINE_KAFKA_BOOTSTRAP_SERVERS", "b:9092")
    clean_env.setenv("PIPELINE_KAFKA_GROUP_INSTANCE_ID", "pod-3")
    settings = KafkaSettings()
    assert settings.for_process(0, 1).group_instance_id == "pod-3", "one process: the name as given"
    assert [settings.for_process(i, 2).group_instance_id for i in (0, 1)] == ["pod-3-0", "pod-3-1"]
    assert Endpoints(kafka=settings).environment()["PIPELINE_KAFKA_GROUP_INSTANCE_ID"] == "pod-3", (
        "the supervisor's children inherit the name and add their index"
    )
    async def tool_instance() -> object:
        return make_consumer(settings, group_id="a-tool")._group_instance_id

    assert asyncio.run(tool_instance()) is None, "a tool's consumer stays dynamic"
    clean_env.delenv("PIPELINE_KAFKA_GROUP_INSTANCE_ID")
    assert KafkaSettings().for_process(1, 2).group_instance_id is None, "unset: dynamic"
