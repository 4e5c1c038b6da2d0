"""Kafka header names of the message contract, and helpers for header lists.

aiokafka hands headers over as a sequence of ``(str, bytes)`` tuples and takes
the same back. Kafka allows repeated names and null values, so these helpers
never assume a dict: they read a name's single value strictly, and they copy
every header they do not own untouched (byte for byte, order kept).
"""

from __future__ import annotations

from collections.abc import Iterable, KeysView, Sequence

from pipeline.contract.errors import BadRequest, ErrorClass

#: A Kafka header list as aiokafka produces and consumes it.
Headers = list[tuple[str, bytes]]
#: What we accept as input: any sequence of pairs; a null value reads as absent.
HeaderPairs = Sequence[tuple[str, bytes | None]]

# Request headers.
CORRELATION_ID = "correlation-id"
CONTENT_TYPE = "content-type"
TRACEPARENT = "traceparent"
DEADLINE = "deadline"
PRIORITY = "priority"
TIMEOUT_MS = "timeout-ms"
TASK = "task"  # a stage with route_by: task serves the route of this name

# Headers added to result records.
PIPELINE_STAGE = "pipeline-stage"
MODEL_NAME = "model-name"
MODEL_VERSION = "model-version"
PIPELINE_ROUTE = "pipeline-route"  # the route (or "shadow") of a stage with routes or a shadow

# Headers added to dead-letter records.
ERROR_STAGE = "error-stage"
ERROR_CLASS = "error-class"
ERROR_REASON = "error-reason"
ERROR_TIME = "error-time"

# Content types.
PROTOBUF_REQUEST = "application/vnd.oip.v2.infer-request+protobuf"
PROTOBUF_RESPONSE = "application/vnd.oip.v2.infer-response+protobuf"
GENERIC_PROTOBUF = "application/x-protobuf"
JSON = "application/json"
PROTOBUF_TYPES = frozenset({PROTOBUF_REQUEST, PROTOBUF_RESPONSE, GENERIC_PROTOBUF})


def media_type(content_type: str) -> str:
    """``"Application/JSON; charset=utf-8"`` -> ``"application/json"`` (parameters dropped)."""
    return content_type.split(";", 1)[0].strip().lower()


def get_header(headers: HeaderPairs | None, name: str) -> str | None:
    """The UTF-8 value of header ``name``, or ``None`` when absent or null.

    Names match case-insensitively (producers differ). A name repeated with
    *different* values is ambiguous and refused rather than guessed at.
    """
    found: list[bytes] = []
    for key, value in headers or ():
        if value is not None and isinstance(key, str) and key.lower() == name:
            found.append(value)
    return _single(found, name)


class HeaderIndex:
    """A header list read once, for many :meth:`get` (decoding a request asks for six
    names: one pass over the headers instead of six). Same rules as :func:`get_header`,
    applied when a name is asked for, so a bad header fails only the lookup that reads it."""

    __slots__ = ("_values",)

    def __init__(self, headers: HeaderPairs | None) -> None:
        values: dict[str, list[bytes]] = {}
        for key, value in headers or ():
            if value is not None and isinstance(key, str):
                values.setdefault(key.lower(), []).append(value)
        self._values = values

    def get(self, name: str) -> str | None:
        return _single(self._values.get(name, ()), name)

    def names(self) -> KeysView[str]:
        """The (lower-cased) names present with a value."""
        return self._values.keys()


def _single(values: Sequence[bytes], name: str) -> str | None:
    if not values:
        return None
    found = bytes(values[0])
    for value in values[1:]:
        if value != found:
            raise BadRequest(ErrorClass.BAD_HEADER, f"header {name!r} is repeated with different values")
    try:
        return found.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(ErrorClass.BAD_HEADER, f"header {name!r} is not valid UTF-8") from None


def without(headers: HeaderPairs | None, names: Iterable[str]) -> Headers:
    """A copy of ``headers`` minus every occurrence of ``names`` (case-insensitive)."""
    drop = {n.lower() for n in names}
    return [(k, v) for k, v in headers or () if not (isinstance(k, str) and k.lower() in drop)]  # type: ignore[misc]


def encode_headers(pairs: Iterable[tuple[str, str]]) -> Headers:
    """``[(name, text)]`` -> ``[(name, utf8 bytes)]``."""
    return [(name, value.encode("utf-8")) for name, value in pairs]


def replace_headers(headers: HeaderPairs | None, updates: Iterable[tuple[str, str]]) -> Headers:
    """Copy ``headers``, dropping the names in ``updates``, then append ``updates``.

    Appending rather than editing in place keeps every other header at its
    position and byte-identical.
    """
    new = list(updates)
    return without(headers, (name for name, _ in new)) + encode_headers(new)
