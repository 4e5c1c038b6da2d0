"""Requests that repeat a layout: decoded by comparing bytes with one already validated.

A producer sends the same request over and over with a new ``id`` and new tensor values:
the same model, the same tensor names, datatypes and shapes, the same parameters. In the
protobuf form, such records are byte for byte equal except for the ``id`` string and the
contents of ``raw_input_contents`` (whose lengths the shapes fix). Parsing each one with
protobuf and re-checking every name, datatype and shape costs most of a stateless stage's
decode (issue 22: ~30 µs of ~40 per record, measured with ``benchmarks.stateless
--profile``); comparing its bytes with a validated template costs about 2.

A :class:`Layout` is learnt from a record the full decoder accepted (:func:`learn`), when
its top-level fields are in the canonical order every protobuf serializer writes
(``model_name``, ``model_version``, ``id``, ``parameters``, ``inputs``, ``outputs``,
``raw_input_contents``) and every tensor is of a fixed-size type whose raw bytes need no
further check (not BYTES, not BOOL). A later record matches it when it has:

- the same bytes before the ``id`` (its field tag included) and a one-byte ``id`` length;
- the same bytes from after the ``id`` up to the first raw contents;
- raw contents with the same field headers (so the same lengths), ending the record.

Such a record decodes, in full, to the template's request with its own ``id`` and tensor
values: the full decoder would see the same fields, check the same names, datatypes and
shapes, and merge the same parameters. The ``id`` is still checked as the full decoder
checks it (by :func:`pipeline.contract.request.decode_request`). Anything that does not match, or fails a check, goes to the full decoder,
which gives it its outcome (so every error is still the full decoder's). The tests
(tests/unit/test_request_layouts.py) decode fuzzed records both ways and compare.

Only records whose headers are ``content-type`` and ``correlation-id`` come here: the
other headers feed request fields per record.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.contract import tensors

MAX_LAYOUTS = 32
"""Layouts kept per process (the most recently used first): a stateless stage's producers
send a few; a sequence stage's parameters differ per stream and flag."""

LEARN_UNMATCHED = 64
"""Layouts learnt in a row with no record matching any: then learning backs off (a producer
whose every record differs, such as a sequence's chunks, whose ``chunk_index`` parameter
changes each time, would otherwise pay for a layout per record)."""
LEARN_BACKED_OFF_EVERY = 1024
"""While backed off, one record in this many decoded in full is still learnt from."""

MATCH_UNMATCHED = 64
"""Records in a row that matched no layout: then matching backs off too. Comparing a
sequence's chunk with each of 32 layouts that cannot match it cost 44 µs per chunk, half
its decode (measured on 779 audio chunks of 8 streams)."""
MATCH_BACKED_OFF_EVERY = 16
"""While backed off, one record in this many is still compared with the layouts (a hit
ends the back-off)."""

_ID_FIELD = 3
_RAW_FIELD = 7
_ORDER = {1: 0, 2: 1, 3: 2, 4: 3, 5: 4, 6: 5, 7: 6}  # canonical field order of ModelInferRequest
_SINGLE = {1, 2, 3}  # fields that may appear once (a repeated scalar would be merged: not a template)


@dataclass(frozen=True, eq=False)
class RawInput:
    """One tensor's raw contents in the layout: its field header (tag and length) and how to view it."""

    header: bytes
    length: int
    name: str
    dtype: np.dtype[Any]
    count: int
    shape: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Layout:
    """A validated request's bytes, less its ``id`` and tensor values."""

    media: str  # the content type's media type it came with
    head: bytes  # everything up to and including the ``id`` field's tag
    body: bytes  # everything between the ``id`` and the first raw contents
    raws: tuple[RawInput, ...]
    fixed_size: int  # the record's length less its id's
    fields: dict[str, Any]  # the request's fields besides correlation_id, inputs and parameters
    parameters: dict[str, Any]


class Layouts:
    """The layouts learnt in this process; :meth:`match` is the fast decoder's lookup."""

    def __init__(self, capacity: int = MAX_LAYOUTS) -> None:
        self.capacity = capacity
        self._layouts: list[Layout] = []
        self._lock = threading.Lock()  # decoding may run in more than one thread (tools)
        self._unmatched = 0  # layouts learnt since a record last matched one
        self._backed_off = 0  # full decodes not learnt from since the last one learnt
        self._missed = 0  # records in a row that matched no layout
        self._skipped = 0  # records not compared since the last one compared, while backed off

    def wants(self) -> bool:
        """Whether a record just decoded in full should be learnt from (:data:`LEARN_UNMATCHED`)."""
        if self._unmatched < LEARN_UNMATCHED:
            return True
        self._backed_off += 1
        if self._backed_off < LEARN_BACKED_OFF_EVERY:
            return False
        self._backed_off = 0
        return True

    def match(self, value: bytes, media: str) -> tuple[Layout, str, dict[str, np.ndarray]] | None:
        """The layout ``value`` repeats, its ``id`` (not yet checked) and its tensors (views
        of ``value``); None when it repeats none, or when matching is backed off
        (:data:`MATCH_UNMATCHED`) and this record is not one of those still compared."""
        if self._missed >= MATCH_UNMATCHED:
            self._skipped += 1
            if self._skipped < MATCH_BACKED_OFF_EVERY:
                return None
            self._skipped = 0
        for index, layout in enumerate(self._layouts):
            found = _matches(layout, value, media)
            if found is not None:
                self._unmatched = self._missed = 0
                if index:
                    self._promote(layout)
                return layout, found[0], found[1]
        self._missed += 1
        return None

    def learn(self, layout: Layout) -> None:
        self._unmatched += 1
        with self._lock:
            kept = [known for known in self._layouts if known.head != layout.head or known.body != layout.body]
            self._layouts = [layout, *kept][: self.capacity]

    def _promote(self, layout: Layout) -> None:
        with self._lock:
            if layout in self._layouts:
                self._layouts = [layout, *(known for known in self._layouts if known is not layout)]

    def __len__(self) -> int:
        return len(self._layouts)


def _matches(layout: Layout, value: bytes, media: str) -> tuple[str, dict[str, np.ndarray]] | None:
    head = layout.head
    at = len(head)
    if media != layout.media or len(value) <= at or not value.startswith(head):
        return None
    id_length = value[at]
    if id_length >= 0x80 or len(value) != layout.fixed_size + id_length:
        return None
    start = at + 1 + id_length
    if not value.startswith(layout.body, start):
        return None
    position = start + len(layout.body)
    inputs: dict[str, np.ndarray] = {}
    for raw in layout.raws:
        if not value.startswith(raw.header, position):
            return None
        position += len(raw.header)
        inputs[raw.name] = np.frombuffer(value, raw.dtype, raw.count, position).reshape(raw.shape)
        position += raw.length
    try:
        return value[at + 1 : start].decode("utf-8"), inputs
    except UnicodeDecodeError:  # protobuf refuses it too: the full decoder says so
        return None


def layout_of(value: bytes, media: str, request: Any) -> Layout | None:
    """The layout of ``value``, which the full decoder accepted as ``request`` (with no
    header but ``content-type`` and ``correlation-id``); None when it cannot be a template."""
    datatypes = [request.datatypes[name] for name in request.inputs]
    if not request.inputs or any(d in ("BYTES", "BOOL") for d in datatypes):
        return None
    body_id = request.correlation_id.encode("utf-8")
    if len(body_id) >= 0x80 or b"\x1a" + bytes([len(body_id)]) + body_id not in value:
        return None  # no id field of one length byte: not a template (cheap to tell before scanning)
    fields = _top_level_fields(value)
    if fields is None:
        return None
    numbers = [number for number, _, _, _ in fields]
    singles = [n for n in numbers if n in _SINGLE]
    ranks = [_ORDER[n] for n in numbers]
    if _ID_FIELD not in singles or len(singles) != len(set(singles)) or ranks != sorted(ranks):
        return None
    first_raw = numbers.index(_RAW_FIELD) if _RAW_FIELD in numbers else len(numbers)
    raw_fields = fields[first_raw:]
    if len(raw_fields) != len(request.inputs):
        return None
    id_index = numbers.index(_ID_FIELD)
    _, id_tag, id_data, id_end = fields[id_index]
    if id_data - id_tag != 2 or id_end - id_data >= 0x80:  # a one-byte tag and a one-byte length
        return None
    body_end = raw_fields[0][1]
    raws = []
    for (_, tag, data, end), (name, array) in zip(raw_fields, request.inputs.items(), strict=True):
        dtype = tensors.numpy_dtype(request.datatypes[name])
        raws.append(RawInput(value[tag:data], end - data, name, dtype, int(array.size), tuple(array.shape)))
    kept = {
        name: getattr(request, name)
        for name in (
            "model_name", "model_version", "datatypes", "requested_outputs", "content_type",
            "deadline_ms", "priority", "timeout_us", "traceparent", "sequence_id", "sequence_start",
            "sequence_end", "notes",
        )
    }  # fmt: skip
    return Layout(
        media=media,
        head=value[: id_tag + 1],
        body=value[id_end:body_end],
        raws=tuple(raws),
        fixed_size=len(value) - (id_end - id_data),
        fields=kept,
        parameters=dict(request.parameters),
    )


def _top_level_fields(value: bytes) -> list[tuple[int, int, int, int]] | None:
    """(field number, tag offset, data offset, end) of each top-level field, when every one
    is length-delimited (all of ``ModelInferRequest``'s are) and known; else None."""
    fields = []
    position, size = 0, len(value)
    while position < size:
        tag, data = _varint(value, position)
        if tag is None or tag & 7 != 2 or (tag >> 3) not in _ORDER:
            return None
        length, data = _varint(value, data)
        if length is None or data + length > size:
            return None
        fields.append((tag >> 3, position, data, data + length))
        position = data + length
    return fields


def _varint(value: bytes, position: int) -> tuple[int | None, int]:
    result, shift = 0, 0
    while position < len(value) and shift < 64:
        byte = value[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
    return None, position
