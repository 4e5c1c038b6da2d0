"""An embedded Apache Kafka that authenticates (SASL/SCRAM-SHA-512 over TLS) and enforces ACLs,
or one that speaks TLS alone.

The broker is :class:`pipeline.embedded.kafka_broker.ApacheKafka` with a
:class:`pipeline.embedded.kafka_security.BrokerSecurity`; this helper makes its certificates,
its users' passwords (random, never literals) and the client settings of each user. Its own
TLS listener replaced stunnel in front of Tansu (which has no TLS of its own) for the
transport tests: every connection a client makes, not only the first, is TLS with
certificate verification, since the broker advertises that listener only.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from pipeline.embedded.kafka_broker import ApacheKafka
from pipeline.embedded.kafka_security import SCRAM_MECHANISM, SUPER_USER, BrokerSecurity
from pipeline.embedded.services import TlsFiles
from pipeline.settings import KafkaSettings
from tests.helpers.tls_certs import issue, make_ca, server_tls_files, write_cert, write_key


@dataclass(frozen=True)
class SecureKafka:
    """Where the broker is, its CA, and every user's password."""

    broker: ApacheKafka
    security: BrokerSecurity

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap_servers

    @property
    def ca_file(self) -> Path:
        assert self.security.tls.ca_cert is not None
        return self.security.tls.ca_cert

    def password(self, user: str) -> str:
        return self.security.credentials[user].get_secret_value()

    def passwords(self) -> list[str]:
        return [self.password(user) for user in self.security.credentials]

    def settings(
        self,
        user: str,
        *,
        password: str | None = None,
        cafile: Path | None = None,
        certificate: tuple[Path, Path] | None = None,
    ) -> KafkaSettings:
        """Client settings logging in as ``user`` (its own password unless ``password``),
        presenting ``certificate`` (certificate and key files) for mutual TLS."""
        return KafkaSettings(
            bootstrap_servers=self.bootstrap,
            security_protocol="SASL_SSL",
            sasl_mechanism=SCRAM_MECHANISM,
            sasl_username=user,
            sasl_password=SecretStr(self.password(user) if password is None else password),
            ssl_cafile=str(cafile or self.ca_file),
            ssl_certfile=str(certificate[0]) if certificate else None,
            ssl_keyfile=str(certificate[1]) if certificate else None,
        )

    def admin(self) -> KafkaSettings:
        return self.settings(SUPER_USER, certificate=self.security.admin_certificate)

    def environment(self, user: str, **options: object) -> dict[str, str]:
        """The ``PIPELINE_KAFKA_*`` variables of a `pipeline` process logging in as ``user``
        (``options`` as :meth:`settings` takes them)."""
        settings = self.settings(user, **options)  # type: ignore[arg-type]
        assert settings.sasl_password is not None
        return {
            "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            **settings.security_environment(),
            "PIPELINE_KAFKA_SASL_PASSWORD": settings.sasl_password.get_secret_value(),
        }


@dataclass(frozen=True)
class TlsKafka:
    """Where the TLS-only broker is, and the CA its certificate chains to."""

    bootstrap: str
    tls: TlsFiles

    def settings(self, cafile: Path | None) -> KafkaSettings:
        """Client settings over TLS verifying against ``cafile`` (explicit: no environment)."""
        return KafkaSettings(
            bootstrap_servers=self.bootstrap,
            security_protocol="SSL",
            ssl_cafile=str(cafile) if cafile is not None else None,
            ssl_certfile=None,
            ssl_keyfile=None,
        )

    def environment(self, cafile: Path | None) -> dict[str, str]:
        """The ``PIPELINE_KAFKA_*`` variables a `pipeline` process needs to reach it."""
        settings = self.settings(cafile)
        return {"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap, **settings.security_environment()}


@contextlib.contextmanager
def tls_kafka(work_dir: Path) -> Iterator[TlsKafka]:
    """A one-node Apache Kafka whose only client listener is TLS (no SASL, no ACLs)."""
    tls = server_tls_files(work_dir / "pki")
    broker = ApacheKafka(work_dir / "logs", 1, security=BrokerSecurity(tls=tls, sasl=False))
    with _running(broker):
        yield TlsKafka(broker.bootstrap_servers, tls)


@contextlib.contextmanager
def _running(broker: ApacheKafka) -> Iterator[None]:
    broker.prepare()
    processes = broker.processes()
    try:
        for process in processes:
            process.start()
        broker.wait_ready()
        yield
    finally:
        broker.terminate()
        for process in processes:
            process.stop()
        broker.cleanup()


def other_ca(directory: Path) -> Path:
    """A CA certificate that signed nothing the broker presents."""
    directory.mkdir(parents=True, exist_ok=True)
    return write_cert(directory / "other-ca.pem", make_ca("some other CA"))


@dataclass(frozen=True)
class ClientCertificates:
    """A CA for client certificates, and certificates it issued, by common name."""

    ca_file: Path
    issued: dict[str, tuple[Path, Path]]
    """Common name -> (certificate, key) files."""


def client_certificates(directory: Path, names: Iterable[str]) -> ClientCertificates:
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca("pipeline test client CA")
    issued = {}
    for name in names:
        leaf = issue(ca, name, server=False)
        issued[name] = (write_cert(directory / f"{name}.pem", leaf), write_key(directory / f"{name}.key", leaf))
    return ClientCertificates(write_cert(directory / "client-ca.pem", ca), issued)


@contextlib.contextmanager
def secure_kafka(
    work_dir: Path, users: Iterable[str], *, clients: ClientCertificates | None = None
) -> Iterator[SecureKafka]:
    """A one-node KRaft broker with ``users`` (and ``admin``) as SCRAM users, each with a
    random password; only ``admin`` may do anything until ACLs say otherwise. ``clients``:
    mutual TLS, client certificates from its CA (``admin``'s among them) demanded too."""
    tls = server_tls_files(work_dir / "pki", client_ca=clients.ca_file if clients else None)
    security = BrokerSecurity(
        tls=tls,
        users={user: SecretStr(secrets.token_urlsafe(16)) for user in users},
        mutual_tls=clients is not None,
        admin_certificate=clients.issued[SUPER_USER] if clients else None,
    )
    broker = ApacheKafka(work_dir / "logs", 1, security=security)
    with _running(broker):
        yield SecureKafka(broker, security)
