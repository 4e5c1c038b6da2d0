"""Tensor encodings of the Open Inference Protocol (KServe v2), to and from numpy.

Three encodings exist on the wire and all three are decoded here:

* raw bytes (``raw_input_contents`` / ``raw_output_contents``): little-endian,
  row-major; BYTES elements as Triton serializes them, each a 4-byte
  little-endian length followed by that many bytes;
* protobuf typed contents (``InferTensorContents``), one repeated field per
  datatype family;
* JSON ``data``: a flat or nested list in row-major order.

Every decoder checks the element count against the declared shape *before*
allocating anything, and every shape is capped, so a hostile record cannot make
a worker allocate more than a bounded multiple of the record's own size.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from pipeline.contract.errors import BadRequest, ErrorClass

#: KServe v2 datatype name -> numpy dtype (explicitly little-endian, as on the wire).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}

#: ``InferTensorContents`` field carrying each datatype. FP16 has none: raw only.
CONTENTS_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

#: Most elements one tensor may declare (2**28: 1 GiB of FP32); zero dims are not counted.
MAX_ELEMENTS = 1 << 28
#: Most dimensions one tensor may declare (numpy's own limit).
MAX_DIMS = 32

_LENGTH_PREFIX = struct.Struct("<I")


class TensorEncodingError(ValueError):
    """An array cannot be written in the requested encoding (e.g. non-UTF-8 BYTES as JSON)."""


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a KServe datatype name; unknown names are refused."""
    try:
        return DATATYPES[datatype]
    except (KeyError, TypeError):
        raise BadRequest(
            ErrorClass.DATATYPE_MISMATCH, f"{datatype!r} is not a KServe v2 datatype"
        ) from None


def datatype_of(array: np.ndarray) -> str:
    """The KServe datatype name for an array's dtype (str/bytes/object arrays are BYTES)."""
    kind = array.dtype.kind
    if kind in "OSU":
        return "BYTES"
    if kind == "b":
        return "BOOL"
    if kind in "iuf":
        name = {"i": "INT", "u": "UINT", "f": "FP"}[kind] + str(array.dtype.itemsize * 8)
        if name in DATATYPES:
            return name
    raise TensorEncodingError(f"numpy dtype {array.dtype} has no KServe v2 datatype")


def check_shape(shape: Sequence[Any]) -> tuple[int, ...]:
    """Validate a declared shape: a list of non-negative ints, capped in rank and size."""
    if not isinstance(shape, (list, tuple)):
        raise BadRequest(
            ErrorClass.SHAPE_MISMATCH,
            f"shape must be a list of integers, got {type(shape).__name__}",
        )
    dims = list(shape)
    if len(dims) > MAX_DIMS:
        raise BadRequest(
            ErrorClass.SHAPE_MISMATCH,
            f"shape has {len(dims)} dimensions, at most {MAX_DIMS} allowed",
        )
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise BadRequest(
                ErrorClass.SHAPE_MISMATCH, f"shape {dims!r} has a non-integer dimension"
            )
        if dim < 0:
            raise BadRequest(ErrorClass.SHAPE_MISMATCH, f"shape {dims!r} has a negative dimension")
        if dim > MAX_ELEMENTS:
            raise BadRequest(
                ErrorClass.OVERSIZED_VALUE, f"shape {dims!r} has a dimension above {MAX_ELEMENTS}"
            )
    checked = tuple(dims)  # plain ints, checked above
    # Zero dims are skipped: [0, 2**20, 2**20, 2**20] holds nothing, yet numpy still refuses it.
    elements = 1
    for dim in checked:
        if dim:
            elements *= dim
    if elements > MAX_ELEMENTS:
        raise BadRequest(
            ErrorClass.OVERSIZED_VALUE,
            f"shape {list(checked)} declares more than {MAX_ELEMENTS} elements",
        )
    return checked


# --- raw bytes ---------------------------------------------------------------------------


def from_raw(
    raw: bytes, datatype: str, shape: tuple[int, ...], *, name: str = "tensor"
) -> np.ndarray:
    """Decode raw little-endian (or length-prefixed BYTES) contents into an array of ``shape``.

    Numeric arrays are read-only views over ``raw``: no copy, and nobody
    downstream can mutate a request by accident.
    """
    dtype = numpy_dtype(datatype)
    count = math.prod(shape)
    if datatype == "BYTES":
        return deserialize_bytes(raw, count, name=name).reshape(shape)
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise BadRequest(
            ErrorClass.DATA_SIZE_MISMATCH,
            f"{name}: {len(raw)} raw bytes for shape {list(shape)} of {datatype}, expected {expected}",
        )
    if datatype == "BOOL":
        octets = np.frombuffer(raw, dtype=np.uint8)
        if octets.size and int(octets.max()) > 1:
            raise BadRequest(
                ErrorClass.DATATYPE_MISMATCH, f"{name}: BOOL raw bytes must each be 0 or 1"
            )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def to_raw(array: np.ndarray, datatype: str) -> bytes:
    """Encode an array as raw little-endian bytes (BYTES: length-prefixed elements)."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    return np.ascontiguousarray(array, dtype=numpy_dtype(datatype)).tobytes()


def deserialize_bytes(raw: bytes, count: int, *, name: str = "tensor") -> np.ndarray:
    """Split Triton's length-prefixed BYTES serialization into exactly ``count`` elements."""
    if count * _LENGTH_PREFIX.size > len(raw):
        raise BadRequest(
            ErrorClass.DATA_SIZE_MISMATCH,
            f"{name}: {len(raw)} raw bytes cannot hold {count} length-prefixed BYTES elements",
        )
    view = memoryview(raw)
    items: list[bytes] = []
    offset = 0
    for _ in range(count):
        if offset + _LENGTH_PREFIX.size > len(raw):
            raise BadRequest(
                ErrorClass.DATA_SIZE_MISMATCH, f"{name}: BYTES data ends inside a length prefix"
            )
        (length,) = _LENGTH_PREFIX.unpack_from(raw, offset)
        offset += _LENGTH_PREFIX.size
        if offset + length > len(raw):
            raise BadRequest(
                ErrorClass.DATA_SIZE_MISMATCH, f"{name}: BYTES element overruns the data"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != len(raw):
        raise BadRequest(
            ErrorClass.DATA_SIZE_MISMATCH,
            f"{name}: {len(raw) - offset} bytes left after {count} BYTES elements",
        )
    return _object_array(items)


def serialize_bytes(array: np.ndarray | Iterable[Any]) -> bytes:
    """Triton's BYTES serialization: per element, 4-byte LE length then the bytes, row-major."""
    parts: list[bytes] = []
    for item in np.asarray(array, dtype=object).ravel(order="C"):
        data = as_bytes(item)
        parts.append(_LENGTH_PREFIX.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def as_bytes(item: Any) -> bytes:
    """One BYTES element: bytes-like as is, ``str`` as UTF-8, anything else via ``str()`` like tritonclient."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    return str(item).encode("utf-8")


def _object_array(items: list[bytes]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


# --- protobuf typed contents ---------------------------------------------------------------


def from_contents(
    contents: Any, datatype: str, shape: tuple[int, ...], *, name: str = "tensor"
) -> np.ndarray:
    """Decode an ``InferTensorContents`` message; only the datatype's own field may be set."""
    numpy_dtype(datatype)
    expected_field = CONTENTS_FIELDS.get(datatype)
    present = [field.name for field, _ in contents.ListFields()]
    stray = [f for f in present if f != expected_field]
    if stray:
        where = f"field {expected_field}" if expected_field else "raw_input_contents only"
        raise BadRequest(
            ErrorClass.DATATYPE_MISMATCH,
            f"{name}: {datatype} data belongs in {where}, got {', '.join(stray)}",
        )
    values = list(getattr(contents, expected_field)) if expected_field else []
    count = math.prod(shape)
    if len(values) != count:
        raise BadRequest(
            ErrorClass.DATA_SIZE_MISMATCH,
            f"{name}: {len(values)} elements for shape {list(shape)}, expected {count}",
        )
    if datatype == "BYTES":
        return _object_array(values).reshape(shape)
    if datatype.startswith(("INT", "UINT")):
        _check_int_range(values, datatype, name)
    return np.array(values, dtype=DATATYPES[datatype]).reshape(shape)


def to_contents(array: np.ndarray, datatype: str, contents: Any) -> None:
    """Fill an ``InferTensorContents`` message from an array (FP16 cannot: use raw)."""
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise TensorEncodingError(
            f"{datatype} has no typed contents field; send it as raw contents"
        )
    flat = np.asarray(array, dtype=object if datatype == "BYTES" else numpy_dtype(datatype)).ravel(
        order="C"
    )
    values = [as_bytes(v) for v in flat] if datatype == "BYTES" else flat.tolist()
    getattr(contents, field).extend(values)


# --- JSON data ---------------------------------------------------------------------------


def from_json(
    data: Any, datatype: str, shape: tuple[int, ...], *, name: str = "tensor"
) -> np.ndarray:
    """Decode OIP JSON ``data`` (flat or nested list, row-major; a bare scalar is one element).

    Nesting is flattened and only the total element count is checked against
    ``shape``. Element types are strict: BOOL takes only ``true``/``false``,
    integers only in range, floats any JSON number that fits the float type,
    BYTES only strings (sent as their UTF-8 bytes).
    """
    dtype = numpy_dtype(datatype)
    flat = _flatten(data, name)
    count = math.prod(shape)
    if len(flat) != count:
        raise BadRequest(
            ErrorClass.DATA_SIZE_MISMATCH,
            f"{name}: {len(flat)} elements for shape {list(shape)}, expected {count}",
        )
    kinds = {type(v) for v in flat}
    if datatype == "BYTES":
        _require_kinds(kinds, {str}, datatype, name)
        try:
            return _object_array([v.encode("utf-8") for v in flat]).reshape(shape)
        except UnicodeEncodeError:
            raise BadRequest(
                ErrorClass.DATATYPE_MISMATCH, f"{name}: BYTES string is not encodable as UTF-8"
            ) from None
    if datatype == "BOOL":
        _require_kinds(kinds, {bool}, datatype, name)
        return np.array(flat, dtype=dtype).reshape(shape)
    if datatype.startswith(("INT", "UINT")):
        _require_kinds(kinds, {int}, datatype, name)
        _check_int_range(flat, datatype, name)
        return np.array(flat, dtype=dtype).reshape(shape)
    _require_kinds(kinds, {int, float}, datatype, name)
    return _floats(flat, dtype, datatype, name).reshape(shape)


def to_json(array: np.ndarray, datatype: str) -> list[Any]:
    """A flat row-major JSON list for an array (BYTES elements must be UTF-8)."""
    if datatype == "BYTES":
        try:
            return [
                as_bytes(v).decode("utf-8")
                for v in np.asarray(array, dtype=object).ravel(order="C")
            ]
        except UnicodeDecodeError:
            raise TensorEncodingError(
                "BYTES element is not UTF-8 text, so it has no JSON form"
            ) from None
    return list(np.asarray(array, dtype=numpy_dtype(datatype)).ravel(order="C").tolist())


def _flatten(data: Any, name: str) -> list[Any]:
    """Row-major flattening without recursion (nesting depth is attacker-chosen)."""
    if not isinstance(data, list):
        data = [data]
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            if isinstance(item, dict) or item is None:
                raise BadRequest(
                    ErrorClass.DATATYPE_MISMATCH, f"{name}: data holds a non-scalar element"
                )
            flat.append(item)
        else:
            stack.pop()
    return flat


def _require_kinds(kinds: set[type], allowed: set[type], datatype: str, name: str) -> None:
    wrong = kinds - allowed
    if wrong:
        got = ", ".join(sorted(k.__name__ for k in wrong))
        raise BadRequest(
            ErrorClass.DATATYPE_MISMATCH, f"{name}: {datatype} data holds values of type {got}"
        )


def _check_int_range(values: Sequence[int], datatype: str, name: str) -> None:
    if not values:
        return
    info = np.iinfo(DATATYPES[datatype])
    low, high = min(values), max(values)
    if low < info.min or high > info.max:
        raise BadRequest(ErrorClass.DATATYPE_MISMATCH, f"{name}: value out of range for {datatype}")


def _floats(values: list[Any], dtype: np.dtype, datatype: str, name: str) -> np.ndarray:
    try:
        wide = np.array(values, dtype=np.float64)
    except OverflowError:
        raise BadRequest(
            ErrorClass.DATATYPE_MISMATCH, f"{name}: value out of range for {datatype}"
        ) from None
    with np.errstate(over="ignore"):
        narrow = wide.astype(dtype)
    if np.any(np.isfinite(wide) & ~np.isfinite(narrow)):
        raise BadRequest(ErrorClass.DATATYPE_MISMATCH, f"{name}: value out of range for {datatype}")
    return narrow
