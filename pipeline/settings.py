"""Where the services are: Kafka, Triton and the S3 model store.

Every endpoint is read from the environment (``PIPELINE_*``) so the same code
talks to the embedded stack, to a docker-compose stack or to production
Apache Kafka / Triton / MinIO. Secrets (SASL password, S3 keys) are *only*
ever read from the environment, never from a topology file.

When nothing is configured, :func:`pipeline.embedded.discover` finds a running
``pipeline up`` stack; only then is the embedded stack the default.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any, Literal

import certifi
from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipeline.errors import ConfigError


class KafkaSettings(BaseSettings):
    """Kafka client options shared by every producer, consumer and admin client."""

    model_config = SettingsConfigDict(env_prefix="PIPELINE_KAFKA_", extra="ignore", populate_by_name=True)

    bootstrap_servers: str | None = Field(
        default=None,
        validation_alias=AliasChoices("PIPELINE_KAFKA_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"),
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    client_id: str = "streaming-inference-pipeline"
    batch_sends: bool = True
    """Produce the outputs ready in one outbox pass as one record batch per partition
    (aiokafka's batch API): ~4x less producer CPU per record than one ``send`` each.
    ``PIPELINE_KAFKA_BATCH_SENDS=false`` restores per-record sends (a benchmark's baseline)."""
    dead_letter_max_bytes: int = Field(default=1 << 20, gt=0)
    """A dead letter whose record would be larger is written as a claim check (payload in
    the S3 store): dead-letter topics stay readable by clients with default fetch sizes."""
    group_instance_id: str | None = None
    """Static group membership (KIP-345): this process's stable name in every stage's consumer
    group (a StatefulSet pod's name; ``pipeline run --processes N`` appends each child's
    index). A worker restarted under the same name within the session timeout gets its
    partitions back without a rebalance. A clean stop leaves the group (``leave_group_on_stop``).
    Unset: dynamic membership, every start and stop rebalances."""
    leave_group_on_stop: bool = True
    """A static member leaves its group on a clean stop (SIGTERM), so its partitions move at
    once: a scale-down, or a replacement slower than the session timeout (a pod). False keeps
    them through a planned restart shorter than the session (``-X internal.leave.group.on.close``,
    the Java consumer's name). A crash never leaves: that is what static membership is for
    (:mod:`pipeline.kafka.static_leave`). Dynamic members always leave on a stop."""

    def for_process(self, index: int, count: int) -> KafkaSettings:
        """The settings of process ``index`` of ``count`` under a supervisor: each child its
        own static name (``<name>-<index>``), the same one after each restart."""
        if self.group_instance_id is None or count <= 1:
            return self
        return self.model_copy(update={"group_instance_id": f"{self.group_instance_id}-{index}"})

    @property
    def configured(self) -> bool:
        return bool(self.bootstrap_servers)

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments accepted by every aiokafka client constructor."""
        if not self.bootstrap_servers:
            raise ValueError("Kafka bootstrap servers are not configured")
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
            "client_id": self.client_id,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kwargs["ssl_context"] = self.ssl_context()
        if self.security_protocol.startswith("SASL"):
            kwargs["sasl_mechanism"] = self.sasl_mechanism or "PLAIN"
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = (
                self.sasl_password.get_secret_value() if self.sasl_password else None
            )
        return kwargs

    def security_environment(self) -> dict[str, str]:
        """The ``PIPELINE_KAFKA_*`` variables that give another process this TLS/SASL setup.

        Not the SASL password: it lives only in the environment, which children inherit.
        """
        env: dict[str, str] = {}
        if self.security_protocol != "PLAINTEXT":
            env["PIPELINE_KAFKA_SECURITY_PROTOCOL"] = self.security_protocol
        for name in ("sasl_mechanism", "sasl_username", "ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            value = getattr(self, name)
            if value is not None:
                env[f"PIPELINE_KAFKA_{name.upper()}"] = str(value)
        return env

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context of every connection (certificate and host name verified).

        The broker's certificate must chain to ``ssl_cafile`` (else the system roots) and
        name the host dialled; ``ssl_certfile``/``ssl_keyfile`` are presented for mutual
        TLS. A missing or unreadable file is a :class:`ConfigError` naming the variables,
        not a traceback from deep inside a client's start. Built as aiokafka's
        ``create_ssl_context`` builds it, minus the INFO log line it writes per client.
        """
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ssl_cafile)
            if self.ssl_certfile is not None:
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        except OSError as exc:  # ssl.SSLError included: a file that is not PEM
            raise ConfigError(
                f"Kafka TLS files unusable (PIPELINE_KAFKA_SSL_CAFILE={self.ssl_cafile}, "
                f"PIPELINE_KAFKA_SSL_CERTFILE={self.ssl_certfile}, "
                f"PIPELINE_KAFKA_SSL_KEYFILE={self.ssl_keyfile}): {exc}"
            ) from None
        return context


class TritonSettings(BaseSettings):
    """A Triton Inference Server reached over gRPC (KServe v2 protocol)."""

    model_config = SettingsConfigDict(env_prefix="PIPELINE_TRITON_", extra="ignore")

    grpc_url: str | None = None  # host:port; grpcs://host:port turns TLS on
    http_url: str | None = None  # host:port, used only for health and metrics links
    metrics_url: str | None = None  # http://host:port/metrics
    ssl: bool = False
    # PEM files: the CA that signed Triton's certificate (None = the system roots),
    # and this client's key and certificate for mutual TLS.
    ssl_root_cert: Path | None = None
    ssl_client_key: Path | None = None
    ssl_client_cert: Path | None = None
    # Largest gRPC message either way; default = tritonclient's MAX_GRPC_MESSAGE_SIZE.
    max_message_bytes: int = Field(default=2**31 - 1, gt=0)
    keepalive_time_ms: int = Field(default=30_000, gt=0)
    keepalive_timeout_ms: int = Field(default=10_000, gt=0)
    keepalive_permit_without_calls: bool = True

    @property
    def configured(self) -> bool:
        return bool(self.grpc_url)


class S3Settings(BaseSettings):
    """The model store: any S3-compatible object store (MinIO in production)."""

    model_config = SettingsConfigDict(env_prefix="PIPELINE_S3_", extra="ignore", populate_by_name=True)

    endpoint: str | None = None  # http(s)://host:port
    bucket: str = "models"
    prefix: str = ""
    dead_letter_bucket: str = "dead-letters"
    """Claim-checked dead-letter payloads; a bucket of its own (created when missing), so
    Triton never sees them in its model repository and retention can differ."""
    access_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("PIPELINE_S3_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
    )
    secret_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("PIPELINE_S3_SECRET_KEY", "AWS_SECRET_ACCESS_KEY"),
    )
    region: str = Field(
        default="us-east-1",
        validation_alias=AliasChoices("PIPELINE_S3_REGION", "AWS_DEFAULT_REGION"),
    )
    ca_file: Path | None = None
    """PEM bundle that an ``https://`` endpoint's certificate must chain to; unset: the
    process's ``SSL_CERT_FILE``, else certifi's public roots. A private CA for the store
    alone, without replacing the roots of every other TLS client in the process."""

    @property
    def configured(self) -> bool:
        return bool(self.endpoint)

    @property
    def secure(self) -> bool:
        return bool(self.endpoint and self.endpoint.startswith("https://"))

    @property
    def host_port(self) -> str:
        """``host:port`` of the endpoint, as the minio client and Triton's ``s3://`` want it."""
        if not self.endpoint:
            raise ValueError("S3 endpoint is not configured")
        return self.endpoint.split("://", 1)[-1].rstrip("/")

    def ca_bundle(self) -> str:
        """The CA bundle every S3 client of the project verifies the endpoint against."""
        return str(self.ca_file or os.environ.get("SSL_CERT_FILE") or certifi.where())

    def triton_repository_url(self) -> str:
        """The ``s3://host:port/bucket[/prefix]`` URL Triton loads its model repository from."""
        scheme = "s3://https://" if self.secure else "s3://"
        path = f"{self.bucket}/{self.prefix.strip('/')}".rstrip("/")
        return f"{scheme}{self.host_port}/{path}"


class Endpoints(BaseSettings):
    """All three services together, as one immutable value handed to components."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    triton: TritonSettings = Field(default_factory=TritonSettings)
    s3: S3Settings = Field(default_factory=S3Settings)

    def environment(self) -> dict[str, str]:
        """The ``PIPELINE_*`` variables that point another process at these endpoints."""
        env: dict[str, str] = {}
        if self.kafka.bootstrap_servers:
            env["PIPELINE_KAFKA_BOOTSTRAP_SERVERS"] = self.kafka.bootstrap_servers
        if self.kafka.group_instance_id:
            env["PIPELINE_KAFKA_GROUP_INSTANCE_ID"] = self.kafka.group_instance_id
        if not self.kafka.leave_group_on_stop:
            env["PIPELINE_KAFKA_LEAVE_GROUP_ON_STOP"] = "false"
        env.update(self.kafka.security_environment())
        if self.triton.grpc_url:
            env["PIPELINE_TRITON_GRPC_URL"] = self.triton.grpc_url
        if self.triton.http_url:
            env["PIPELINE_TRITON_HTTP_URL"] = self.triton.http_url
        if self.triton.metrics_url:
            env["PIPELINE_TRITON_METRICS_URL"] = self.triton.metrics_url
        if self.triton.ssl:
            env["PIPELINE_TRITON_SSL"] = "true"
        for name in ("ssl_root_cert", "ssl_client_key", "ssl_client_cert"):
            path = getattr(self.triton, name)
            if path is not None:
                env[f"PIPELINE_TRITON_{name.upper()}"] = str(path)
        if self.s3.endpoint:
            env["PIPELINE_S3_ENDPOINT"] = self.s3.endpoint
            env["PIPELINE_S3_BUCKET"] = self.s3.bucket
            if self.s3.prefix:
                env["PIPELINE_S3_PREFIX"] = self.s3.prefix
            env["PIPELINE_S3_DEAD_LETTER_BUCKET"] = self.s3.dead_letter_bucket
        if self.s3.ca_file is not None:
            env["PIPELINE_S3_CA_FILE"] = str(self.s3.ca_file)
        if self.s3.access_key:
            env["AWS_ACCESS_KEY_ID"] = self.s3.access_key.get_secret_value()
        if self.s3.secret_key:
            env["AWS_SECRET_ACCESS_KEY"] = self.s3.secret_key.get_secret_value()
        env["AWS_DEFAULT_REGION"] = self.s3.region
        return env
