"""Inference result records: encoding what a stage produces, decoding it for consumers.

A result always uses the wire form of its request, so a JSON producer reads
JSON back and a gRPC-minded producer gets Triton's own ``ModelInferResponse``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from pipeline.contract import headers as h
from pipeline.contract import json_form, protobuf_form, tensors
from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.payload import ModelBody, ParamValue, Payload
from pipeline.contract.request import (
    SEQUENCE_END,
    SEQUENCE_ID,
    SEQUENCE_START,
    InferenceRequest,
    WireForm,
)


@dataclass(frozen=True, eq=False)
class InferenceResponse(ModelBody):
    """A decoded result record (consumers and tests)."""

    correlation_id: str
    outputs: dict[str, np.ndarray]
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    content_type: str = h.PROTOBUF_RESPONSE


def encode_response(
    request: InferenceRequest,
    outputs: Mapping[str, np.ndarray],
    *,
    model_name: str,
    model_version: str,
    parameters: Mapping[str, ParamValue] | None = None,
) -> tuple[bytes, str]:
    """Encode a result value in the request's form; returns ``(value, content_type)``.

    Output datatypes follow the arrays' dtypes (object arrays are BYTES, as
    ``tritonclient``'s ``as_numpy`` returns them). A stateful request's
    ``sequence_id``/``sequence_start``/``sequence_end`` are echoed in the
    response parameters so consumers of a sequence need not track them.

    Raises :class:`BadRequest` (``unencodable-output``) when an output cannot be
    written in the request's form, e.g. non-UTF-8 BYTES for a JSON request.
    """
    params: dict[str, ParamValue] = dict(parameters or {})
    if request.sequence_id is not None:
        params.update(
            {
                SEQUENCE_ID: request.sequence_id,
                SEQUENCE_START: request.sequence_start,
                SEQUENCE_END: request.sequence_end,
            }
        )
    try:
        arrays = {name: np.asarray(array) for name, array in outputs.items()}
        payload = Payload(
            id=request.correlation_id,
            model_name=model_name,
            model_version=model_version,
            tensors=arrays,
            datatypes={name: tensors.datatype_of(array) for name, array in arrays.items()},
            parameters=params,
        )
        if request.form is WireForm.JSON:
            return json_form.build_response(payload), h.JSON
        return protobuf_form.build_response(payload), h.PROTOBUF_RESPONSE
    except tensors.TensorEncodingError as exc:
        raise BadRequest(ErrorClass.UNENCODABLE_OUTPUT, str(exc)) from None


def decode_response(value: bytes | None, headers: h.HeaderPairs | None) -> InferenceResponse:
    """Decode a result record; raises only :class:`BadRequest` (same codes as for requests)."""
    if not value:
        raise BadRequest(ErrorClass.EMPTY_VALUE, "record has no value")
    content_type = h.get_header(headers, h.CONTENT_TYPE)
    if not content_type:
        raise BadRequest(ErrorClass.MISSING_CONTENT_TYPE, "header 'content-type' is required")
    media = h.media_type(content_type)
    if media == h.JSON:
        payload = json_form.parse_response(bytes(value))
    elif media in (h.PROTOBUF_RESPONSE, h.GENERIC_PROTOBUF):
        payload = protobuf_form.parse_response(bytes(value))
    else:
        raise BadRequest(
            ErrorClass.UNSUPPORTED_CONTENT_TYPE,
            f"content-type {content_type!r} is not a response type",
        )
    header_id = h.get_header(headers, h.CORRELATION_ID) or None
    if payload.id and header_id and payload.id != header_id:
        raise BadRequest(
            ErrorClass.CONFLICTING_CORRELATION_ID, "header correlation-id differs from response id"
        )
    correlation_id = payload.id or header_id
    if not correlation_id:
        raise BadRequest(
            ErrorClass.MISSING_CORRELATION_ID,
            "neither header 'correlation-id' nor response 'id' is set",
        )
    return InferenceResponse(
        **payload.shared_fields(),
        correlation_id=correlation_id,
        outputs=payload.tensors,
        parameters=payload.parameters,
        content_type=media,
    )
