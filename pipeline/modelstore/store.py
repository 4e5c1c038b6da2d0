"""The model store: Triton's model repository layout in an S3 bucket.

Objects are keyed ``<prefix>/<model>/<path inside the model directory>``, the
layout Triton reads with ``--model-repository=s3://host:port/bucket/prefix``.
Only plain S3 calls go through the ``minio`` client, so the same code works
against MinIO in production and against any other S3-compatible server.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import BinaryIO

import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, S3Error, ServerError
from minio.helpers import check_bucket_name
from urllib3.util import Retry, Timeout

from pipeline.errors import ConfigError, EndpointUnreachable, PipelineError
from pipeline.modelstore.repository import LocalModel
from pipeline.settings import S3Settings

ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(bytes_done, bytes_total)`` while a push uploads."""

# Fail in seconds, not minutes: minio's default client retries five times with
# a five-minute timeout, which looks like a hang when the endpoint is down.
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 60.0
RETRIES = 2


@dataclass(frozen=True)
class StoredModel:
    """One model directory as it exists in the bucket."""

    name: str
    versions: list[int]
    files: int
    size: int


def _http_client(settings: S3Settings) -> urllib3.PoolManager:
    """minio's own defaults, with short timeouts and few retries; an ``https://`` endpoint
    is verified against ``PIPELINE_S3_CA_FILE`` when set (see :meth:`S3Settings.ca_bundle`)."""
    return urllib3.PoolManager(
        timeout=Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S),
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=settings.ca_bundle(),
        retries=Retry(
            total=RETRIES,
            connect=1,
            backoff_factor=0.2,
            status_forcelist=[500, 502, 503, 504],
        ),
    )


def _client(settings: S3Settings) -> Minio:
    """A minio client; malformed settings are a :class:`ConfigError`, not a traceback.

    minio validates the endpoint (no path allowed) when constructed and the
    bucket name only at the first request; check both up front.
    """
    try:
        check_bucket_name(settings.bucket)
        return Minio(
            settings.host_port,
            access_key=settings.access_key.get_secret_value() if settings.access_key else None,
            secret_key=settings.secret_key.get_secret_value() if settings.secret_key else None,
            secure=settings.secure,
            region=settings.region,
            http_client=_http_client(settings),
        )
    except ValueError as exc:
        raise ConfigError(
            f"invalid S3 settings (PIPELINE_S3_ENDPOINT={settings.endpoint}, "
            f"PIPELINE_S3_BUCKET={settings.bucket}): {exc}"
        ) from None


class _CountingReader:
    """A file wrapper that reports bytes as minio reads them.

    minio reads one part, uploads it, then reads the next (with one upload
    thread), so the count runs at most one part ahead of what the server has.
    """

    def __init__(self, stream: BinaryIO, on_read: Callable[[int], None]) -> None:
        self._stream = stream
        self._on_read = on_read

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        if data:
            self._on_read(len(data))
        return data


class ModelStore:
    """Upload, list and delete models in the S3 bucket named by :class:`S3Settings`."""

    def __init__(self, settings: S3Settings) -> None:
        if not settings.configured:
            raise ConfigError("no S3 endpoint configured: set PIPELINE_S3_ENDPOINT")
        self.settings = settings
        self.bucket = settings.bucket
        self.prefix = settings.prefix.strip("/")
        self._client = _client(settings)

    @property
    def url(self) -> str:
        """``s3://bucket/prefix``, for messages."""
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    # -- keys ---------------------------------------------------------------

    def _model_prefix(self, name: str) -> str:
        """The key prefix of one model, with a trailing slash so ``foo`` never matches ``foobar``."""
        return f"{self.prefix}/{name}/" if self.prefix else f"{name}/"

    def _root_prefix(self) -> str | None:
        return f"{self.prefix}/" if self.prefix else None

    # -- errors -------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Turn transport and S3 errors into one-line :class:`PipelineError` messages."""
        try:
            yield
        except urllib3.exceptions.HTTPError as exc:
            raise EndpointUnreachable(
                f"cannot reach S3 at {self.settings.endpoint}: {_transport_reason(exc)}"
            ) from None
        except S3Error as exc:
            raise PipelineError(
                f"S3 {action} failed on {self.url} at {self.settings.endpoint}: "
                f"{exc.code}: {_one_line(exc.message or '')}"
            ) from None
        except (InvalidResponseError, ServerError) as exc:
            raise PipelineError(
                f"S3 {action} failed at {self.settings.endpoint} (is it an S3 server?): "
                f"{_one_line(exc)}"
            ) from None

    # -- operations ---------------------------------------------------------

    def bucket_exists(self) -> bool:
        with self._errors("bucket lookup"):
            return bool(self._client.bucket_exists(self.bucket))

    def ensure_bucket(self) -> None:
        """Create the bucket if it is missing; a first push into an empty store just works."""
        with self._errors("create bucket"):
            if not self._client.bucket_exists(self.bucket):
                self._client.make_bucket(self.bucket, location=self.settings.region)

    def push(self, models: list[LocalModel], progress: ProgressCallback | None = None) -> None:
        """Upload every file of every model, then drop objects the new copy no longer has.

        A push *replaces* a model: a file deleted locally must not linger in
        the bucket, where Triton would still see it (e.g. a stale version
        directory that it would go on serving).
        """
        total = sum(m.size for m in models)
        done = 0

        def advance(nbytes: int) -> None:
            nonlocal done
            done += nbytes
            if progress is not None:
                progress(done, total)

        self.ensure_bucket()
        if progress is not None:
            progress(0, total)
        for model in models:
            keys = self._upload_model(model, advance)
            self._delete_keys(set(self._list_keys(model.name)) - keys)

    def put_generated(self, name: str, files: Mapping[str, bytes]) -> None:
        """Replace model ``name`` with ``files`` (relative path -> content) made in memory,
        such as a generated ensemble; objects the new copy lacks are dropped, as in :meth:`push`."""
        self.ensure_bucket()
        prefix = self._model_prefix(name)
        for relpath, content in sorted(files.items()):
            with self._errors(f"upload of {prefix + relpath}"):
                self._client.put_object(self.bucket, prefix + relpath, io.BytesIO(content), length=len(content))
        self._delete_keys(set(self._list_keys(name)) - {prefix + relpath for relpath in files})

    def _upload_model(self, model: LocalModel, advance: Callable[[int], None]) -> set[str]:
        """Upload one model's files; returns the keys written."""
        prefix = self._model_prefix(model.name)
        keys: set[str] = set()
        for file in model.files:
            key = prefix + file.relpath
            with open(file.path, "rb") as fh, self._errors(f"upload of {key}"):
                self._client.put_object(
                    self.bucket,
                    key,
                    _CountingReader(fh, advance),  # type: ignore[arg-type]
                    length=file.size,
                    num_parallel_uploads=1,
                )
            keys.add(key)
        return keys

    def list_models(self) -> list[StoredModel]:
        """Every model directory in the store, with its numeric versions, file count and size.

        A missing bucket is an empty store, not an error: nothing was pushed yet.
        """
        if not self.bucket_exists():
            return []
        grouped: dict[str, tuple[set[int], int, int]] = {}
        root = self._root_prefix() or ""
        with self._errors("list"):
            for obj in self._client.list_objects(self.bucket, prefix=root or None, recursive=True):
                name, _, rest = (obj.object_name or "")[len(root) :].partition("/")
                if not name or not rest:
                    continue  # a loose object beside the model directories
                versions, files, size = grouped.get(name, (set(), 0, 0))
                head = rest.split("/", 1)[0]
                if head.isdigit() and "/" in rest:
                    versions.add(int(head))
                grouped[name] = (versions, files + 1, size + (obj.size or 0))
        return [
            StoredModel(name=name, versions=sorted(v), files=f, size=s)
            for name, (v, f, s) in sorted(grouped.items())
        ]

    def delete_model(self, name: str) -> int:
        """Delete every object of model ``name``; returns how many were deleted."""
        keys = self._list_keys(name)
        if not keys:
            raise PipelineError(f"model {name!r} is not in the store {self.url}")
        self._delete_keys(set(keys))
        return len(keys)

    def _list_keys(self, name: str) -> list[str]:
        with self._errors("list"):
            return [
                obj.object_name
                for obj in self._client.list_objects(
                    self.bucket, prefix=self._model_prefix(name), recursive=True
                )
                if obj.object_name
            ]

    def _delete_keys(self, keys: set[str]) -> None:
        if not keys:
            return
        with self._errors("delete"):
            # remove_objects is lazy: the deletes happen while its errors are iterated.
            errors = list(
                self._client.remove_objects(self.bucket, [DeleteObject(k) for k in sorted(keys)])
            )
        if errors:
            first = errors[0]
            raise PipelineError(
                f"S3 delete failed for {len(errors)} object(s) in {self.url}, first "
                f"{first.name}: {first.code}: {_one_line(first.message or '')}"
            )


def _transport_reason(exc: urllib3.exceptions.HTTPError) -> str:
    """The root cause of a urllib3 failure, without its object reprs.

    ``MaxRetryError`` wraps e.g. ``NewConnectionError("<HTTPConnection object
    at 0x…>: Failed to establish a new connection: [Errno 111] Connection
    refused")``; the person only needs the last part.
    """
    reason = getattr(exc, "reason", None) or exc
    return _one_line(re.sub(r"<[^>]*>:\s*", "", str(reason)))


def _one_line(value: object) -> str:
    """Collapse a possibly multi-line error text into one line."""
    return " ".join(str(value).split())
