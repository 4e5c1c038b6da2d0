"""Authentication and authorization on the embedded Apache Kafka: SASL/SCRAM over TLS, ACLs enforced.

What a production cluster does, on loopback, so that least privilege is tested at the broker
and not only in the manifests (:mod:`pipeline.deploy.kafka_acls`):

- the client listener is ``SASL_SSL`` with ``SCRAM-SHA-512``; ``mutual_tls`` also demands a
  client certificate signed by ``TlsFiles.client_ca_cert``; ``sasl=False`` makes it a plain
  ``SSL`` listener with no users and no authorizer (TLS alone, what the transport tests need);
- ``StandardAuthorizer`` (KRaft's own) enforces ACLs, ``allow.everyone.if.no.acl.found=false``:
  a principal may do only what an ACL grants it; ``admin`` is the one super user;
- SCRAM credentials live in the cluster metadata, so the users exist from the first start:
  ``kafka-storage format --add-scram`` writes them (KIP-900), no ``kafka-configs`` round trip;
- the controller listener cannot use SCRAM (its credentials are in the metadata the controller
  serves), so it is ``SASL_PLAINTEXT`` with ``PLAIN`` and the admin's password in the JAAS
  config: no unauthenticated principal exists on any port.

Passwords are written only into files of mode 0600 (``server.properties``, the format step's
argument file), never onto a command line, where ``ps`` would show them.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pydantic import SecretStr

from pipeline.embedded.services import TlsFiles

SCRAM_MECHANISM: Final = "SCRAM-SHA-512"
SUPER_USER = "admin"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
_PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


def _jaas_quote(value: str) -> str:
    if '"' in value or "\\" in value:
        raise ValueError("a JAAS value may not contain quotes or backslashes")
    return f'"{value}"'


@dataclass(frozen=True)
class BrokerSecurity:
    """The broker's TLS files, its super user and the SCRAM users it starts with."""

    tls: TlsFiles
    users: Mapping[str, SecretStr] = field(default_factory=dict)
    """SCRAM-SHA-512 users besides ``admin`` (name: password)."""
    admin_password: SecretStr = field(default_factory=lambda: SecretStr(secrets.token_urlsafe(18)))
    mutual_tls: bool = False
    """Demand a client certificate signed by ``tls.client_ca_cert`` besides the password."""
    admin_certificate: tuple[Path, Path] | None = None
    """With mutual TLS: the admin's certificate and key (PEM), which the stack's own probes present."""
    sasl: bool = True
    """False: TLS alone, an ``SSL`` listener without users or ACLs."""

    def __post_init__(self) -> None:
        if self.tls.ca_cert is None:
            raise ValueError("the broker's own CA (tls.ca_cert) is needed: brokers verify each other")
        if self.mutual_tls and (self.tls.client_ca_cert is None or self.admin_certificate is None):
            raise ValueError(
                "mutual TLS needs tls.client_ca_cert (the CA of client certificates) and an admin_certificate"
            )
        if not self.sasl and self.users:
            raise ValueError("users need sasl=True")
        if SUPER_USER in self.users:
            raise ValueError(f"{SUPER_USER!r} is the super user; choose another name")

    @property
    def credentials(self) -> dict[str, SecretStr]:
        """Every SCRAM user, ``admin`` first."""
        return {SUPER_USER: self.admin_password, **self.users}

    @property
    def listener(self) -> str:
        """The client (and inter-broker) listener's name and protocol."""
        return "SASL_SSL" if self.sasl else "SSL"

    def format_arguments(self) -> list[str]:
        """``--add-scram`` arguments for ``kafka-storage format`` (one per user)."""
        if not self.sasl:
            return []
        found = []
        for name, password in self.credentials.items():
            found += ["--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password.get_secret_value()}]"]
        return found

    def server_settings(self, keystore: Path, truststore: Path) -> dict[str, str]:
        """Listener, TLS, SASL and authorizer settings of a node; ``keystore`` and ``truststore``
        hold :meth:`keystore_pem` and :meth:`truststore_pem`."""
        admin = _jaas_quote(self.admin_password.get_secret_value())
        listener = self.listener
        settings = {
            "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:SASL_PLAINTEXT",
            "inter.broker.listener.name": listener,
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": f"{_PLAIN_LOGIN} required username={_jaas_quote(SUPER_USER)} password={admin} user_{SUPER_USER}={admin};",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(truststore),
            # on a SASL_SSL listener only the listener's own setting counts (KIP-684)
            f"listener.name.{listener.lower()}.ssl.client.auth": "required" if self.mutual_tls else "none",
        }
        if not self.sasl:
            return settings
        return {
            **settings,
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": f"{_SCRAM_LOGIN} required username={_jaas_quote(SUPER_USER)} password={admin};",
            "authorizer.class.name": AUTHORIZER,
            "super.users": f"User:{SUPER_USER}",
            "allow.everyone.if.no.acl.found": "false",
        }

    def keystore_pem(self) -> bytes:
        """The broker's PEM keystore: its PKCS#8 private key followed by its certificate."""
        return self.tls.server_key.read_bytes() + self.tls.server_cert.read_bytes()

    def truststore_pem(self) -> bytes:
        """The CAs a node trusts: its own (brokers verify each other) and, with mutual TLS, the
        clients'. Between brokers of a cluster with mutual TLS, a node presents its own
        certificate as a client, which must then allow client authentication too."""
        assert self.tls.ca_cert is not None  # __post_init__
        trusted = self.tls.ca_cert.read_bytes()
        if self.mutual_tls and self.tls.client_ca_cert is not None:
            trusted += self.tls.client_ca_cert.read_bytes()
        return trusted
