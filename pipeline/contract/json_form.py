"""The JSON wire form: the OIP (KServe v2) REST request/response bodies.

JSON is the form people type (kcat, scripts, browser tools). Parsing is strict
about structure — unknown keys and duplicate keys are refused — because a typo
such as ``"input"`` for ``"inputs"`` should land in the dead-letter topic with a
clear reason, not produce a half-understood request.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

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

_REQUEST_KEYS = frozenset({"id", "model_name", "model_version", "inputs", "outputs", "parameters"})
_RESPONSE_KEYS = frozenset({"id", "model_name", "model_version", "outputs", "parameters"})
_TENSOR_KEYS = frozenset({"name", "shape", "datatype", "data", "parameters"})
_REQUIRED_TENSOR_KEYS = ("name", "shape", "datatype", "data")
_OUTPUT_REQUEST_KEYS = frozenset({"name", "parameters"})


def parse_request(value: bytes) -> Payload:
    """Decode an OIP JSON inference request (``model_name``/``model_version`` optional extensions)."""
    body = _load_object(value, _REQUEST_KEYS)
    raw_inputs = body.get("inputs")
    if raw_inputs is None or raw_inputs == []:
        raise BadRequest(ErrorClass.MISSING_INPUT, "request has no inputs")
    decoded = _tensors(raw_inputs, "inputs", duplicate=ErrorClass.DUPLICATE_INPUT)
    return _payload(body, decoded, request=True)


def parse_response(value: bytes) -> Payload:
    """Decode an OIP JSON inference response (consumers and tests)."""
    body = _load_object(value, _RESPONSE_KEYS)
    decoded = _tensors(body.get("outputs", []), "outputs", duplicate=ErrorClass.MALFORMED_REQUEST)
    return _payload(body, decoded, request=False)


def _payload(
    body: dict[str, Any], decoded: tuple[dict[str, np.ndarray], dict[str, str]], *, request: bool
) -> Payload:
    """The rest of a request or response body around its decoded tensors (a request's
    ``outputs`` names the outputs it wants; a response's held the tensors)."""
    arrays, datatypes = decoded
    return Payload(
        id=_optional_str(body, "id"),
        model_name=_optional_str(body, "model_name"),
        model_version=_optional_str(body, "model_version"),
        tensors=arrays,
        datatypes=datatypes,
        requested_outputs=_requested_outputs(body.get("outputs", [])) if request else (),
        parameters=_parameters(body.get("parameters", {})),
    )


def build_request(payload: Payload) -> bytes:
    """Encode an OIP JSON request; empty ``model_name``/``model_version`` are left out."""
    body: dict[str, Any] = {"id": payload.id}
    if payload.model_name:
        body["model_name"] = payload.model_name
    if payload.model_version:
        body["model_version"] = payload.model_version
    body["inputs"] = _tensor_list(payload)
    if payload.requested_outputs:
        body["outputs"] = [{"name": name} for name in payload.requested_outputs]
    if payload.parameters:
        body["parameters"] = dict(payload.parameters)
    return _dump(body)


def build_response(payload: Payload) -> bytes:
    """Encode an OIP JSON response."""
    body: dict[str, Any] = {
        "id": payload.id,
        "model_name": payload.model_name,
        "model_version": payload.model_version,
        "outputs": _tensor_list(payload),
    }
    if payload.parameters:
        body["parameters"] = dict(payload.parameters)
    return _dump(body)


def _dump(body: dict[str, Any]) -> bytes:
    # NaN/Infinity are written as Python's json writes them; our decoder reads them back.
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _tensor_list(payload: Payload) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "shape": list(np.shape(array)),
            "datatype": payload.datatypes[name],
            "data": tensors.to_json(array, payload.datatypes[name]),
        }
        for name, array in payload.tensors.items()
    ]


def _load_object(value: bytes, allowed_keys: frozenset[str]) -> dict[str, Any]:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, "JSON value is not valid UTF-8") from None
    try:
        body = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, "JSON nesting is too deep") from None
    except ValueError as exc:  # JSONDecodeError, or an integer literal over Python's digit limit
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"invalid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(
            ErrorClass.MALFORMED_REQUEST, f"JSON value must be an object, got {type(body).__name__}"
        )
    _check_keys(body, allowed_keys, "body")
    return body


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, "JSON object has a repeated key")
    return result


def _check_keys(obj: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise BadRequest(
            ErrorClass.MALFORMED_REQUEST, f"unknown key(s) in {where}: {', '.join(unknown)}"
        )


def _optional_str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"{key!r} must be a string")
    return value


def _tensors(
    entries: Any, where: str, *, duplicate: ErrorClass
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    if not isinstance(entries, list):
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"{where!r} must be a list")
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"each of {where!r} must be an object")
        _check_keys(entry, _TENSOR_KEYS, f"a tensor of {where!r}")
        missing = [key for key in _REQUIRED_TENSOR_KEYS if key not in entry]
        if missing:
            raise BadRequest(
                ErrorClass.MALFORMED_REQUEST, f"a tensor of {where!r} lacks {', '.join(missing)}"
            )
        name = check_name(entry["name"], "tensor")
        ensure_new(name, arrays, duplicate=duplicate)
        reject_unsupported(_object(entry.get("parameters", {}), f"{name}: parameters"), name)
        datatype = entry["datatype"]
        tensors.numpy_dtype(datatype)
        if not isinstance(entry["shape"], list):
            raise BadRequest(ErrorClass.SHAPE_MISMATCH, f"{name}: shape must be a list of integers")
        shape = tensors.check_shape(entry["shape"])
        arrays[name] = tensors.from_json(entry["data"], datatype, shape, name=name)
        datatypes[name] = datatype
    return arrays, datatypes


def _requested_outputs(entries: Any) -> tuple[str, ...]:
    if not isinstance(entries, list):
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, "'outputs' must be a list")
    names: list[str] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise BadRequest(ErrorClass.MALFORMED_REQUEST, "each of 'outputs' must be an object")
        _check_keys(entry, _OUTPUT_REQUEST_KEYS, "a requested output")
        name = check_name(entry.get("name"), "output")
        reject_unsupported(_object(entry.get("parameters", {}), f"{name}: parameters"), name)
        if name in names:
            raise BadRequest(
                ErrorClass.MALFORMED_REQUEST, f"output {name!r} is requested more than once"
            )
        names.append(name)
    return tuple(names)


def _parameters(raw: Any) -> dict[str, ParamValue]:
    return {
        check_name(k, "parameter"): check_parameter_value(k, v)
        for k, v in _object(raw, "parameters").items()
    }


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"{what} must be an object")
    return value
