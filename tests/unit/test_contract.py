"""The message contract: round trips, header rules, dead letters, bad input, model validation."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from pipeline.contract import (
    BadRequest,
    ErrorClass,
    WireForm,
    dead_letter_headers,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    read_dead_letter,
    result_headers,
    validate_inputs,
    validate_model,
    validate_outputs,
)
from pipeline.contract import headers as h
from pipeline.contract.tensors import MAX_ELEMENTS, serialize_bytes
from tests.helpers.fake_triton import FakeTensor

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
JSON_CT = [(h.CONTENT_TYPE, b"application/json")]
PB_CT = [(h.CONTENT_TYPE, h.PROTOBUF_REQUEST.encode())]


def sample_arrays() -> dict[str, np.ndarray]:
    """One tensor per interesting KServe datatype, various ranks."""
    return {
        "b": np.array([[True, False, True]]),
        "u8": np.arange(6, dtype=np.uint8).reshape(2, 3),
        "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
        "i16": np.array([-32768, 0, 32767], dtype=np.int16),
        "i32": np.arange(-4, 4, dtype=np.int32).reshape(2, 2, 2),
        "i64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        "f16": np.array([[0.5, -1.25], [65504.0, -0.0]], dtype=np.float16),
        "f32": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
        "f64": np.array([np.pi, -np.e, 1e-300]),
        "s": np.array([[b"hello", b""], [b"\x00\xffbinary", "caf\u00e9".encode()]], dtype=object),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


def json_safe(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """BYTES in JSON must be UTF-8 text."""
    out = dict(arrays)
    out["s"] = np.array([[b"hello", b""], [b"nul\x00ok", "caf\u00e9".encode()]], dtype=object)
    return out


def assert_same_tensors(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)  # insertion order kept
    for name, array in want.items():
        assert got[name].shape == array.shape, name
        if array.dtype == object:
            assert got[name].tolist() == array.tolist(), name
        else:
            assert got[name].dtype == array.dtype, name
            np.testing.assert_array_equal(got[name], array)


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("form", "typed"),
    [("protobuf", False), ("protobuf", True), ("json", False)],
    ids=["pb-raw", "pb-typed", "json"],
)
def test_request_round_trip(form: str, typed: bool) -> None:
    arrays = sample_arrays() if form == "protobuf" else json_safe(sample_arrays())
    if typed:
        arrays.pop("f16")  # FP16 has no typed field; it would force raw for all inputs
    record = encode_request(
        arrays,
        correlation_id="req-1",
        form=form,
        model_name="m",
        model_version="3",
        requested_outputs=["y", "z"],
        parameters={"custom": "x", "flag": True, "n": 5, "ratio": 0.5},
        deadline_ms=1_700_000_000_000,
        priority=2,
        timeout_ms=250,
        traceparent=TRACEPARENT,
        typed_contents=typed,
    )
    request = decode_request(record.value, record.headers)
    assert_same_tensors(request.inputs, arrays)
    assert request.correlation_id == "req-1"
    assert (request.model_name, request.model_version) == ("m", "3")
    assert request.requested_outputs == ("y", "z")
    assert request.parameters == {"custom": "x", "flag": True, "n": 5, "ratio": 0.5}
    assert request.form is WireForm(form)
    assert (request.deadline_ms, request.priority, request.timeout_us) == (
        1_700_000_000_000,
        2,
        250_000,
    )
    assert request.traceparent == TRACEPARENT and request.notes == ()
    assert record.key == b"req-1"


def test_typed_contents_really_used() -> None:
    record = encode_request(
        {"x": np.arange(3, dtype=np.int32)}, correlation_id="c", typed_contents=True
    )
    message = pb.ModelInferRequest.FromString(record.value)
    assert not message.raw_input_contents and list(message.inputs[0].contents.int_contents) == [
        0,
        1,
        2,
    ]


@pytest.mark.parametrize("form", ["protobuf", "json"])
def test_response_round_trip_matches_request_form(form: str) -> None:
    record = encode_request({"x": np.ones(2, np.float32)}, correlation_id="c-9", form=form)
    request = decode_request(record.value, record.headers)
    outputs = {
        "probs": np.array([[0.1, 0.9]], dtype=np.float16),
        "label": np.array([b"cat"], dtype=object),
        "idx": np.array([1], dtype=np.int64),
    }
    value, content_type = encode_response(request, outputs, model_name="clf", model_version="2")
    assert content_type == (h.JSON if form == "json" else h.PROTOBUF_RESPONSE)
    response = decode_response(value, [(h.CONTENT_TYPE, content_type.encode())])
    assert response.correlation_id == "c-9"
    assert (response.model_name, response.model_version) == ("clf", "2")
    assert response.datatypes == {"probs": "FP16", "label": "BYTES", "idx": "INT64"}
    assert_same_tensors(response.outputs, outputs)


def test_stateful_request_sequence_fields_and_echo() -> None:
    record = encode_request(
        {"x": np.zeros(1, np.float32)},
        correlation_id="c",
        form="json",
        sequence_id="stream-7",
        sequence_start=True,
    )
    assert record.key == b"stream-7"
    request = decode_request(record.value, record.headers)
    assert (request.sequence_id, request.sequence_start, request.sequence_end) == (
        "stream-7",
        True,
        False,
    )
    assert request.stateful and request.parameters == {}
    value, ct = encode_response(
        request, {"y": np.zeros(1, np.float32)}, model_name="m", model_version="1"
    )
    assert (
        decode_response(value, [(h.CONTENT_TYPE, ct.encode())]).parameters["sequence_id"]
        == "stream-7"
    )


def test_hand_written_json_with_nested_data_and_body_id_only() -> None:
    body = {
        "id": "abc",
        "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2.5], [3, 4]]}],
        "outputs": [{"name": "y"}],
        "parameters": {"sequence_id": 42, "sequence_end": True},
    }
    headers = [(h.CONTENT_TYPE, b"application/json; charset=utf-8")]
    request = decode_request(json.dumps(body).encode(), headers)
    np.testing.assert_array_equal(request.inputs["x"], np.array([[1, 2.5], [3, 4]], np.float32))
    assert request.correlation_id == "abc" and request.model_name == ""
    assert (request.sequence_id, request.sequence_start, request.sequence_end) == (42, False, True)


def test_generic_protobuf_content_type_and_header_only_correlation_id() -> None:
    message = pb.ModelInferRequest()
    message.inputs.add(name="x", datatype="UINT8", shape=[3])
    message.raw_input_contents.append(b"\x01\x02\x03")
    headers = [(h.CONTENT_TYPE, b"application/x-protobuf"), (h.CORRELATION_ID, b"hdr-1")]
    request = decode_request(message.SerializeToString(), headers)
    assert request.correlation_id == "hdr-1" and request.inputs["x"].tolist() == [1, 2, 3]


def test_matching_ids_in_header_and_body_are_fine() -> None:
    record = encode_request({"x": [1.0]}, correlation_id="same")
    assert (
        decode_request(record.value, record.headers + [(h.CORRELATION_ID, b"same")]).correlation_id
        == "same"
    )


@pytest.mark.parametrize(
    "bad", ["00-xyz", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", ""]
)
def test_malformed_traceparent_is_ignored_with_a_note(bad: str) -> None:
    record = encode_request({"x": [1.0]}, correlation_id="c")
    request = decode_request(record.value, record.headers + [(h.TRACEPARENT, bad.encode())])
    assert request.traceparent is None
    assert len(request.notes) == 1 and "traceparent" in request.notes[0]


@pytest.mark.parametrize(
    "values", [[b"\xff\xfe"], [TRACEPARENT.encode(), (TRACEPARENT[:-2] + "00").encode()]]
)
def test_undecodable_or_ambiguous_traceparent_is_ignored_too(values: list[bytes]) -> None:
    record = encode_request({"x": [1.0]}, correlation_id="c")
    request = decode_request(record.value, record.headers + [(h.TRACEPARENT, v) for v in values])
    assert request.traceparent is None
    assert len(request.notes) == 1 and "traceparent" in request.notes[0]


def test_deadline_expiry_is_left_to_stages() -> None:
    record = encode_request({"x": [1.0]}, correlation_id="c", deadline_ms=1000)
    request = decode_request(record.value, record.headers)
    assert request.expired(now_ms=1000) and not request.expired(now_ms=999)


def test_unencodable_output_for_json_request() -> None:
    record = encode_request({"x": [1.0]}, correlation_id="c", form="json")
    request = decode_request(record.value, record.headers)
    with pytest.raises(BadRequest) as info:
        encode_response(
            request, {"y": np.array([b"\xff"], dtype=object)}, model_name="m", model_version="1"
        )
    assert info.value.error_class is ErrorClass.UNENCODABLE_OUTPUT


# --- result and dead-letter headers --------------------------------------------------------------


REQUEST_HEADERS: list[tuple[str, Any]] = [
    ("content-type", b"application/json"),
    ("x-tenant", b"acme"),
    ("traceparent", TRACEPARENT.encode()),
    ("correlation-id", b"c-1"),
    ("x-binary", b"\xff\x00\xfe"),
    ("x-null", None),
    ("x-tenant", b"again"),
]


def test_result_headers_carry_request_headers_through() -> None:
    out = result_headers(
        REQUEST_HEADERS,
        correlation_id="c-1",
        stage="classify",
        model_name="m",
        model_version="4",
        content_type=h.PROTOBUF_RESPONSE,
    )
    carried = [
        pair for pair in REQUEST_HEADERS if pair[0] not in (h.CONTENT_TYPE, h.CORRELATION_ID)
    ]
    assert out[: len(carried)] == carried  # order and bytes kept, repeats and nulls included
    assert out[len(carried) :] == [
        ("content-type", h.PROTOBUF_RESPONSE.encode()),
        ("correlation-id", b"c-1"),
        ("pipeline-stage", b"classify"),
        ("model-name", b"m"),
        ("model-version", b"4"),
    ]


def test_result_headers_add_correlation_id_when_it_came_only_in_the_body() -> None:
    out = result_headers(
        [],
        correlation_id="body-id",
        stage="s",
        model_name="m",
        model_version="1",
        content_type="application/json",
    )
    assert h.get_header(out, h.CORRELATION_ID) == "body-id"


def test_dead_letter_headers_keep_originals_byte_for_byte() -> None:
    out = dead_letter_headers(
        REQUEST_HEADERS,
        stage="decode",
        error_class=ErrorClass.DATA_SIZE_MISMATCH,
        reason="x: 3 raw bytes\nfor shape [4]",
        now_ms=1_700_000_000_123,
    )
    assert out[: len(REQUEST_HEADERS)] == REQUEST_HEADERS
    assert out[len(REQUEST_HEADERS) :] == [
        ("error-stage", b"decode"),
        ("error-class", b"data-size-mismatch"),
        ("error-reason", b"x: 3 raw bytes for shape [4]"),
        ("error-time", b"1700000000123"),
    ]
    letter = read_dead_letter(out)
    assert (
        letter.known_class is ErrorClass.DATA_SIZE_MISMATCH and letter.time_ms == 1_700_000_000_123
    )


def test_dead_lettered_twice_reads_the_latest_failure() -> None:
    first = dead_letter_headers(
        [], stage="a", error_class=ErrorClass.INFERENCE_FAILED, reason="r1", now_ms=1
    )
    second = dead_letter_headers(first, stage="b", error_class="future-code", reason="r2", now_ms=2)
    assert second[:4] == first
    letter = read_dead_letter(second)
    assert (letter.stage, letter.error_class, letter.reason, letter.time_ms) == (
        "b",
        "future-code",
        "r2",
        2,
    )
    assert letter.known_class is None


def test_error_classes_are_stable_kebab_case() -> None:
    for member in ErrorClass:
        assert member.value == member.name.lower().replace("_", "-")
    assert len({m.value for m in ErrorClass}) == len(ErrorClass)


# --- bad input ----------------------------------------------------------------------------


def _json(body: Any, **headers: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    hdrs = JSON_CT + [(k.replace("_", "-"), v.encode()) for k, v in headers.items()]
    return json.dumps(body).encode(), hdrs


def _tensor(
    name: str = "x", shape: Any = (2,), datatype: str = "FP32", data: Any = (1.0, 2.0)
) -> dict[str, Any]:
    return {"name": name, "shape": list(shape), "datatype": datatype, "data": list(data)}


def _ok_json(**headers: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    return _json({"id": "c", "inputs": [_tensor()]}, **headers)


def _pb(build: Any, **headers: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    message = pb.ModelInferRequest(id="c")
    build(message)
    return message.SerializeToString(), PB_CT + [
        (k.replace("_", "-"), v.encode()) for k, v in headers.items()
    ]


def _raw(name: str, datatype: str, shape: list[int], raw: bytes) -> Any:
    def build(m: Any) -> None:
        m.inputs.add(name=name, datatype=datatype, shape=shape)
        m.raw_input_contents.append(raw)

    return build


def _two_raw_inputs_named_x(m: Any) -> None:
    for _ in range(2):
        m.inputs.add(name="x", datatype="UINT8", shape=[1])
        m.raw_input_contents.append(b"\x00")


def _int_contents_for_fp32(m: Any) -> None:
    m.inputs.add(name="x", datatype="FP32", shape=[1]).contents.int_contents.append(1)


def _raw_count_mismatch(m: Any) -> None:
    m.inputs.add(name="x", datatype="UINT8", shape=[1])
    m.inputs.add(name="y", datatype="UINT8", shape=[1])
    m.raw_input_contents.append(b"\x00")


def _shared_memory(m: Any) -> None:
    entry = m.inputs.add(name="x", datatype="UINT8", shape=[1])
    entry.parameters["shared_memory_region"].string_param = "r0"


_, _GOOD_PB_HEADERS = _pb(_raw("x", "UINT8", [1], b"\x01"))
_GOOD_PB = _pb(_raw("x", "UINT8", [1], b"\x01"))[0]

BAD_INPUTS: list[tuple[str, bytes | None, list[tuple[str, Any]], ErrorClass]] = [
    ("empty-value", b"", JSON_CT, ErrorClass.EMPTY_VALUE),
    ("none-value", None, JSON_CT, ErrorClass.EMPTY_VALUE),
    ("garbage-protobuf", b"\xff\xff\xff\xff garbage", PB_CT, ErrorClass.MALFORMED_REQUEST),
    ("invalid-json", b'{"id": "c", "inputs": [', JSON_CT, ErrorClass.MALFORMED_REQUEST),
    ("json-not-object", b"[1, 2, 3]", JSON_CT, ErrorClass.MALFORMED_REQUEST),
    ("json-not-utf8", b'{"id": "\xff"}', JSON_CT, ErrorClass.MALFORMED_REQUEST),
    ("json-too-deep", b"[" * 100_000 + b"]" * 100_000, JSON_CT, ErrorClass.MALFORMED_REQUEST),
    ("json-unknown-key", *_json({"id": "c", "input": [_tensor()]}), ErrorClass.MALFORMED_REQUEST),
    (
        "json-repeated-key",
        b'{"id": "c", "id": "d", "inputs": []}',
        JSON_CT,
        ErrorClass.MALFORMED_REQUEST,
    ),
    (
        "wrong-content-type",
        _ok_json()[0],
        [(h.CONTENT_TYPE, b"text/plain")],
        ErrorClass.UNSUPPORTED_CONTENT_TYPE,
    ),
    (
        "response-content-type",
        _GOOD_PB,
        [(h.CONTENT_TYPE, h.PROTOBUF_RESPONSE.encode())],
        ErrorClass.UNSUPPORTED_CONTENT_TYPE,
    ),
    (
        "missing-content-type",
        _ok_json()[0],
        [(h.CORRELATION_ID, b"c")],
        ErrorClass.MISSING_CONTENT_TYPE,
    ),
    ("missing-correlation-id", *_json({"inputs": [_tensor()]}), ErrorClass.MISSING_CORRELATION_ID),
    ("conflicting-ids", *_ok_json(correlation_id="other"), ErrorClass.CONFLICTING_CORRELATION_ID),
    (
        "repeated-header-differing",
        _ok_json()[0],
        JSON_CT + [(h.CONTENT_TYPE, b"application/x-protobuf")],
        ErrorClass.BAD_HEADER,
    ),
    (
        "header-not-utf8",
        _ok_json()[0],
        JSON_CT + [(h.CORRELATION_ID, b"\xff")],
        ErrorClass.BAD_HEADER,
    ),
    ("bad-deadline", *_ok_json(deadline="tomorrow"), ErrorClass.BAD_HEADER),
    ("negative-priority", *_ok_json(priority="-1"), ErrorClass.BAD_HEADER),
    ("zero-timeout", *_ok_json(timeout_ms="0"), ErrorClass.BAD_HEADER),
    (
        "priority-header-vs-param",
        *_json({"id": "c", "inputs": [_tensor()], "parameters": {"priority": 1}}, priority="2"),
        ErrorClass.BAD_HEADER,
    ),
    ("no-inputs-json", *_json({"id": "c", "inputs": []}), ErrorClass.MISSING_INPUT),
    ("no-inputs-protobuf", *_pb(lambda m: None), ErrorClass.MISSING_INPUT),
    (
        "duplicate-input-json",
        *_json({"id": "c", "inputs": [_tensor(), _tensor()]}),
        ErrorClass.DUPLICATE_INPUT,
    ),
    ("duplicate-input-protobuf", *_pb(_two_raw_inputs_named_x), ErrorClass.DUPLICATE_INPUT),
    ("raw-size-mismatch", *_pb(_raw("x", "FP32", [2], b"\x00" * 7)), ErrorClass.DATA_SIZE_MISMATCH),
    (
        "bytes-raw-truncated",
        *_pb(_raw("x", "BYTES", [2], serialize_bytes([b"ab", b"cd"])[:-1])),
        ErrorClass.DATA_SIZE_MISMATCH,
    ),
    (
        "bytes-raw-trailing",
        *_pb(_raw("x", "BYTES", [1], serialize_bytes([b"ab"]) + b"!")),
        ErrorClass.DATA_SIZE_MISMATCH,
    ),
    ("raw-count-mismatch", *_pb(_raw_count_mismatch), ErrorClass.MALFORMED_REQUEST),
    (
        "json-count-mismatch",
        *_json({"id": "c", "inputs": [_tensor(shape=[3])]}),
        ErrorClass.DATA_SIZE_MISMATCH,
    ),
    (
        "unknown-datatype",
        *_json({"id": "c", "inputs": [_tensor(datatype="FP8")]}),
        ErrorClass.DATATYPE_MISMATCH,
    ),
    (
        "json-string-in-fp32",
        *_json({"id": "c", "inputs": [_tensor(data=["1", 2])]}),
        ErrorClass.DATATYPE_MISMATCH,
    ),
    (
        "json-int8-out-of-range",
        *_json({"id": "c", "inputs": [_tensor(datatype="INT8", data=[1, 300])]}),
        ErrorClass.DATATYPE_MISMATCH,
    ),
    (
        "json-fp32-overflow",
        *_json({"id": "c", "inputs": [_tensor(data=[1e39, 0])]}),
        ErrorClass.DATATYPE_MISMATCH,
    ),
    ("bool-raw-not-0-or-1", *_pb(_raw("x", "BOOL", [1], b"\x02")), ErrorClass.DATATYPE_MISMATCH),
    ("typed-contents-wrong-field", *_pb(_int_contents_for_fp32), ErrorClass.DATATYPE_MISMATCH),
    (
        "negative-dims",
        *_json({"id": "c", "inputs": [_tensor(shape=[-1, 2])]}),
        ErrorClass.SHAPE_MISMATCH,
    ),
    ("negative-dims-protobuf", *_pb(_raw("x", "UINT8", [-2], b"")), ErrorClass.SHAPE_MISMATCH),
    (
        "shape-not-a-list",
        *_json({"id": "c", "inputs": [{**_tensor(), "shape": "2"}]}),
        ErrorClass.SHAPE_MISMATCH,
    ),
    (
        "memory-bomb-shape",
        *_pb(_raw("x", "FP32", [MAX_ELEMENTS, 2], b"")),
        ErrorClass.OVERSIZED_VALUE,
    ),
    (
        "empty-yet-huge-shape",
        *_pb(_raw("x", "BYTES", [0, 2**20, 2**20, 2**20], b"")),
        ErrorClass.OVERSIZED_VALUE,
    ),
    ("shared-memory", *_pb(_shared_memory), ErrorClass.MALFORMED_REQUEST),
    (
        "sequence-start-without-id",
        *_json({"id": "c", "inputs": [_tensor()], "parameters": {"sequence_start": True}}),
        ErrorClass.MALFORMED_REQUEST,
    ),
    (
        "sequence-id-negative",
        *_json({"id": "c", "inputs": [_tensor()], "parameters": {"sequence_id": -3}}),
        ErrorClass.MALFORMED_REQUEST,
    ),
]


@pytest.mark.parametrize(
    ("value", "headers", "expected"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_is_refused_with_its_error_class(
    value: bytes | None, headers: list[tuple[str, Any]], expected: ErrorClass
) -> None:
    with pytest.raises(BadRequest) as info:
        decode_request(value, headers)
    assert info.value.error_class is expected
    assert "\n" not in info.value.reason and info.value.reason


def test_oversized_value_is_refused_before_parsing() -> None:
    value, headers = _ok_json()
    with pytest.raises(BadRequest) as info:
        decode_request(value, headers, max_value_bytes=len(value) - 1)
    assert info.value.error_class is ErrorClass.OVERSIZED_VALUE


def test_the_bad_input_table_covers_enough_distinct_kinds() -> None:
    assert len(BAD_INPUTS) >= 18 and len({c[0] for c in BAD_INPUTS}) == len(BAD_INPUTS)


# --- validation against a model config ---------------------------------------------------------


INPUTS = [
    FakeTensor("audio", "FP32", (-1,)),
    FakeTensor("rate", "TYPE_INT32", (1,)),
    FakeTensor("hint", "TYPE_STRING", (1,), optional=True),
]
OUTPUTS = [FakeTensor("speech", "FP32", (-1,))]


def _request(**arrays: np.ndarray) -> Any:
    record = encode_request(
        arrays,
        correlation_id="c",
        model_name="vad",
        model_version="1",
        requested_outputs=["speech"],
    )
    return decode_request(record.value, record.headers)


def test_valid_batched_request_passes() -> None:
    request = _request(audio=np.zeros((2, 160), np.float32), rate=np.full((2, 1), 16000, np.int32))
    validate_inputs(request, INPUTS, max_batch_size=8)
    validate_outputs(request, OUTPUTS)
    validate_model(request, model_name="vad", model_version="1")


def test_unbatched_model_checks_full_shape() -> None:
    request = _request(audio=np.zeros(160, np.float32), rate=np.array([16000], np.int32))
    validate_inputs(request, INPUTS, max_batch_size=0)


@pytest.mark.parametrize(
    ("arrays", "max_batch", "expected"),
    [
        (
            {
                "audio": np.zeros((1, 4), np.float32),
                "rate": np.ones((1, 1), np.int32),
                "extra": np.ones(1),
            },
            8,
            ErrorClass.UNKNOWN_INPUT,
        ),
        ({"audio": np.zeros((1, 4), np.float32)}, 8, ErrorClass.MISSING_INPUT),
        (
            {"audio": np.zeros((1, 4), np.float64), "rate": np.ones((1, 1), np.int32)},
            8,
            ErrorClass.DATATYPE_MISMATCH,
        ),
        (
            {"audio": np.zeros((1, 4), np.float32), "rate": np.ones((1, 2), np.int32)},
            8,
            ErrorClass.SHAPE_MISMATCH,
        ),
        (
            {"audio": np.zeros((9, 4), np.float32), "rate": np.ones((9, 1), np.int32)},
            8,
            ErrorClass.BATCH_TOO_LARGE,
        ),
        (
            {"audio": np.zeros((0, 4), np.float32), "rate": np.ones((0, 1), np.int32)},
            8,
            ErrorClass.SHAPE_MISMATCH,
        ),
        (
            {"audio": np.zeros((2, 4), np.float32), "rate": np.ones((3, 1), np.int32)},
            8,
            ErrorClass.SHAPE_MISMATCH,
        ),
        (
            {"audio": np.zeros(4, np.float32), "rate": np.ones(1, np.int32)},
            8,
            ErrorClass.SHAPE_MISMATCH,
        ),
        (
            {"audio": np.zeros((1, 4), np.float32), "rate": np.ones((1, 1), np.int32)},
            0,
            ErrorClass.SHAPE_MISMATCH,
        ),
    ],
    ids=[
        "unknown",
        "missing",
        "datatype",
        "item-shape",
        "batch-too-large",
        "batch-zero",
        "batch-disagree",
        "no-batch-dim",
        "unbatched-extra-dim",
    ],
)
def test_validate_inputs_refuses(
    arrays: dict[str, np.ndarray], max_batch: int, expected: ErrorClass
) -> None:
    with pytest.raises(BadRequest) as info:
        validate_inputs(_request(**arrays), INPUTS, max_batch_size=max_batch)
    assert info.value.error_class is expected


def test_validate_outputs_and_model_refuse() -> None:
    record = encode_request(
        {"audio": [[0.0]]},
        correlation_id="c",
        model_name="asr",
        model_version="7",
        requested_outputs=["nope"],
    )
    request = decode_request(record.value, record.headers)
    cases = [
        (lambda: validate_outputs(request, OUTPUTS), ErrorClass.UNKNOWN_OUTPUT),
        (
            lambda: validate_model(request, model_name="vad", model_version="7"),
            ErrorClass.UNKNOWN_MODEL,
        ),
        (
            lambda: validate_model(request, model_name="asr", model_version="1"),
            ErrorClass.MODEL_VERSION_MISMATCH,
        ),
    ]
    for check, expected in cases:
        with pytest.raises(BadRequest) as info:
            check()
        assert info.value.error_class is expected


def test_protobuf_encoding_is_byte_identical_across_processes() -> None:
    """Re-delivered results must be exact duplicates: protobuf map order is per-process
    unless serialisation is deterministic, so encode the same response in fresh processes."""
    import subprocess
    import sys

    script = (
        "import numpy as np, sys\n"
        "from pipeline.contract.request import decode_request, encode_request\n"
        "from pipeline.contract.response import encode_response\n"
        "r = encode_request({'x': np.arange(4, dtype=np.float32)}, correlation_id='c', sequence_id='s',"
        " sequence_start=True, parameters={'chunk_index': 3, 'a': 'b', 'zz': 1})\n"
        "req = decode_request(r.value, r.headers)\n"
        "value, _ = encode_response(req, {'y': np.ones(2, np.float32)}, model_name='m', model_version='1',"
        " parameters={'chunk_index': 3, 'reason': 'end', 'segment_index': 0})\n"
        "sys.stdout.write(value.hex())\n"
    )
    outputs = {
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
        for _ in range(4)
    }
    assert len(outputs) == 1


def test_shared_fields_are_every_field_of_a_model_body() -> None:
    """``ModelBody.shared_fields`` spells its fields out (it runs per request): it must name
    each dataclass field of ModelBody, so a field added there is not silently dropped."""
    import dataclasses

    from pipeline.contract.payload import ModelBody

    body = ModelBody(model_name="m", model_version="2", datatypes={"x": "FP32"})
    assert body.shared_fields() == {f.name: getattr(body, f.name) for f in dataclasses.fields(ModelBody)}


def test_a_layout_decoded_again_from_the_cache_gives_the_same_request_and_the_same_errors() -> None:
    """Decoding caches what depends only on a tensor's layout and the content type: the second
    decode of a record equals the first, and a refused layout is refused again, the same way."""
    good = encode_request({"x": np.arange(6, dtype=np.float32).reshape(2, 3)}, correlation_id="c-1")
    first, again = decode_request(good.value, good.headers), decode_request(good.value, good.headers)
    assert np.array_equal(first.inputs["x"], again.inputs["x"]) and first.datatypes == again.datatypes
    message = pb.ModelInferRequest.FromString(good.value)
    message.inputs[0].datatype = "FP33"
    bad = message.SerializeToString()
    refusals = []
    for _ in range(2):
        with pytest.raises(BadRequest) as caught:
            decode_request(bad, good.headers)
        refusals.append((caught.value.error_class, caught.value.reason))
    assert refusals[0] == refusals[1] and refusals[0][0] is ErrorClass.DATATYPE_MISMATCH
