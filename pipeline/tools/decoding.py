"""Make sense of any record found on a pipeline topic: result, dead letter or request.

``pipeline consume`` reads result topics, dead-letter topics and, for
debugging, request topics, often several at once; so each record is
classified by what it says about itself rather than by where it was found:

* ``error-class`` header present: a **dead letter** (the original request,
  with the failure appended as headers, :func:`~pipeline.contract.records.read_dead_letter`);
* a response content type, or a stage's ``pipeline-stage`` header: a **result**;
* a request content type: a **request**;
* anything the contract's decoders refuse: **undecodable**, with their reason.

Nothing here raises on bad input: a consumer tool must be able to show
whatever is on a topic, especially what is wrong with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from pipeline.contract import headers as h
from pipeline.contract.errors import BadRequest, TextEnum
from pipeline.contract.payload import ParamValue
from pipeline.contract.records import DeadLetter, read_dead_letter
from pipeline.contract.request import InferenceRequest, decode_request
from pipeline.contract.response import InferenceResponse, decode_response
from pipeline.kafka.records import ConsumedRecord
from pipeline.tools.headers import SENT_AT_MS


class Kind(TextEnum):
    """What a consumed record turned out to be."""

    RESULT = "result"
    DEAD_LETTER = "dead-letter"
    REQUEST = "request"
    UNDECODABLE = "undecodable"


@dataclass(frozen=True, eq=False)
class Consumed:
    """One classified record. ``tensors`` are a result's outputs or a request's inputs."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    kind: Kind
    correlation_id: str | None = None
    model_name: str = ""
    model_version: str = ""
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    datatypes: dict[str, str] = field(default_factory=dict)
    dead_letter: DeadLetter | None = None
    problem: str | None = None  # why an undecodable record was refused
    sent_at_ms: int | None = None
    result_type: str | None = None  # sequence stages: chunk, segment or summary
    part: str = ""  # what distinguishes several results of one request (a segment's index)
    parameters: dict[str, ParamValue] = field(default_factory=dict)  # the OIP parameters of the body

    @property
    def identity(self) -> tuple[str | None, str | None, str]:
        """What a re-delivery repeats: one request may have several distinct results."""
        return (self.correlation_id, self.result_type, self.part)

    @property
    def latency_ms(self) -> int | None:
        """Record timestamp minus the producer's ``sent-at-ms``: end to end for a result."""
        return None if self.sent_at_ms is None else self.timestamp_ms - self.sent_at_ms


def classify(record: ConsumedRecord) -> Consumed:
    """Decode ``record`` as whatever it is; never raises for bad record contents."""
    headers = [(name, bytes(value)) for name, value in record.headers or () if value is not None]
    base = Consumed(
        **{name: getattr(record, name) for name in ("topic", "partition", "offset", "key", "value")},
        timestamp_ms=record.timestamp,
        headers=headers,
        kind=Kind.UNDECODABLE,
        correlation_id=_lenient_header(headers, h.CORRELATION_ID) or None,
        sent_at_ms=_int_or_none(_lenient_header(headers, SENT_AT_MS)),
        result_type=_lenient_header(headers, "result-type"),
    )
    dead = read_dead_letter(headers)
    if dead.error_class:
        return replace(base, kind=Kind.DEAD_LETTER, dead_letter=dead)
    first_error: BadRequest | None = None
    for kind in _attempts(headers):
        message: InferenceResponse | InferenceRequest
        try:
            if kind is Kind.RESULT:
                message = decode_response(record.value, headers)
                tensors, part = message.outputs, str(message.parameters.get("segment_index", ""))
            else:
                message = decode_request(record.value, headers)
                tensors, part = message.inputs, ""
        except BadRequest as exc:
            first_error = first_error or exc
            continue
        return replace(
            base,
            **message.shared_fields(),
            kind=kind,
            correlation_id=message.correlation_id,
            tensors=tensors,
            part=part,
            parameters=dict(message.parameters),
        )
    return replace(base, problem=str(first_error))


def _attempts(headers: list[tuple[str, bytes]]) -> tuple[Kind, ...]:
    """Which decoders to try, most likely first.

    Protobuf requests and responses must not be tried the other way round: the
    two messages share field numbers, so one parses "successfully" as the other.
    """
    content_type = _lenient_header(headers, h.CONTENT_TYPE)
    media = h.media_type(content_type) if content_type else ""
    if media == h.PROTOBUF_RESPONSE:
        return (Kind.RESULT,)
    if media == h.PROTOBUF_REQUEST:
        return (Kind.REQUEST,)
    if _lenient_header(headers, h.PIPELINE_STAGE) is not None:
        return (Kind.RESULT,) if media == h.GENERIC_PROTOBUF else (Kind.RESULT, Kind.REQUEST)
    return (Kind.REQUEST,) if media == h.GENERIC_PROTOBUF else (Kind.REQUEST, Kind.RESULT)


def _lenient_header(headers: list[tuple[str, bytes]], name: str) -> str | None:
    """A header's text, or None when absent, repeated with different values, or not UTF-8."""
    try:
        return h.get_header(headers, name)
    except BadRequest:
        return None


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None
