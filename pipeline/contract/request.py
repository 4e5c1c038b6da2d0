"""Inference request records: decoding what producers send, and encoding it for them.

:func:`decode_request` is the pipeline's trust boundary. Whatever bytes and
headers arrive, it returns a fully validated :class:`InferenceRequest` or
raises :class:`BadRequest` — never anything else — so a stage can dead-letter
exactly the records that are the producer's fault and crash on its own bugs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from pipeline.contract import headers as h
from pipeline.contract import json_form, protobuf_form, tensors
from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.payload import ModelBody, ParamValue, Payload
from pipeline.contract.records import Record
from pipeline.contract.request_layouts import Layouts, layout_of

#: Default cap on a record value; Kafka's own default is 1 MiB, so this only bites when brokers allow big records.
DEFAULT_MAX_VALUE_BYTES = 64 * 1024 * 1024
#: Longest correlation ID accepted; it is copied into headers, logs and metrics labels.
MAX_CORRELATION_ID_CHARS = 256

# Triton's request parameter names, decoded into typed fields and removed from ``parameters``
# (tritonclient refuses them inside ``parameters``; they are separate arguments of ``infer``).
SEQUENCE_ID = "sequence_id"
SEQUENCE_START = "sequence_start"
SEQUENCE_END = "sequence_end"
PRIORITY = "priority"
TIMEOUT = "timeout"

_UINT64_MAX = (1 << 64) - 1
_INT64_MAX = (1 << 63) - 1
_DIGITS = re.compile(r"[0-9]{1,20}")
# W3C trace-context, read loosely: version 2 hex (not ff), trace-id 32, parent-id 16, flags 2,
# and for future versions possibly more fields after another dash.
_TRACEPARENT = re.compile(
    r"(?!ff)[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?", re.IGNORECASE
)


class WireForm(str, Enum):
    """The two encodings of a request/response value."""

    PROTOBUF = "protobuf"
    JSON = "json"

    @classmethod
    def of(cls, content_type: str) -> WireForm | None:
        """The form a content type names, or ``None`` when it is not one we read."""
        media = h.media_type(content_type)
        if media == h.JSON:
            return cls.JSON
        if media in (h.PROTOBUF_REQUEST, h.GENERIC_PROTOBUF):
            return cls.PROTOBUF
        return None

    @property
    def request_content_type(self) -> str:
        return h.JSON if self is WireForm.JSON else h.PROTOBUF_REQUEST

    @property
    def response_content_type(self) -> str:
        return h.JSON if self is WireForm.JSON else h.PROTOBUF_RESPONSE


@dataclass(frozen=True, eq=False)
class InferenceRequest(ModelBody):
    """A validated inference request, independent of its wire form.

    ``inputs`` keeps the producer's order. Raw-decoded arrays are read-only
    views of the record value. ``parameters`` holds the remaining OIP request
    parameters, ready to pass to Triton; the ones with typed fields here
    (sequence_*, priority, timeout) are not repeated in it. ``model_name`` and
    ``model_version`` are empty when the request leaves the choice to the stage
    bound to the topic. ``notes`` lists headers that were ignored and why.
    """

    correlation_id: str
    inputs: dict[str, np.ndarray]
    requested_outputs: tuple[str, ...] = ()
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    content_type: str = h.PROTOBUF_REQUEST
    deadline_ms: int | None = None
    priority: int | None = None
    timeout_us: int | None = None
    traceparent: str | None = None
    sequence_id: int | str | None = None
    sequence_start: bool = False
    sequence_end: bool = False
    notes: tuple[str, ...] = ()

    @property
    def form(self) -> WireForm:
        """The wire form the request came in, which its result must use too."""
        return WireForm.of(self.content_type) or WireForm.PROTOBUF

    @property
    def stateful(self) -> bool:
        return self.sequence_id is not None

    def expired(self, now_ms: int) -> bool:
        """Whether the ``deadline`` header has passed (checked by stages; decoding uses no clock)."""
        return self.deadline_ms is not None and now_ms >= self.deadline_ms


@dataclass(frozen=True)
class _HeaderFields:
    correlation_id: str | None
    deadline_ms: int | None
    priority: int | None
    timeout_us: int | None
    traceparent: str | None
    notes: tuple[str, ...]
    plain: bool = False  # no header but content-type and correlation-id


def decode_request(
    value: bytes | None,
    headers: h.HeaderPairs | None,
    *,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
) -> InferenceRequest:
    """Decode and validate one request record; raises only :class:`BadRequest`.

    Checks run cheapest first: value present and within ``max_value_bytes``,
    content type, headers, then the body; so a huge or mislabelled record is
    refused before any parsing.
    """
    if value is None or len(value) == 0:
        raise BadRequest(ErrorClass.EMPTY_VALUE, "record has no value")
    if len(value) > max_value_bytes:
        raise BadRequest(
            ErrorClass.OVERSIZED_VALUE, f"value is {len(value)} bytes, limit {max_value_bytes}"
        )
    plain = _plain_headers(headers)
    if plain is not None and (repeated := _repeated_layout(bytes(value), *plain)) is not None:
        return repeated
    index = h.HeaderIndex(headers)
    content_type = index.get(h.CONTENT_TYPE)
    if content_type is None or not content_type.strip():
        raise BadRequest(ErrorClass.MISSING_CONTENT_TYPE, "header 'content-type' is required")
    form, media = _form_of(content_type)
    if form is None:
        raise BadRequest(
            ErrorClass.UNSUPPORTED_CONTENT_TYPE, f"content-type {content_type!r} is not supported"
        )
    fields = _header_fields(index)
    value = bytes(value)
    payload = (json_form if form is WireForm.JSON else protobuf_form).parse_request(value)
    request = _build(payload, fields, media)
    if (
        fields.plain
        and form is WireForm.PROTOBUF
        and _LAYOUTS.wants()
        and (layout := layout_of(value, media, request)) is not None
    ):
        _LAYOUTS.learn(layout)
    return request


def _plain_headers(headers: h.HeaderPairs | None) -> tuple[str, str | None] | None:
    """The content type and correlation ID of a record whose only headers are these two
    (the common case), both UTF-8; None sends the record to the general header reading."""
    if not isinstance(headers, (list, tuple)) or len(headers) != 2:
        return None
    (first, first_value), (second, second_value) = headers
    if first == h.CONTENT_TYPE and second == h.CORRELATION_ID:
        content_type, correlation_id = first_value, second_value
    elif first == h.CORRELATION_ID and second == h.CONTENT_TYPE:
        content_type, correlation_id = second_value, first_value
    else:
        return None
    if type(content_type) is not bytes or type(correlation_id) is not bytes:
        return None
    try:
        return content_type.decode("utf-8"), correlation_id.decode("utf-8") or None
    except UnicodeDecodeError:
        return None


def _repeated_layout(value: bytes, content_type: str, header_id: str | None) -> InferenceRequest | None:
    """The request ``value`` decodes to when it repeats a layout this process has decoded in
    full (:mod:`pipeline.contract.request_layouts`), and everything the full decoder would
    check of it passes; None sends it to the full decoder, which gives it its outcome."""
    form, media = _form_of(content_type)
    if form is not WireForm.PROTOBUF:
        return None
    found = _LAYOUTS.match(value, media)
    if found is None:
        return None
    layout, body_id, inputs = found
    if not _valid_id(body_id) or (header_id is not None and (header_id != body_id)):
        return None
    # A frozen dataclass's __init__ sets its 16 fields one object.__setattr__ at a time (5 µs,
    # a quarter of this path); the layout's fields were validated when it was learnt.
    request = object.__new__(InferenceRequest)
    attributes = request.__dict__
    attributes.update(layout.fields)
    attributes["parameters"] = dict(layout.parameters) if layout.parameters else {}
    attributes["correlation_id"] = body_id
    attributes["inputs"] = inputs
    return request


def _valid_id(value: str) -> bool:
    return 0 < len(value) <= MAX_CORRELATION_ID_CHARS and value.isprintable()


_LAYOUTS = Layouts()
"""Layouts of requests this process has decoded in full (:mod:`pipeline.contract.request_layouts`)."""


def _form_of(content_type: str) -> tuple[WireForm | None, str]:
    """A content type's wire form and media type, worked out once per distinct header value
    (a producer repeats one); a long one is never kept (a hostile header can be megabytes)."""
    if len(content_type) > _CACHED_CONTENT_TYPE_CHARS:
        return _form_and_media(content_type)
    return _cached_form_and_media(content_type)


def _form_and_media(content_type: str) -> tuple[WireForm | None, str]:
    return WireForm.of(content_type), h.media_type(content_type)


_CACHED_CONTENT_TYPE_CHARS = 256
_cached_form_and_media = functools.lru_cache(maxsize=64)(_form_and_media)


def encode_request(
    inputs: Mapping[str, Any],
    *,
    correlation_id: str,
    form: WireForm | str = WireForm.PROTOBUF,
    model_name: str = "",
    model_version: str = "",
    datatypes: Mapping[str, str] | None = None,
    requested_outputs: Sequence[str] = (),
    parameters: Mapping[str, ParamValue] | None = None,
    sequence_id: int | str | None = None,
    sequence_start: bool = False,
    sequence_end: bool = False,
    deadline_ms: int | None = None,
    priority: int | None = None,
    timeout_ms: int | None = None,
    traceparent: str | None = None,
    typed_contents: bool = False,
    key: str | bytes | None = None,
    extra_headers: Iterable[tuple[str, bytes]] = (),
) -> Record:
    """Build a request record for producers (the CLI, tests, client code).

    Datatypes default to the arrays' own (str/bytes/object -> BYTES). The
    correlation ID goes both in ``id`` and in the ``correlation-id`` header;
    the key defaults to the sequence ID for stateful requests, else the
    correlation ID. ``typed_contents`` uses ``InferTensorContents`` instead of
    raw bytes in the protobuf form (FP16 forces raw).
    """
    wire = WireForm(form)
    arrays = {name: _as_array(values) for name, values in inputs.items()}
    types = {
        name: (datatypes or {}).get(name) or tensors.datatype_of(array)
        for name, array in arrays.items()
    }
    params: dict[str, ParamValue] = dict(parameters or {})
    if sequence_id is not None:
        params.update(
            {SEQUENCE_ID: sequence_id, SEQUENCE_START: sequence_start, SEQUENCE_END: sequence_end}
        )
    payload = Payload(
        id=correlation_id,
        model_name=model_name,
        model_version=model_version,
        tensors=arrays,
        datatypes=types,
        requested_outputs=tuple(requested_outputs),
        parameters=params,
    )
    if wire is WireForm.JSON:
        value = json_form.build_request(payload)
    else:
        value = protobuf_form.build_request(payload, typed_contents=typed_contents)
    optional = [
        (h.DEADLINE, deadline_ms),
        (h.PRIORITY, priority),
        (h.TIMEOUT_MS, timeout_ms),
        (h.TRACEPARENT, traceparent),
    ]
    record_headers = h.encode_headers(
        [(h.CONTENT_TYPE, wire.request_content_type), (h.CORRELATION_ID, correlation_id)]
        + [(name, str(v)) for name, v in optional if v is not None]
    ) + list(extra_headers)
    if key is None:
        key = str(sequence_id) if sequence_id is not None else correlation_id
    return Record(
        key=key.encode("utf-8") if isinstance(key, str) else key,
        value=value,
        headers=record_headers,
    )


def forward_request(
    request: InferenceRequest,
    tensors: Mapping[str, Any],
    datatypes: Mapping[str, str],
    *,
    parameters: Mapping[str, ParamValue] | None = None,
) -> tuple[bytes, str]:
    """The next stage's request: ``tensors`` as its inputs, ``request``'s identity, wire
    form and sequence flags kept. Returns ``(value, content_type)``."""
    record = encode_request(
        tensors,
        datatypes=datatypes,
        correlation_id=request.correlation_id,
        form=request.form,
        parameters=request.parameters if parameters is None else parameters,
        sequence_id=request.sequence_id,
        sequence_start=request.sequence_start,
        sequence_end=request.sequence_end,
    )
    return record.value, request.form.request_content_type


def _as_array(values: Any) -> np.ndarray:
    """``np.asarray``, except that Python bytes become an object array: numpy's ``S``
    dtype would silently strip trailing NUL bytes from BYTES elements."""
    if isinstance(values, np.ndarray):
        return values
    array = np.asarray(values)
    return np.array(values, dtype=object) if array.dtype.kind == "S" else array


_PLAIN_HEADERS = frozenset({h.CONTENT_TYPE, h.CORRELATION_ID})
"""A request with no header but these (the common case) skips the optional ones' lookups."""


def _header_fields(headers: h.HeaderIndex) -> _HeaderFields:
    notes: list[str] = []
    correlation_id = headers.get(h.CORRELATION_ID) or None
    if correlation_id is not None:
        _check_correlation_id(correlation_id, ErrorClass.BAD_HEADER, "header 'correlation-id'")
    if headers.names() <= _PLAIN_HEADERS:
        return _HeaderFields(correlation_id, None, None, None, None, (), plain=True)
    # Tracing is best effort: a bad traceparent (malformed, repeated, not UTF-8) costs the
    # trace link, never the request.
    try:
        traceparent = headers.get(h.TRACEPARENT)
    except BadRequest as bad:
        notes.append(f"ignored traceparent: {bad.reason}")
        traceparent = None
    if traceparent is not None and not _TRACEPARENT.fullmatch(traceparent.strip()):
        notes.append(f"ignored malformed traceparent {traceparent[:80]!r}")
        traceparent = None
    timeout_ms = _int_header(headers, h.TIMEOUT_MS, minimum=1, maximum=_INT64_MAX // 1000)
    return _HeaderFields(
        correlation_id=correlation_id,
        deadline_ms=_int_header(headers, h.DEADLINE, minimum=0, maximum=_INT64_MAX),
        priority=_int_header(headers, h.PRIORITY, minimum=0, maximum=_UINT64_MAX),
        timeout_us=None if timeout_ms is None else timeout_ms * 1000,
        traceparent=traceparent.strip() if traceparent else None,
        notes=tuple(notes),
    )


def _int_header(headers: h.HeaderIndex, name: str, *, minimum: int, maximum: int) -> int | None:
    text = headers.get(name)
    if text is None:
        return None
    text = text.strip()
    if not _DIGITS.fullmatch(text) or not minimum <= int(text) <= maximum:
        raise BadRequest(
            ErrorClass.BAD_HEADER,
            f"header {name!r} must be an integer in [{minimum}, {maximum}], got {text[:40]!r}",
        )
    return int(text)


def _check_correlation_id(value: str, error: ErrorClass, where: str) -> None:
    if not _valid_id(value):
        raise BadRequest(
            error, f"{where} must be printable and at most {MAX_CORRELATION_ID_CHARS} characters"
        )


def _build(payload: Payload, fields: _HeaderFields, content_type: str) -> InferenceRequest:
    correlation_id = _correlation_id(payload.id, fields.correlation_id)
    params = dict(payload.parameters)
    sequence_id = _sequence_id(params.pop(SEQUENCE_ID, None))
    sequence_start = _flag(params.pop(SEQUENCE_START, False), SEQUENCE_START)
    sequence_end = _flag(params.pop(SEQUENCE_END, False), SEQUENCE_END)
    if sequence_id is None and (sequence_start or sequence_end):
        raise BadRequest(
            ErrorClass.MALFORMED_REQUEST, "sequence_start/sequence_end need a sequence_id"
        )
    priority = _merge(
        fields.priority, params.pop(PRIORITY, None), PRIORITY, h.PRIORITY, _UINT64_MAX
    )
    timeout_us = _merge(
        fields.timeout_us, params.pop(TIMEOUT, None), TIMEOUT, h.TIMEOUT_MS, _INT64_MAX
    )
    return InferenceRequest(
        **payload.shared_fields(),
        correlation_id=correlation_id,
        inputs=payload.tensors,
        requested_outputs=payload.requested_outputs,
        parameters=params,
        content_type=content_type,
        deadline_ms=fields.deadline_ms,
        priority=priority,
        timeout_us=timeout_us,
        traceparent=fields.traceparent,
        sequence_id=sequence_id,
        sequence_start=sequence_start,
        sequence_end=sequence_end,
        notes=fields.notes,
    )


def _correlation_id(body_id: str, header_id: str | None) -> str:
    """The header and the body ``id`` may each carry it; one is required and they must agree."""
    if body_id:
        _check_correlation_id(body_id, ErrorClass.MALFORMED_REQUEST, "request 'id'")
        if header_id is not None and header_id != body_id:
            raise BadRequest(
                ErrorClass.CONFLICTING_CORRELATION_ID,
                f"header correlation-id {header_id[:60]!r} differs from request id {body_id[:60]!r}",
            )
        return body_id
    if header_id is None:
        raise BadRequest(
            ErrorClass.MISSING_CORRELATION_ID,
            "neither header 'correlation-id' nor request 'id' is set",
        )
    return header_id


def _sequence_id(value: ParamValue | None) -> int | str | None:
    """Triton's sequence_id: uint64 or string; 0 and "" mean "no sequence", as in Triton."""
    if value is None or value == "" or (type(value) is int and value == 0):
        return None
    if type(value) is int and 0 < value <= _UINT64_MAX:
        return value
    if isinstance(value, str):
        if len(value) > MAX_CORRELATION_ID_CHARS:
            raise BadRequest(ErrorClass.MALFORMED_REQUEST, "sequence_id string is too long")
        return value
    raise BadRequest(
        ErrorClass.MALFORMED_REQUEST, "sequence_id must be an unsigned 64-bit integer or a string"
    )


def _flag(value: ParamValue, name: str) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"parameter {name!r} must be a boolean")
    return value


def _merge(
    from_header: int | None, from_body: ParamValue | None, param: str, header: str, maximum: int
) -> int | None:
    """A setting given as header and as OIP parameter: either alone, or both agreeing."""
    if from_body is not None and (type(from_body) is not int or not 0 <= from_body <= maximum):
        raise BadRequest(
            ErrorClass.MALFORMED_REQUEST,
            f"parameter {param!r} must be an integer in [0, {maximum}]",
        )
    if from_header is not None and from_body is not None and from_header != from_body:
        raise BadRequest(
            ErrorClass.BAD_HEADER, f"header {header!r} disagrees with request parameter {param!r}"
        )
    return from_header if from_header is not None else from_body
