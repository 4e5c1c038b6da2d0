"""Store a dead letter's payload in the S3 store: the claim check's other half.

A dead letter too large for the dead-letter topic keeps its key and headers in
Kafka and its value here, under a name derived from the consumed record's
position (topic/partition/offset, plus the output's index within that record's
outputs). A replay of the same record therefore overwrites the same objects:
no orphans, no duplicates. Two objects per claim check, in a bucket of their
own (``S3Settings.dead_letter_bucket``, created when missing; never the model
repository, which Triton scans):

- ``<topic>/<partition>/<offset>[.<index>]/value``: the exact value bytes;
- ``<topic>/<partition>/<offset>[.<index>]/record.json``: key, headers (base64),
  size and SHA-256, enough to re-produce the record even when its headers were
  too large to stay on the dead-letter record.

Calls block (plain S3 through the ``minio`` client): run them with
``asyncio.to_thread``. Timeouts are short because a partition waits for them.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
from dataclasses import dataclass

import urllib3
from minio import Minio
from minio.error import S3Error
from urllib3.util import Retry, Timeout

from pipeline.contract.headers import HeaderPairs
from pipeline.contract.records import ClaimCheck
from pipeline.errors import PipelineError
from pipeline.settings import S3Settings

CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 20.0


VALUE_OBJECT = "value"  # the exact value bytes
MANIFEST_OBJECT = "record.json"  # beside it: key and headers


@dataclass(frozen=True)
class ClaimName:
    """Which consumed record (and which of its outputs) a claim check belongs to."""

    topic: str
    partition: int
    offset: int
    index: int = 0

    @property
    def base(self) -> str:
        suffix = f".{self.index}" if self.index else ""
        return f"{self.topic}/{self.partition}/{self.offset}{suffix}"

    @property
    def value_key(self) -> str:
        return f"{self.base}/{VALUE_OBJECT}"

    @property
    def record_key(self) -> str:
        return f"{self.base}/{MANIFEST_OBJECT}"


def digest(value: bytes | None) -> str:
    """Hex SHA-256 of a value (a null value hashes as empty)."""
    return hashlib.sha256(value or b"").hexdigest()


def manifest(name: ClaimName, key: bytes | None, value: bytes | None, headers: HeaderPairs | None) -> bytes:
    """The ``record.json`` object: everything but the value, to re-produce the record."""

    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode("ascii")

    doc = {
        "topic": name.topic,
        "partition": name.partition,
        "offset": name.offset,
        "index": name.index,
        "key": b64(key),
        "headers": [[k, b64(None if v is None else bytes(v))] for k, v in headers or ()],
        "size": len(value or b""),
        "sha256": digest(value),
    }
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


class ClaimCheckMismatch(PipelineError):
    """The stored payload is not what the claim check promised (size or SHA-256), or its
    manifest is unreadable: replaying it would send other bytes than the original."""


@dataclass(frozen=True)
class StoredRecord:
    """The record behind a claim check, as stored: key, exact value, headers."""

    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes | None]]  # null header values kept as null


def manifest_key(value_key: str) -> str:
    """``<base>/value`` -> ``<base>/record.json``: the manifest beside a stored value."""
    return f"{value_key.removesuffix('/' + VALUE_OBJECT)}/{MANIFEST_OBJECT}"


def parse_manifest(data: bytes) -> tuple[bytes | None, list[tuple[str, bytes | None]]]:
    """Key and headers out of a ``record.json`` object (see :func:`manifest`)."""
    try:
        doc = json.loads(data)
        key = None if doc["key"] is None else base64.b64decode(doc["key"], validate=True)
        headers = [(str(k), None if v is None else base64.b64decode(v, validate=True)) for k, v in doc["headers"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ClaimCheckMismatch(f"unreadable claim-check manifest: {exc}") from None
    return key, headers


class ClaimCheckStore:
    """The dead-letter bucket of one S3-compatible store (MinIO in production)."""

    def __init__(self, settings: S3Settings) -> None:
        if not settings.configured:
            raise ValueError("no S3 endpoint configured (PIPELINE_S3_ENDPOINT)")
        self.bucket = settings.dead_letter_bucket
        self._region = settings.region
        self._client = Minio(
            settings.host_port,
            access_key=settings.access_key.get_secret_value() if settings.access_key else None,
            secret_key=settings.secret_key.get_secret_value() if settings.secret_key else None,
            secure=settings.secure,
            region=settings.region,
            http_client=urllib3.PoolManager(
                timeout=Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S),
                ca_certs=settings.ca_bundle(),
                retries=Retry(total=2, connect=1, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]),
            ),
        )
        self._bucket_ready = False
        self._lock = threading.Lock()

    def uri(self, name: ClaimName) -> str:
        return f"s3://{self.bucket}/{name.value_key}"

    def put(self, name: ClaimName, key: bytes | None, value: bytes | None, headers: HeaderPairs | None) -> ClaimCheck:
        """Store value and manifest (blocking); raises on any S3 or transport error."""
        self._ensure_bucket()
        data = value or b""
        sha = digest(data)
        self._client.put_object(
            self.bucket, name.value_key, io.BytesIO(data), len(data), metadata={"sha256": sha}
        )
        record = manifest(name, key, value, headers)
        self._client.put_object(
            self.bucket, name.record_key, io.BytesIO(record), len(record), content_type="application/json"
        )
        return ClaimCheck(size=len(data), sha256=sha, uri=self.uri(name))

    def get(self, uri: str) -> bytes:
        """The stored bytes behind a ``claim-check-uri`` (for replay tools and tests)."""
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        response = self._client.get_object(bucket, key)
        try:
            return bytes(response.read())
        finally:
            response.close()
            response.release_conn()

    def fetch(self, check: ClaimCheck) -> StoredRecord:
        """The original record behind a stored claim check, its value checked against the
        claim check's size and SHA-256 (:class:`ClaimCheckMismatch` otherwise). Key and
        headers come from the manifest beside the value: the dead letter itself may have
        dropped them to fit its topic. Blocking; S3 errors propagate."""
        if check.uri is None:
            raise ClaimCheckMismatch(f"payload not kept: {check.error or 'no claim-check-uri'}")
        value = self.get(check.uri)
        if len(value) != check.size or digest(value) != check.sha256:
            raise ClaimCheckMismatch(
                f"{check.uri}: {len(value)} bytes, SHA-256 {digest(value)[:16]}…; "
                f"the claim check says {check.size} bytes, {check.sha256[:16]}…"
            )
        key, headers = parse_manifest(self.get(manifest_key(check.uri)))
        return StoredRecord(key=key, value=value, headers=headers)

    def _ensure_bucket(self) -> None:
        with self._lock:
            if self._bucket_ready:
                return
            if not self._client.bucket_exists(self.bucket):
                try:
                    self._client.make_bucket(self.bucket, location=self._region)
                except S3Error as exc:  # another worker created it first
                    if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise
            self._bucket_ready = True
