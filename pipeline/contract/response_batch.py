"""One Triton batch's results encoded in one pass: what :func:`encode_response` writes for
each request, byte for byte, with the work the requests share done once per batch.

The common case of a stateless stage is a batch of protobuf requests for one model whose
results have one layout: the same output names, datatypes and shapes, no parameters. Every
``ModelInferResponse`` of such a batch differs only in its ``id`` and its raw contents.
protobuf writes a message's fields in field-number order (``model_name`` 1,
``model_version`` 2, ``id`` 3, ``parameters`` 4, ``outputs`` 5, ``raw_output_contents`` 6),
and concatenated encodings of one message type parse as their merge, so the per-request
value is four serialized parts: the batch's model fields and output descriptions,
serialized once, around the request's ``id`` and its contents, serialized by protobuf
itself (nothing here writes a tag or a length). ``tests/unit/test_response_batch.py``
checks the bytes against :func:`encode_response` over generated batches.

Anything else (a JSON request, a sequence's echoed parameters, request parameters, BYTES
outputs, outputs whose layout differs) answers None: the stage encodes request by request.
Measured on the 2-core machine, 64 results of ``dense_classifier`` (``logits`` FP32 [1, 4]):
see docs/benchmarks.md, "Results encoded per batch".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from pipeline.contract import headers as h
from pipeline.contract import tensors
from pipeline.contract.request import InferenceRequest, WireForm

Layout = tuple[tuple[str, str, tuple[int, ...]], ...]
"""(name, datatype, shape) of each output, in order."""


def encode_responses(
    requests: Sequence[InferenceRequest],
    outputs: Sequence[Mapping[str, np.ndarray]],
    *,
    model_name: str,
    model_version: str,
) -> list[bytes] | None:
    """Each request's result value (content type ``h.PROTOBUF_RESPONSE``), as
    ``encode_response(request, outputs, model_name=..., model_version=..., parameters=
    request.parameters)`` writes it; None when the batch is not the common case."""
    if not requests or not _plain(requests):
        return None
    layout = _layout(outputs[0])
    if layout is None:
        return None
    names = tuple(name for name, _, _ in layout)
    expected = [(tensors.numpy_dtype(datatype), shape) for _, datatype, shape in layout]
    contents: list[list[bytes]] = []
    for each in outputs:
        if tuple(each) != names:
            return None
        raws = []
        for array, (dtype, shape) in zip(each.values(), expected, strict=True):
            if not isinstance(array, np.ndarray) or array.dtype != dtype or array.shape != shape:
                return None  # another layout, or another byte order: encode_response decides
            raws.append(array.tobytes())
        contents.append(raws)
    return _assemble(requests, layout, contents, model_name, model_version)


def encode_batched_responses(
    requests: Sequence[InferenceRequest],
    arrays: Mapping[str, np.ndarray],
    rows: Sequence[int],
    *,
    model_name: str,
    model_version: str,
) -> list[bytes] | None:
    """:func:`encode_responses` from the whole batch's outputs (``arrays``, first axis the
    rows, ``rows[i]`` of them request ``i``'s, in order), never split into per-request arrays:
    each output is copied out once (``tobytes``) and each request's contents are slices of
    those bytes. None unless every request has as many rows (one layout) and the common case holds."""
    if not requests or not rows or any(count != rows[0] for count in rows) or not _plain(requests):
        return None
    count = rows[0]
    layout = _layout({name: array[:count] for name, array in arrays.items()})
    if layout is None:
        return None
    whole: list[tuple[bytes, int]] = []
    for (_, datatype, _), array in zip(layout, arrays.values(), strict=True):
        if not isinstance(array, np.ndarray) or array.dtype != tensors.numpy_dtype(datatype):
            return None  # another byte order: encode_response decides
        if array.shape[0] != count * len(requests):
            return None
        step = array[:count].nbytes
        whole.append((array.tobytes(), step))
    contents = [[raw[i * step : (i + 1) * step] for raw, step in whole] for i in range(len(requests))]
    return _assemble(requests, layout, contents, model_name, model_version)


def _assemble(
    requests: Sequence[InferenceRequest], layout: Layout, contents: list[list[bytes]], model_name: str, model_version: str
) -> list[bytes]:
    """Each request's value: the batch's model fields and output descriptions, serialized
    once, around the request's ``id`` and its raw contents."""
    model = pb.ModelInferResponse(model_name=model_name, model_version=model_version).SerializeToString()
    described = pb.ModelInferResponse()
    for name, datatype, shape in layout:
        described.outputs.add(name=name, datatype=datatype, shape=shape)
    shared = described.SerializeToString()
    return [
        model
        + pb.ModelInferResponse(id=request.correlation_id).SerializeToString()
        + shared
        + pb.ModelInferResponse(raw_output_contents=raws).SerializeToString()
        for request, raws in zip(requests, contents, strict=True)
    ]


def _plain(requests: Sequence[InferenceRequest]) -> bool:
    """Protobuf requests whose results carry no parameters (none given, no sequence)."""
    forms = {r.content_type for r in requests}
    return all(WireForm.of(form) is not WireForm.JSON for form in forms) and not any(
        r.parameters or r.sequence_id is not None for r in requests
    )


def _layout(outputs: Mapping[str, np.ndarray]) -> Layout | None:
    """The first result's layout; None for BYTES (length-prefixed, per element) or a dtype
    with no KServe datatype (encode_response names it)."""
    try:
        layout = tuple((name, tensors.datatype_of(np.asarray(a)), np.shape(a)) for name, a in outputs.items())
    except tensors.TensorEncodingError:
        return None
    if not layout or any(datatype == "BYTES" for _, datatype, _ in layout):
        return None
    return layout


CONTENT_TYPE = h.PROTOBUF_RESPONSE
"""The content type of every value :func:`encode_responses` returns."""
