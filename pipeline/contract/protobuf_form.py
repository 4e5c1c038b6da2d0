"""The protobuf wire form: Triton's ``ModelInferRequest`` / ``ModelInferResponse``.

Using Triton's own gRPC messages means a worker can forward a request's
tensors to Triton without re-encoding them, and any OIP gRPC client library can
produce records for us.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from pipeline.contract import tensors
from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.payload import (
    ParamValue,
    Payload,
    check_name,
    check_parameter_value,
    ensure_new,
    reject_unsupported,
)

_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1


def parse_request(value: bytes) -> Payload:
    """Decode a ``ModelInferRequest``; tensors from ``raw_input_contents`` or typed contents."""
    message = _parse(pb.ModelInferRequest, value)
    if not message.inputs:
        raise BadRequest(ErrorClass.MISSING_INPUT, "request has no inputs")
    decoded = _tensors(
        message.inputs, message.raw_input_contents, duplicate=ErrorClass.DUPLICATE_INPUT
    )
    outputs: list[str] = []
    for output in message.outputs:
        name = check_name(output.name, "output")
        reject_unsupported(output.parameters, name)
        if name in outputs:
            raise BadRequest(
                ErrorClass.MALFORMED_REQUEST, f"output {name!r} is requested more than once"
            )
        outputs.append(name)
    return _payload(message, decoded, tuple(outputs))


def parse_response(value: bytes) -> Payload:
    """Decode a ``ModelInferResponse`` (consumers and tests)."""
    message = _parse(pb.ModelInferResponse, value)
    decoded = _tensors(
        message.outputs, message.raw_output_contents, duplicate=ErrorClass.MALFORMED_REQUEST
    )
    return _payload(message, decoded)


def _payload(
    message: Any,
    decoded: tuple[dict[str, np.ndarray], dict[str, str]],
    requested_outputs: tuple[str, ...] = (),
) -> Payload:
    """What a ``ModelInferRequest`` and a ``ModelInferResponse`` share, around their tensors."""
    arrays, datatypes = decoded
    return Payload(
        id=message.id,
        model_name=message.model_name,
        model_version=message.model_version,
        tensors=arrays,
        datatypes=datatypes,
        requested_outputs=requested_outputs,
        parameters=parameters_from(message.parameters),
    )


def build_request(payload: Payload, *, typed_contents: bool = False) -> bytes:
    """Encode a ``ModelInferRequest``; raw contents unless ``typed_contents`` (FP16 is always raw)."""
    message = pb.ModelInferRequest(
        id=payload.id, model_name=payload.model_name, model_version=payload.model_version
    )
    use_raw = not typed_contents or "FP16" in payload.datatypes.values()
    for name, array in payload.tensors.items():
        datatype = payload.datatypes[name]
        entry = message.inputs.add(name=name, datatype=datatype, shape=np.shape(array))
        if use_raw:
            message.raw_input_contents.append(tensors.to_raw(array, datatype))
        else:
            tensors.to_contents(array, datatype, entry.contents)
    for name in payload.requested_outputs:
        message.outputs.add(name=name)
    parameters_into(message.parameters, payload.parameters)
    return bytes(message.SerializeToString(deterministic=True))  # map order is per-process otherwise


def build_response(payload: Payload) -> bytes:
    """Encode a ``ModelInferResponse`` with ``raw_output_contents``, as Triton itself answers."""
    message = pb.ModelInferResponse(
        id=payload.id, model_name=payload.model_name, model_version=payload.model_version
    )
    for name, array in payload.tensors.items():
        datatype = payload.datatypes[name]
        message.outputs.add(name=name, datatype=datatype, shape=np.shape(array))
        message.raw_output_contents.append(tensors.to_raw(array, datatype))
    parameters_into(message.parameters, payload.parameters)
    return bytes(message.SerializeToString(deterministic=True))  # map order is per-process otherwise


def parameters_from(parameters: Any) -> dict[str, ParamValue]:
    """``map<string, InferParameter>`` -> plain dict (sorted: protobuf maps have no order)."""
    result: dict[str, ParamValue] = {}
    for key in sorted(parameters):
        check_name(key, "parameter")
        choice = parameters[key].WhichOneof("parameter_choice")
        if choice is None:
            raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"parameter {key!r} has no value")
        result[key] = check_parameter_value(key, getattr(parameters[key], choice))
    return result


def parameters_into(target: Any, parameters: dict[str, ParamValue]) -> None:
    """Plain dict -> ``map<string, InferParameter>``; ints above int64 use ``uint64_param``."""
    for key, value in parameters.items():
        slot = target[key]
        if isinstance(value, bool):
            slot.bool_param = value
        elif isinstance(value, int):
            if value > _INT64_MAX:
                if value > _UINT64_MAX:
                    raise ValueError(f"parameter {key!r} = {value} does not fit in 64 bits")
                slot.uint64_param = value
            else:
                slot.int64_param = value
        elif isinstance(value, float):
            slot.double_param = value
        else:
            slot.string_param = str(value)


def _parse(message_type: Any, value: bytes) -> Any:
    try:
        return message_type.FromString(value)
    except Exception as exc:  # noqa: BLE001 - DecodeError, or upb's RuntimeError on odd input
        raise BadRequest(
            ErrorClass.MALFORMED_REQUEST, f"not a valid {message_type.__name__}: {exc}"
        ) from None


@functools.lru_cache(maxsize=256)
def _layout(name: str, datatype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The checks of a tensor entry that depend on its layout alone (name, datatype, shape),
    run once per layout: a producer sends the same few over and over (issue 22, decode cost).
    A failing layout raises each time: the cache keeps only what passed. Bounded, so a
    stream of distinct layouts evicts, never grows."""
    check_name(name, "tensor")
    tensors.numpy_dtype(datatype)
    return tensors.check_shape(list(shape))


def _tensors(
    entries: Sequence[Any], raw_contents: Sequence[bytes], *, duplicate: ErrorClass
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Decode tensor entries (``InferInputTensor`` or ``InferOutputTensor``, same fields).

    As in Triton, raw contents are all-or-nothing: either every tensor has a raw
    entry (same order) and none has typed contents, or none is raw.
    """
    if raw_contents and len(raw_contents) != len(entries):
        raise BadRequest(
            ErrorClass.MALFORMED_REQUEST,
            f"{len(raw_contents)} raw contents for {len(entries)} tensors; need one each",
        )
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    raw_iter: Iterable[bytes | None] = raw_contents if raw_contents else [None] * len(entries)
    for entry, raw in zip(entries, raw_iter, strict=True):
        name = entry.name
        # Same checks, same order, same first error as name, duplicate, parameters, datatype,
        # shape one by one: a name already in ``arrays`` has passed its check.
        ensure_new(name, arrays, duplicate=duplicate)
        if entry.parameters:
            reject_unsupported(entry.parameters, check_name(name, "tensor"))
        datatype = entry.datatype
        shape = _layout(name, datatype, tuple(entry.shape))
        if raw is not None:
            if entry.contents.ListFields():
                raise BadRequest(
                    ErrorClass.MALFORMED_REQUEST, f"{name}: both raw and typed contents given"
                )
            array = tensors.from_raw(raw, datatype, shape, name=name)
        else:
            array = tensors.from_contents(entry.contents, datatype, shape, name=name)
        arrays[name] = array
        datatypes[name] = datatype
    return arrays, datatypes
