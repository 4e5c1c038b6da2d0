"""Fuzzing the trust boundary: whatever arrives, decode_request returns or raises BadRequest.

Any other exception escaping would crash a stage on a producer's bad record
instead of dead-lettering it, so these properties are the contract's safety net.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.grpc import service_pb2 as pb

from pipeline.contract import BadRequest, InferenceRequest, decode_request, encode_request
from pipeline.contract import headers as h
from pipeline.contract.tensors import DATATYPES

FUZZ = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

HEADER_NAMES = [
    h.CONTENT_TYPE,
    h.CORRELATION_ID,
    h.TRACEPARENT,
    h.DEADLINE,
    h.PRIORITY,
    h.TIMEOUT_MS,
    "x-other",
]
HEADER_VALUES = [
    b"application/json",
    b"application/x-protobuf",
    h.PROTOBUF_REQUEST.encode(),
    b"c-1",
    b"0",
    b"1",
    b"-1",
    b"18446744073709551616",
    b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    b"\xff\xfe",
    b"",
]

random_headers = st.lists(
    st.tuples(
        st.sampled_from(HEADER_NAMES) | st.text(max_size=12),
        st.sampled_from(HEADER_VALUES) | st.binary(max_size=24) | st.none(),
    ),
    max_size=6,
)
# Usually lead with a content type we accept, so the body parsers get exercised too.
content_types = st.sampled_from(
    [b"application/json", b"application/x-protobuf", h.PROTOBUF_REQUEST.encode()]
)
header_lists = st.one_of(
    random_headers,
    st.builds(
        lambda ct, rest: [(h.CONTENT_TYPE, ct), (h.CORRELATION_ID, b"c-1")] + rest,
        content_types,
        random_headers,
    ),
)

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=40,
)

DTYPE_NAMES = sorted(DATATYPES) + ["FP8", "", "fp32"]
json_elements = st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=4)


@st.composite
def plausible_tensor(draw: st.DrawFn) -> dict[str, Any]:
    """A tensor that is valid or one small step away from it (wrong count, type or nesting)."""
    datatype = draw(st.sampled_from(DTYPE_NAMES))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    count = int(np.prod(shape)) + draw(st.sampled_from([0, 0, 0, 1, -1]))
    elements = _matching_elements(datatype) if draw(st.integers(0, 3)) else json_elements
    flat = draw(st.lists(elements, min_size=max(count, 0), max_size=max(count, 0)))
    data: Any = (
        np.array(flat, dtype=object).reshape(shape).tolist()
        if len(flat) == np.prod(shape) and draw(st.booleans())
        else flat
    )
    return {
        "name": draw(st.sampled_from(["x", "y"])),
        "shape": shape,
        "datatype": datatype,
        "data": data,
    }


def _matching_elements(datatype: str) -> st.SearchStrategy[Any]:
    """JSON elements of the right kind for ``datatype``, integers straying a little out of range."""
    if datatype == "BOOL":
        return st.booleans()
    if datatype == "BYTES":
        return st.text(max_size=4)
    if datatype.startswith(("INT", "UINT")):
        info = np.iinfo(DATATYPES[datatype])
        return st.integers(int(info.min) - 1, int(info.max) + 1)
    return st.floats() | st.integers(-1000, 1000)


json_tensor = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["x", "y", ""]) | json_scalars,
        "shape": st.lists(st.integers(-2, 4), max_size=3) | json_values,
        "datatype": st.sampled_from(DTYPE_NAMES) | json_scalars,
        "data": json_values,
    },
    optional={"parameters": json_values},
)
almost_requests = st.fixed_dictionaries(
    {
        "inputs": st.lists(plausible_tensor(), min_size=1, max_size=3)
        | st.lists(json_tensor, max_size=3)
        | json_values
    },
    optional={
        "id": st.sampled_from(["c-1", ""]) | json_scalars,
        "outputs": st.lists(
            st.fixed_dictionaries({"name": st.text(max_size=4) | json_scalars}), max_size=2
        )
        | json_values,
        "parameters": st.dictionaries(
            st.sampled_from(
                ["sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "k"]
            ),
            json_scalars,
        )
        | json_values,
    },
)


def _decode_or_refuse(value: bytes | None, headers: Any) -> None:
    try:
        result = decode_request(value, headers)
    except BadRequest as exc:
        assert exc.reason and "\n" not in exc.reason
        return
    assert isinstance(result, InferenceRequest)
    assert result.correlation_id and result.inputs
    assert list(result.inputs) == list(result.datatypes)


@FUZZ
@given(value=st.binary(max_size=512), headers=header_lists)
def test_arbitrary_bytes_and_headers(value: bytes, headers: list[tuple[str, bytes | None]]) -> None:
    _decode_or_refuse(value, headers)


@FUZZ
@given(body=json_values | almost_requests, correlation=st.sampled_from([None, b"c-1", b"other"]))
def test_arbitrary_json(body: Any, correlation: bytes | None) -> None:
    headers = [(h.CONTENT_TYPE, b"application/json")]
    if correlation is not None:
        headers.append((h.CORRELATION_ID, correlation))
    _decode_or_refuse(json.dumps(body).encode(), headers)


def _valid_protobuf_records() -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    inputs = {
        "f": np.arange(6, dtype=np.float32).reshape(2, 3),
        "s": np.array([b"ab", b"", b"xyz"], dtype=object),
        "b": np.array([True, False]),
        "h": np.array([1.5, -2.0], dtype=np.float16),
    }
    records = []
    for typed in (False, True):
        chosen = {k: v for k, v in inputs.items() if not (typed and k == "h")}
        record = encode_request(
            chosen,
            correlation_id="c-1",
            model_name="m",
            requested_outputs=["y"],
            typed_contents=typed,
            parameters={"sequence_id": 5, "sequence_start": True, "k": 1.5},
        )
        records.append((record.value, record.headers))
    return records


VALID_PROTOBUF = _valid_protobuf_records()


@pytest.mark.parametrize("index", range(len(VALID_PROTOBUF)), ids=["raw", "typed"])
def test_mutation_seeds_are_valid(index: int) -> None:
    value, headers = VALID_PROTOBUF[index]
    assert decode_request(value, headers).inputs


@FUZZ
@given(data=st.data())
def test_mutated_protobuf(data: st.DataObject) -> None:
    value, headers = data.draw(st.sampled_from(VALID_PROTOBUF))
    mutated = bytearray(value)
    for _ in range(data.draw(st.integers(1, 3))):
        kind = data.draw(
            st.sampled_from(["flip", "flip", "set", "set", "truncate", "insert", "delete"])
        )
        if not mutated:
            break
        at = data.draw(st.integers(0, len(mutated) - 1))
        if kind == "flip":
            mutated[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set":
            mutated[at] = data.draw(st.integers(0, 255))
        elif kind == "truncate":
            del mutated[at:]
        elif kind == "insert":
            mutated[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del mutated[at : at + data.draw(st.integers(1, 8))]
    _decode_or_refuse(bytes(mutated), headers)


@FUZZ
@given(data=st.data())
def test_structurally_mutated_protobuf(data: st.DataObject) -> None:
    """Well-formed protobuf with wrong meaning: shapes, datatypes, contents, parameters, names."""
    value, headers = data.draw(st.sampled_from(VALID_PROTOBUF))
    message = pb.ModelInferRequest.FromString(value)
    for _ in range(data.draw(st.integers(1, 3))):
        entry = message.inputs[data.draw(st.integers(0, len(message.inputs) - 1))]
        kind = data.draw(
            st.sampled_from(["shape", "datatype", "raw", "raw-count", "contents", "param", "name"])
        )
        if kind == "shape":
            del entry.shape[:]
            entry.shape.extend(
                data.draw(st.lists(st.integers(-2, 2**40) | st.integers(0, 4), max_size=4))
            )
        elif kind == "datatype":
            entry.datatype = data.draw(st.sampled_from(DTYPE_NAMES))
        elif kind == "raw" and message.raw_input_contents:
            message.raw_input_contents[0] = data.draw(st.binary(max_size=40))
        elif kind == "raw-count":
            message.raw_input_contents.append(data.draw(st.binary(max_size=8)))
        elif kind == "contents":
            field = data.draw(
                st.sampled_from(
                    ["int_contents", "uint64_contents", "fp32_contents", "bool_contents"]
                )
            )
            getattr(entry.contents, field).append(
                data.draw(st.integers(0, 255)) if field != "bool_contents" else True
            )
        elif kind == "param":
            key = data.draw(
                st.sampled_from(
                    ["sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "k"]
                )
            )
            slot = message.parameters[key]
            choice = data.draw(
                st.sampled_from(
                    ["bool_param", "int64_param", "string_param", "double_param", "uint64_param"]
                )
            )
            strategy = {
                "bool_param": st.booleans(),
                "int64_param": st.integers(-(2**63), 2**63 - 1),
                "string_param": st.text(max_size=8),
                "double_param": st.floats(),
                "uint64_param": st.integers(0, 2**64 - 1),
            }[choice]
            setattr(slot, choice, data.draw(strategy))
        else:
            entry.name = data.draw(st.sampled_from(["", "f", "s", "b", "z" * 300]))
    _decode_or_refuse(message.SerializeToString(), headers)


NUMERIC = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
]


@ROUND_TRIP
@given(
    data=st.data(),
    datatype=st.sampled_from(NUMERIC),
    form=st.sampled_from(["protobuf", "json"]),
    typed=st.booleans(),
)
def test_encode_decode_round_trips_numeric_arrays(
    data: st.DataObject, datatype: str, form: str, typed: bool
) -> None:
    array = data.draw(
        hnp.arrays(
            DATATYPES[datatype], hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
        )
    )
    record = encode_request({"t": array}, correlation_id="rt", form=form, typed_contents=typed)
    request = decode_request(record.value, record.headers)
    got = request.inputs["t"]
    assert request.datatypes == {"t": datatype}
    assert got.dtype == array.dtype and got.shape == array.shape
    np.testing.assert_array_equal(got, array)
    # Signed zeros survive too (NaN signs need not: JSON's NaN has none).
    if array.dtype.kind == "f":
        numbers = ~np.isnan(array)
        assert np.array_equal(np.signbit(got)[numbers], np.signbit(array)[numbers])


def _reference_tensors(entries: Any, raw_contents: Any) -> Any:
    """protobuf_form._tensors as it was before its layout checks were cached (issue 22): every
    check on every entry, in this order. The equivalence property below holds the cached
    version to its outcomes, first error included."""
    from pipeline.contract import tensors
    from pipeline.contract.errors import ErrorClass
    from pipeline.contract.payload import check_name, ensure_new, reject_unsupported

    if raw_contents and len(raw_contents) != len(entries):
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, "raw count")
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for entry, raw in zip(entries, raw_contents if raw_contents else [None] * len(entries), strict=True):
        name = check_name(entry.name, "tensor")
        ensure_new(name, arrays, duplicate=ErrorClass.DUPLICATE_INPUT)
        reject_unsupported(entry.parameters, name)
        datatype = entry.datatype
        tensors.numpy_dtype(datatype)
        shape = tensors.check_shape(list(entry.shape))
        if raw is not None:
            if entry.contents.ListFields():
                raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"{name}: both raw and typed contents given")
            arrays[name] = tensors.from_raw(raw, datatype, shape, name=name)
        else:
            arrays[name] = tensors.from_contents(entry.contents, datatype, shape, name=name)
        datatypes[name] = datatype
    return arrays, datatypes


def _outcome(decode: Any, message: Any) -> Any:
    try:
        arrays, datatypes = decode(message.inputs, message.raw_input_contents)
    except BadRequest as bad:
        return ("refused", bad.error_class, bad.reason)
    return ("decoded", {k: (v.dtype.str, v.shape, v.tobytes()) for k, v in arrays.items()}, datatypes)


@FUZZ
@given(data=st.data())
def test_cached_layout_checks_decode_and_refuse_as_every_check_did(data: st.DataObject) -> None:
    """Entries of every kind of wrongness, alone and together (bad and repeated names, unknown
    datatypes, bad shapes, unsupported tensor parameters, raw beside typed contents): the
    cached layout checks give the reference's outcome, and the same error when they refuse.
    Each message is decoded twice, so the second decode meets a warm cache."""
    from pipeline.contract import protobuf_form
    from pipeline.contract.errors import ErrorClass

    message = pb.ModelInferRequest()
    raw = data.draw(st.booleans())
    for _ in range(data.draw(st.integers(1, 3))):
        entry = message.inputs.add(
            name=data.draw(st.sampled_from(["a", "b", "", "z" * 300])),
            datatype=data.draw(st.sampled_from(["FP32", "INT8", "BOOL", "BYTES", "FP33", ""])),
        )
        entry.shape.extend(data.draw(st.lists(st.integers(-1, 3) | st.just(2**40), max_size=3)))
        if data.draw(st.integers(0, 4)) == 0:
            entry.parameters[data.draw(st.sampled_from(["binary_data_size", "k"]))].int64_param = 1
        if data.draw(st.integers(0, 4)) == 0:
            entry.contents.int_contents.append(1)
        if raw:
            message.raw_input_contents.append(data.draw(st.binary(max_size=16)))

    def cached(entries: Any, raw_contents: Any) -> Any:
        return protobuf_form._tensors(entries, raw_contents, duplicate=ErrorClass.DUPLICATE_INPUT)

    expected = _outcome(_reference_tensors, message)
    got = [_outcome(cached, message) for _ in range(2)]
    if expected[0] == "refused" and expected[2] == "raw count":
        assert got[0][:2] == got[1][:2] == expected[:2]
    else:
        assert got[0] == got[1] == expected
