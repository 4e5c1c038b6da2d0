"""Construct aiokafka clients with the project's delivery defaults.

Producers use ``acks="all"`` so a result counts as delivered only when the
broker has it replicated; consumers never auto-commit (offsets are committed
by :mod:`pipeline.kafka.ordering` after outputs are acknowledged).
Producers are idempotent wherever the broker serves ``InitProducerId``, which a stage
finds out at start (:func:`detect_idempotence`); Tansu, the no-Java fallback broker, does
not, and the log says so once. ``PIPELINE_KAFKA_IDEMPOTENCE=true|false`` decides instead of asking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)

from pipeline.contract.errors import one_line
from pipeline.errors import AccessDenied, EndpointUnreachable
from pipeline.kafka import continuity
from pipeline.settings import KafkaSettings

log = logging.getLogger(__name__)

#: What a record may carry besides the largest value a stage accepts: key, headers (the
#: request's, carried to results and dead letters, plus ours) and the batch framing.
RECORD_HEADROOM_BYTES = 1 << 20
#: aiokafka's own defaults; limits only ever raise them.
DEFAULT_MAX_RECORD_BYTES = 1 << 20
_MIN_PARTITION_FETCH_BYTES = 4 << 20
#: Bound on one producer send and its delivery (see :func:`make_producer`).
SEND_TIMEOUT_MS = 30_000
_MIN_FETCH_BYTES = 50 << 20
#: Bound on the TLS handshake that checks a bootstrap server (see :func:`check_connection`).
TLS_PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RecordLimits:
    """How large a record a topology's clients and topics handle, in bytes.

    ``max_record_bytes`` is the producer's ``max_request_size``, the topics'
    ``max.message.bytes`` and the floor of the consumers' fetch sizes, so any record
    a stage accepts can be consumed, and any output up to it produced.
    ``dead_letter_max_bytes`` (at most ``max_record_bytes``): a larger dead letter
    becomes a claim check (see :mod:`pipeline.deadletter`).
    """

    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    dead_letter_max_bytes: int = DEFAULT_MAX_RECORD_BYTES

    @classmethod
    def for_values(cls, largest_value_bytes: int, *, dead_letter_max_bytes: int) -> RecordLimits:
        """Limits for a topology whose stages accept values up to ``largest_value_bytes``."""
        limit = max(largest_value_bytes + RECORD_HEADROOM_BYTES, DEFAULT_MAX_RECORD_BYTES)
        return cls(max_record_bytes=limit, dead_letter_max_bytes=min(dead_letter_max_bytes, limit))

    def producer_kwargs(self) -> dict[str, Any]:
        return {"max_request_size": self.max_record_bytes}

    def consumer_kwargs(self) -> dict[str, Any]:
        return {
            "max_partition_fetch_bytes": max(_MIN_PARTITION_FETCH_BYTES, self.max_record_bytes),
            "fetch_max_bytes": max(_MIN_FETCH_BYTES, self.max_record_bytes),
        }

    def topic_configs(self) -> dict[str, str]:
        return {"max.message.bytes": str(self.max_record_bytes)}


async def failing_in_one_line(
    work: Awaitable[None], what: str, *, settings: KafkaSettings | None = None, reads: Collection[str] = ()
) -> None:
    """Await ``work``; when Kafka fails it where it cannot wait (an output not acknowledged
    within ``SEND_TIMEOUT_MS``), raise one line for the operator instead of a traceback: an
    outage to report, not a bug. Nothing past the last acknowledged output was committed,
    so a restarted worker replays from there. A refusal by an ACL is one line too
    (:func:`access_denied`; ``reads``: the topics ``work`` consumes, the rest it writes)."""
    try:
        await work
    except (TopicAuthorizationFailedError, GroupAuthorizationFailedError) as exc:
        raise access_denied(exc, settings, reads, what) from exc
    except KafkaError as exc:
        raise EndpointUnreachable(
            f"{what}: Kafka failed it ({type(exc).__name__}: {exc}); nothing past its last "
            "acknowledged output is committed: a restarted worker replays from there"
        ) from exc


def access_denied(
    exc: TopicAuthorizationFailedError | GroupAuthorizationFailedError,
    settings: KafkaSettings | None,
    reads: Collection[str],
    what: str,
) -> AccessDenied:
    """One line naming the principal, the operation and the resource an ACL refused.

    aiokafka names the resources (its exception's argument: a topic, a group, or a set of
    topics) but not the operation; a topic this client consumes was refused Read (or the
    Describe that comes with it), any other topic Write, a group Read."""
    found = exc.args[0] if exc.args else "?"
    names = sorted(found) if isinstance(found, (set, list, tuple, frozenset)) else [found]
    user = f"User:{settings.sasl_username}" if settings is not None and settings.sasl_username else "this principal"
    if isinstance(exc, GroupAuthorizationFailedError):
        resource, operation = "group", "Read"
    else:
        resource, operation = "topic", "Read" if all(name in reads for name in names) else "Write"
    listed = ", ".join(repr(str(name)) for name in names)
    return AccessDenied(
        f"{what}: not authorized: the broker refused {user} {operation} on {resource} {listed} "
        f"({type(exc).__name__}); its ACLs: `pipeline deploy acls`"
    )


async def refuse_unauthorized(settings: KafkaSettings, topics: Collection[str], what: str) -> None:
    """Raise :func:`access_denied` (Read) when the broker says this principal may not see one
    of ``topics``: a consumer only finds no partitions there, as for a topic that does not
    exist, so a tool that found none asks (error 29 in a metadata answer) before saying so."""
    if not topics:
        return
    async with admin_client(settings) as admin:
        described = await admin.describe_topics(list(topics))
    refused = {t["topic"] for t in described if t["error_code"] == _TOPIC_AUTHORIZATION_FAILED}
    if refused:
        raise access_denied(TopicAuthorizationFailedError(refused), settings, refused, what)


_IDEMPOTENCE: dict[str | None, bool] = {}
"""Per bootstrap servers: whether the broker served an idempotent producer's InitProducerId."""


def _configured_idempotence() -> bool | None:
    """``PIPELINE_KAFKA_IDEMPOTENCE``: true, false, or None (``auto``, the default: ask the broker)."""
    value = os.environ.get("PIPELINE_KAFKA_IDEMPOTENCE", "auto").lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    return None


def _idempotence(settings: KafkaSettings) -> bool:
    configured = _configured_idempotence()
    if configured is not None:
        return configured
    return _IDEMPOTENCE.get(settings.bootstrap_servers, False)


def _quiet_probe(record: logging.LogRecord) -> bool:
    return "InitProducerId" not in record.getMessage()


async def detect_idempotence(settings: KafkaSettings) -> bool:
    """Whether producers to this broker are idempotent: the setting when there is one, else
    one idempotent producer is started (its InitProducerId is the question), once per process
    and bootstrap list. A broker that refuses it (Tansu answers UnknownError at once) gets
    plain producers, and one log line says so."""
    configured = _configured_idempotence()
    if configured is not None:
        return configured
    known = _IDEMPOTENCE.get(settings.bootstrap_servers)
    if known is not None:
        return known
    probe = AIOKafkaProducer(**settings.client_kwargs(), enable_idempotence=True, request_timeout_ms=10_000)
    sender = logging.getLogger("aiokafka.producer.sender")
    sender.addFilter(_quiet_probe)  # aiokafka logs the refusal as an ERROR: the line below says it
    try:
        await asyncio.wait_for(probe.start(), 15)
        supported = True
    except (KafkaError, asyncio.TimeoutError) as exc:
        supported = False
        log.warning(
            "Kafka at %s does not serve idempotent producers (InitProducerId: %s): producing without "
            "idempotence (set PIPELINE_KAFKA_IDEMPOTENCE to decide instead)",
            settings.bootstrap_servers, type(exc).__name__,
        )
    finally:
        sender.removeFilter(_quiet_probe)
        await probe.stop()
    _IDEMPOTENCE[settings.bootstrap_servers] = supported
    return supported


def _session_timeout_ms() -> int:
    return int(os.environ.get("PIPELINE_KAFKA_SESSION_TIMEOUT_MS", "10000"))


def make_producer(
    settings: KafkaSettings, *, limits: RecordLimits | None = None, **overrides: Any
) -> AIOKafkaProducer:
    """A producer for records up to ``limits.max_record_bytes`` (aiokafka's 1 MiB without)."""
    kwargs: dict[str, Any] = {
        **settings.client_kwargs(),
        "acks": "all",
        "linger_ms": 2,
        "max_batch_size": 1 << 20,
        "enable_idempotence": _idempotence(settings),
        # The send timeout: aiokafka 0.14 has no delivery.timeout.ms or max.block.ms; this one
        # setting bounds both send() (blocked on a full buffer or missing metadata) and each
        # delivery future (the batch expires; up to 2x with the produce request in flight).
        # A delivery that fails stops the stage before its offset is committed: replayed.
        "request_timeout_ms": SEND_TIMEOUT_MS,
        **(limits or RecordLimits()).producer_kwargs(),
    }
    kwargs.update(overrides)
    return AIOKafkaProducer(**kwargs)


def isolation_level(committed_only: bool) -> str:
    """A reader's ``isolation_level``: ``read_committed`` where the records it reads are written
    in transactions (a topology under exactly-once), so an aborted transaction's records are
    never seen; else ``read_uncommitted``, which reads to the log's end."""
    return "read_committed" if committed_only else "read_uncommitted"


def make_consumer(
    settings: KafkaSettings,
    *topics: str,
    group_id: str | None,
    limits: RecordLimits | None = None,
    **overrides: Any,
) -> AIOKafkaConsumer:
    """A consumer whose fetches hold a record of ``limits.max_record_bytes`` (4 MiB at least),
    and that never moves past an offset the broker skipped (:mod:`pipeline.kafka.continuity`)."""
    continuity.install()
    kwargs: dict[str, Any] = {
        **settings.client_kwargs(),
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        **(limits or RecordLimits()).consumer_kwargs(),
        # A dead worker's partitions move after 10 s, not Kafka's 45 s default (a shorter session
        # also shortens the membership lease of pipeline.kafka.membership; tests use 3 s).
        "session_timeout_ms": _session_timeout_ms(),
        "heartbeat_interval_ms": min(1_000, _session_timeout_ms() // 3),
        "max_poll_interval_ms": 300_000,
        "isolation_level": "read_committed",
        # How long the broker may hold an empty fetch. Apache Kafka answers as soon as data
        # arrives anyway; Tansu holds the full time, so a long wait is per-hop latency.
        "fetch_max_wait_ms": int(os.environ.get("PIPELINE_KAFKA_FETCH_MAX_WAIT_MS", "25")),
    }
    kwargs.update(overrides)
    return AIOKafkaConsumer(*topics, **kwargs)


async def ensure_topics(
    settings: KafkaSettings,
    topics: Iterable[str],
    *,
    partitions: int,
    replication_factor: int = -1,
    compacted: Iterable[str] = (),
    limits: RecordLimits | None = None,
    configs: dict[str, str] | None = None,
) -> list[str]:
    """Create the topics that do not exist yet; returns the ones it created.

    ``compacted`` topics (state changelogs) get ``cleanup.policy=compact`` so
    the broker keeps the latest value per key forever, not by time. With
    ``limits``, every topic gets ``max.message.bytes`` to match the producers
    (Tansu stores the setting but does not enforce it; Apache Kafka does).
    ``configs``: more topic settings for every topic (a client's reply topic: its
    ``retention.ms``). Existing topics are left as they are.
    """
    async with admin_client(settings) as admin:
        existing = set(await admin.list_topics())
        wanted = [t for t in dict.fromkeys(topics) if t not in existing]
        if not wanted:
            return []
        compact = set(compacted)
        new = [
            NewTopic(
                t,
                num_partitions=partitions,
                replication_factor=replication_factor,
                # -1: the broker's default.replication.factor (KIP-464). aiokafka's NewTopic takes
                # -1 only beside an assignment; an empty one asks the broker to place the replicas.
                replica_assignments={} if replication_factor == -1 else None,
                topic_configs={
                    **({"cleanup.policy": "compact"} if t in compact else {}),
                    **(limits.topic_configs() if limits is not None else {}),
                    **(configs or {}),
                },
            )
            for t in wanted
        ]
        try:
            response = await admin.create_topics(new)
        except TopicAlreadyExistsError:
            return []  # another worker of the same topology won the race
        except KafkaError as exc:
            raise EndpointUnreachable(f"cannot create topics {wanted}: {exc}") from exc
        return _created(response, wanted)


@contextlib.asynccontextmanager
async def admin_client(settings: KafkaSettings) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client, closed on exit; a broker that cannot be reached, or refuses
    the TLS handshake or the login, is one line (:class:`EndpointUnreachable`)."""
    await check_connection(settings)
    admin = AIOKafkaAdminClient(**settings.client_kwargs(), request_timeout_ms=15_000)
    try:
        await admin.start()
    except KafkaConnectionError as exc:
        raise EndpointUnreachable(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from exc
    try:
        yield admin
    finally:
        await admin.close()


_TOPIC_ALREADY_EXISTS = 36
_TOPIC_AUTHORIZATION_FAILED = 29


def _created(response: object, wanted: list[str]) -> list[str]:
    """The topics a CreateTopics answer says were made. aiokafka does not raise on a topic's
    own error code, so each is read here: one that exists meanwhile (another worker won the
    race) is fine; one this principal may not create nor describe (a least-privilege user
    whose topics are KafkaTopic resources, ``pipeline deploy k8s --strimzi-users``) is logged
    once and left to whoever manages it; any other refusal is logged with its code, and the
    first client that uses the topic says the rest."""
    errors = {str(t[0]): (int(t[1]), t[2] if len(t) > 2 else None) for t in getattr(response, "topic_errors", ())}
    refused = {t: e for t, e in errors.items() if e[0] not in (0, _TOPIC_ALREADY_EXISTS, _TOPIC_AUTHORIZATION_FAILED)}
    if refused:
        log.warning("the broker refused to create %s", "; ".join(f"{t} (error {c}: {m or ''})" for t, (c, m) in refused.items()))
    denied = [t for t, (code, _m) in errors.items() if code == _TOPIC_AUTHORIZATION_FAILED]
    if denied:
        log.warning("not allowed to create or describe topics %s: they must exist already (made by their owner)", denied)
    return [t for t in wanted if errors.get(t, (0, None))[0] == 0]


async def check_connection(settings: KafkaSettings) -> None:
    """Fail fast with one line when the TLS handshake with a bootstrap server fails, or the
    broker refuses the SASL login.

    aiokafka only *logs* why each bootstrap server failed and then raises a bare "Unable
    to bootstrap", which hides what a person must fix (a wrong CA file, a certificate for
    another host, a port that does not speak TLS, a wrong password). So before a client
    starts, one TLS handshake with the clients' own context names it, then one login
    (:func:`login_failure`), and nothing else is printed. Without TLS and SASL, or when
    both succeed, this does nothing.
    """
    if settings.security_protocol == "PLAINTEXT":
        return
    password = settings.sasl_password.get_secret_value() if settings.sasl_password else None
    key = (settings.bootstrap_servers, settings.security_protocol, settings.sasl_mechanism, settings.sasl_username,
           hash(password), settings.ssl_cafile, settings.ssl_certfile)  # fmt: skip
    if key in _CONNECTED:
        return  # every client of every stage starts through here: one probe per process is enough
    failure = await _tls_failure(settings) if settings.security_protocol in ("SSL", "SASL_SSL") else None
    failure = failure or await login_failure(settings)
    if failure is not None:
        raise EndpointUnreachable(f"cannot reach Kafka at {settings.bootstrap_servers}: {failure}")
    _CONNECTED.add(key)


_CONNECTED: set[tuple[object, ...]] = set()
"""The connection settings :func:`check_connection` found good in this process."""


async def _tls_failure(settings: KafkaSettings) -> str | None:
    """Why the TLS handshake with the first bootstrap server that fails it fails; None if
    none does (a failure then lies elsewhere: no answer, SASL, the Kafka protocol)."""
    context = settings.ssl_context()
    for host, port, _ in collect_hosts(settings.bootstrap_servers, randomize=False):
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=context), TLS_PROBE_TIMEOUT_S
            )
        except ssl.SSLCertVerificationError as exc:
            return (
                f"TLS certificate verification failed for {host}:{port}: {exc.verify_message} "
                f"(the broker's CA is PIPELINE_KAFKA_SSL_CAFILE={settings.ssl_cafile})"
            )
        except ssl.SSLError as exc:
            reason = one_line(str(exc.reason or exc))
            return f"TLS handshake with {host}:{port} failed: {reason} (does the port speak TLS?)"
        except (OSError, asyncio.TimeoutError):
            continue
        writer.close()
    return None


_LOGIN_KEYS = ("security_protocol", "ssl_context", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password")


async def login_failure(settings: KafkaSettings) -> str | None:
    """Why the broker refused this client's login, if it did: its SASL credentials, or (mutual
    TLS) its certificate; else None.

    Like a TLS failure, a refused login is only *logged* by aiokafka, per connection attempt,
    before it raises a bare "Unable to bootstrap". A client asks this once, on one connection
    of its own, before it starts (:func:`check_connection`), so the one line it prints names
    the user or the certificate and the broker's reason; the reason never holds the password.
    A certificate the broker refuses is only known after the handshake (TLS 1.3 sends the
    alert with the first answer), so the handshake probe alone does not see it."""
    if settings.security_protocol == "PLAINTEXT" or settings.sasl_mechanism == "OAUTHBEARER":
        return None  # OAUTHBEARER: no token provider is wired in, the client's own start says why
    login = {key: value for key, value in settings.client_kwargs().items() if key in _LOGIN_KEYS}
    for host, port, _ in collect_hosts(settings.bootstrap_servers, randomize=False):
        try:
            conn = await asyncio.wait_for(create_conn(host, port, **login), TLS_PROBE_TIMEOUT_S)
        except (SaslAuthenticationFailed, UnsupportedSaslMechanismError) as exc:
            return (
                f"{host}:{port} refused the SASL login of user {settings.sasl_username!r} "
                f"({login.get('sasl_mechanism')}): {one_line(str(exc))}"
            )
        except KafkaConnectionError as exc:
            if isinstance(exc.__cause__, ssl.SSLError):
                return (
                    f"{host}:{port} refused this client's TLS certificate "
                    f"(PIPELINE_KAFKA_SSL_CERTFILE={settings.ssl_certfile}): {exc.__cause__.reason or exc.__cause__}"
                )
            continue
        except (KafkaError, OSError, asyncio.TimeoutError):
            continue
        conn.close()
        return None
    return None
