"""A batch's results encoded in one pass are, byte for byte, what encode_response writes
for each request (pipeline/contract/response_batch.py); anything but the common case is
left to encode_response (None)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pipeline.contract import headers as h
from pipeline.contract.request import InferenceRequest
from pipeline.contract.response import decode_response, encode_response
from pipeline.contract.response_batch import CONTENT_TYPE, encode_batched_responses, encode_responses


def request(correlation_id: str, **fields: object) -> InferenceRequest:
    return InferenceRequest(
        model_name="m",
        model_version="",
        datatypes={"x": "FP32"},
        correlation_id=correlation_id,
        inputs={"x": np.zeros((1, 2), np.float32)},
        **fields,  # type: ignore[arg-type]
    )


def one_by_one(requests: list[InferenceRequest], outputs: list[dict[str, np.ndarray]], version: str) -> list[bytes]:
    values = []
    for r, out in zip(requests, outputs, strict=True):
        value, content_type = encode_response(r, out, model_name="dense", model_version=version, parameters=r.parameters)
        assert content_type == CONTENT_TYPE
        values.append(value)
    return values


DTYPES = st.sampled_from([np.float32, np.float64, np.float16, np.int8, np.int32, np.int64, np.uint8, np.uint64, np.bool_])


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 70),
    shapes=st.lists(st.tuples(DTYPES, st.lists(st.integers(0, 5), min_size=0, max_size=3)), min_size=1, max_size=3),
    ids=st.lists(st.text(max_size=300), min_size=70, max_size=70),
    version=st.sampled_from(["", "1", "17"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_batch_encoding_equals_encoding_each_request(
    rows: int, shapes: list[tuple[type, list[int]]], ids: list[str], version: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    requests = [request(ids[i]) for i in range(rows)]
    outputs = [
        {f"out{k}": (rng.standard_normal((1, *shape)) * 100).astype(dtype) for k, (dtype, shape) in enumerate(shapes)}
        for _ in range(rows)
    ]
    assert encode_responses(requests, outputs, model_name="dense", model_version=version) == one_by_one(
        requests, outputs, version
    )


@given(ids=st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=5), array=hnp.arrays(np.float32, (1, 4)))
def test_each_value_decodes_to_its_own_id_and_contents(ids: list[str], array: np.ndarray) -> None:
    outputs = [{"logits": array + i} for i in range(len(ids))]
    values = encode_responses([request(i) for i in ids], outputs, model_name="dense", model_version="1")
    assert values is not None
    for correlation_id, value, out in zip(ids, values, outputs, strict=True):
        decoded = decode_response(value, [("content-type", CONTENT_TYPE.encode())])
        assert decoded.correlation_id == correlation_id
        assert (decoded.model_name, decoded.model_version) == ("dense", "1")
        np.testing.assert_array_equal(decoded.outputs["logits"], out["logits"])


def test_what_is_not_the_common_case_is_left_to_encode_response() -> None:
    out = {"logits": np.ones((1, 4), np.float32)}
    kw = {"model_name": "dense", "model_version": ""}
    assert encode_responses([], [], **kw) is None
    assert encode_responses([request("a", content_type=h.JSON)], [out], **kw) is None
    assert encode_responses([request("a", parameters={"p": 1})], [out], **kw) is None
    assert encode_responses([request("a", sequence_id=7)], [out], **kw) is None
    assert encode_responses([request("a")], [{"text": np.array([[b"x"]], dtype=object)}], **kw) is None
    assert encode_responses([request("a")], [{"c": np.ones((1, 2), np.complex64)}], **kw) is None
    two = [request("a"), request("b")]
    assert encode_responses(two, [out, {"logits": np.ones((1, 5), np.float32)}], **kw) is None  # shapes differ
    assert encode_responses(two, [out, {"logits": np.ones((1, 4), np.int32)}], **kw) is None  # datatypes differ
    assert encode_responses(two, [out, {"other": np.ones((1, 4), np.float32)}], **kw) is None  # names differ
    assert encode_responses(two, [out, dict(out)], **kw) is not None


@settings(max_examples=60, deadline=None)
@given(
    requests_n=st.integers(1, 40),
    each=st.integers(1, 3),
    shapes=st.lists(st.tuples(DTYPES, st.lists(st.integers(0, 5), min_size=0, max_size=3)), min_size=1, max_size=3),
    ids=st.lists(st.text(max_size=300), min_size=40, max_size=40),
    version=st.sampled_from(["", "1", "17"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_encoding_from_the_whole_batch_equals_encoding_each_request(
    requests_n: int, each: int, shapes: list[tuple[type, list[int]]], ids: list[str], version: str, seed: int
) -> None:
    """The batch's arrays, never split: the same bytes as each request's own slice encoded alone."""
    rng = np.random.default_rng(seed)
    requests = [request(ids[i]) for i in range(requests_n)]
    rows = [each] * requests_n
    arrays = {
        f"out{k}": (rng.standard_normal((each * requests_n, *shape)) * 100).astype(dtype)
        for k, (dtype, shape) in enumerate(shapes)
    }
    split = [{name: a[i * each : (i + 1) * each] for name, a in arrays.items()} for i in range(requests_n)]
    expected = one_by_one(requests, split, version)
    assert encode_batched_responses(requests, arrays, rows, model_name="dense", model_version=version) == expected


def test_a_batch_whose_requests_differ_in_rows_or_byte_order_is_left_to_the_per_request_path() -> None:
    kw = {"model_name": "dense", "model_version": ""}
    two = [request("a"), request("b")]
    logits = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert encode_batched_responses(two, {"logits": logits}, [1, 2], **kw) is None  # rows differ
    assert encode_batched_responses(two, {"logits": logits[:2].astype(">f4")}, [1, 1], **kw) is None
    assert encode_batched_responses([request("a", content_type=h.JSON)], {"logits": logits[:1]}, [1], **kw) is None
    assert encode_batched_responses(two, {"logits": logits}, [1, 1], **kw) is None  # rows do not add up
    assert encode_batched_responses(two, {"logits": logits[:2]}, [1, 1], **kw) is not None
