"""Throwaway certificate authorities and certificates for TLS tests (``cryptography``).

A CA signs a server certificate valid for ``127.0.0.1`` and ``localhost`` (and,
for mutual TLS, a client certificate); everything is written as PEM files.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pipeline.embedded.services import TlsFiles


@dataclass(frozen=True)
class Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
    )


def make_ca(common_name: str) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(common_name, _name(common_name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def issue(ca: Issued, common_name: str, *, server: bool) -> Issued:
    """A leaf certificate signed by ``ca``: for a server at 127.0.0.1/localhost, or a client."""
    key = ec.generate_private_key(ec.SECP256R1())
    # A server's certificate serves for client authentication too: a Kafka broker presents it
    # to its peers (and, under mutual TLS, checks at start that it could).
    usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        _builder(common_name, ca.cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if server:
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def write_cert(path: Path, issued: Issued) -> Path:
    path.write_bytes(issued.cert.public_bytes(serialization.Encoding.PEM))
    return path


def write_key(path: Path, issued: Issued) -> Path:
    path.write_bytes(
        issued.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def server_tls_files(directory: Path, *, client_ca: Path | None = None) -> TlsFiles:
    """A fresh CA and a server certificate for 127.0.0.1/localhost, as PEM files in ``directory``.

    ``client_ca`` (a CA certificate file) makes the server demand client certificates.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca("pipeline test CA")
    server = issue(ca, "localhost", server=True)
    return TlsFiles(
        server_cert=write_cert(directory / "server.pem", server),
        server_key=write_key(directory / "server.key", server),
        ca_cert=write_cert(directory / "ca.pem", ca),
        client_ca_cert=client_ca,
    )
