"""A request that repeats a learnt layout decodes exactly as the full decoder decodes it.

:mod:`pipeline.contract.request_layouts` decodes a record by comparing its bytes with a record
the full decoder accepted. These tests hold it to the full decoder: the same request, or the
same error, for repeated records, for every single-byte change of one, and for records made
from random tensors and parameters; and they check that the fast path is really taken.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.contract import BadRequest, decode_request, encode_request
from pipeline.contract import headers as h
from pipeline.contract import request as request_module
from pipeline.contract.records import Record
from pipeline.contract.request_layouts import MAX_LAYOUTS, Layouts

MEDIA = h.PROTOBUF_REQUEST


@pytest.fixture
def layouts(monkeypatch: pytest.MonkeyPatch) -> Layouts:
    """A fresh layout table for the decoder (the process's own is shared by every test)."""
    fresh = Layouts()
    monkeypatch.setattr(request_module, "_LAYOUTS", fresh)
    return fresh


@contextlib.contextmanager
def full_decoder() -> Iterator[None]:
    """The decoder with no layout to match and none learnt: every record decoded in full."""
    kept = request_module._LAYOUTS
    request_module._LAYOUTS = Layouts(capacity=0)
    try:
        yield
    finally:
        request_module._LAYOUTS = kept


def outcome(value: bytes | None, headers: Any) -> tuple[Any, ...]:
    """What decoding gives: the error, or every field of the request (tensors as bytes)."""
    try:
        request = decode_request(value, headers)
    except BadRequest as bad:
        return ("dead letter", bad.error_class, bad.reason)
    fields = dict(vars(request))
    fields["inputs"] = [(name, a.dtype.str, a.shape, a.tobytes()) for name, a in request.inputs.items()]
    return ("request", sorted(fields.items(), key=lambda item: item[0]))


def both_ways(value: bytes | None, headers: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    fast = outcome(value, headers)
    with full_decoder():
        full = outcome(value, headers)
    return fast, full


def features(i: int, **kwargs: Any) -> Record:
    return encode_request({"features": np.full((1, 8), float(i), dtype=np.float32)}, correlation_id=f"c{i}", **kwargs)


def test_a_repeated_layout_is_matched_and_decodes_as_the_full_decoder(layouts: Layouts) -> None:
    records = [features(i, model_name="dense", requested_outputs=["scores"]) for i in range(60)]
    decode_request(records[0].value, list(records[0].headers))
    assert len(layouts) == 1
    for record in records[1:]:
        assert layouts.match(record.value, MEDIA) is not None, "the fast path is taken"
        fast, full = both_ways(record.value, list(record.headers))
        assert fast == full
        assert fast[0] == "request"


def test_every_single_byte_change_decodes_as_the_full_decoder(layouts: Layouts) -> None:
    first, second = features(1, model_name="dense"), features(2, model_name="dense")
    headers = list(second.headers)
    decode_request(first.value, list(first.headers))
    value = second.value
    assert value is not None
    changed = 0
    for position in range(len(value)):
        for replacement in {0x00, 0x01, 0x7F, 0x80, 0xFF, value[position] ^ 0x01}:
            mutated = value[:position] + bytes([replacement]) + value[position + 1 :]
            fast, full = both_ways(mutated, headers)
            assert fast == full, (position, replacement)
            changed += 1
    for cut in range(len(value)):
        assert both_ways(value[:cut] or None, headers)[0] == both_ways(value[:cut] or None, headers)[1], cut
    for extra in (b"\x00", b"\x1a\x01x", b"\x3a\x00", b"\x0a\x01m"):
        fast, full = both_ways(value + extra, headers)
        assert fast == full, extra
    assert changed > 5 * len(value)


@pytest.mark.parametrize(
    "body_id, header_id",
    [
        ("bad\nid", None),  # not printable
        ("x" * 120, None),  # one length byte, still printable: accepted both ways
        ("c2", "c3"),  # the header disagrees
        ("c2", ""),  # an empty header is no header
        ("c2", "c2"),
        ("é" * 10, None),
    ],
)
def test_ids_decode_as_the_full_decoder_decodes_them(layouts: Layouts, body_id: str, header_id: str | None) -> None:
    first = features(1)
    decode_request(first.value, list(first.headers))
    record = encode_request({"features": np.zeros((1, 8), dtype=np.float32)}, correlation_id=body_id)
    headers = [(h.CONTENT_TYPE, MEDIA.encode()), (h.CORRELATION_ID, (header_id or "").encode())]
    if header_id is None:
        headers = headers[:1]
    fast, full = both_ways(record.value, headers)
    assert fast == full


def test_an_id_that_is_not_utf8_is_refused_as_protobuf_refuses_it(layouts: Layouts) -> None:
    first, second = features(1), features(2)
    decode_request(first.value, list(first.headers))
    value = second.value
    assert value is not None and b"c2" in value
    broken = value.replace(b"c2", b"\xc3\x28", 1)
    fast, full = both_ways(broken, [(h.CONTENT_TYPE, MEDIA.encode())])
    assert fast == full and fast[0] == "dead letter"


@pytest.mark.parametrize(
    "inputs, extra",
    [
        ({"text": np.array([[b"a", b"b"]], dtype=object)}, {}),  # BYTES: the contents need reading
        ({"mask": np.array([[True, False]])}, {}),  # BOOL: each byte must be 0 or 1
        ({"features": np.zeros((1, 4), dtype=np.float32)}, {"typed_contents": True}),  # no raw contents
        ({"features": np.zeros((1, 4), dtype=np.float32)}, {"form": "json"}),
        ({"features": np.zeros((1, 4), dtype=np.float32)}, {"priority": 3}),  # a header beyond the two
    ],
)
def test_layouts_are_learnt_only_where_bytes_say_everything(layouts: Layouts, inputs: Any, extra: Any) -> None:
    record = encode_request(inputs, correlation_id="c1", **extra)
    decode_request(record.value, list(record.headers))
    assert len(layouts) == 0


def test_the_table_keeps_the_most_recently_used_layouts(layouts: Layouts) -> None:
    for width in range(MAX_LAYOUTS + 5):
        record = encode_request({"x": np.zeros((1, width + 1), dtype=np.int32)}, correlation_id="a")
        decode_request(record.value, list(record.headers))
    assert len(layouts) == MAX_LAYOUTS
    newest = encode_request({"x": np.ones((1, MAX_LAYOUTS + 5), dtype=np.int32)}, correlation_id="b")
    assert layouts.match(newest.value, MEDIA) is not None
    oldest = encode_request({"x": np.ones((1, 1), dtype=np.int32)}, correlation_id="b")
    assert layouts.match(oldest.value, MEDIA) is None


DTYPES = st.sampled_from(["float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint64"])
PARAMETERS = st.dictionaries(
    st.sampled_from(["alpha", "mode", "sequence_id", "sequence_start", "sequence_end", "priority", "timeout"]),
    st.one_of(st.integers(-3, 2**64), st.booleans(), st.text(max_size=4), st.floats(allow_nan=False)),
    max_size=3,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    shapes=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5)), min_size=1, max_size=3),
    dtype=DTYPES,
    parameters=PARAMETERS,
    model=st.sampled_from(["", "m", "dense_classifier"]),
    outputs=st.lists(st.sampled_from(["a", "b"]), max_size=2, unique=True),
    ids=st.tuples(st.text(min_size=1, max_size=130), st.text(min_size=1, max_size=130)),
)
def test_random_requests_decode_alike_both_ways(
    layouts: Layouts, shapes: Any, dtype: str, parameters: Any, model: str, outputs: list[str], ids: tuple[str, str]
) -> None:
    request_module._LAYOUTS = layouts = Layouts()  # each example starts empty
    rng = np.random.default_rng(len(ids[0]))

    def record(correlation_id: str) -> Record | None:
        arrays = {f"t{i}": rng.integers(0, 100, size=shape).astype(dtype) for i, shape in enumerate(shapes)}
        try:
            return encode_request(
                arrays,
                correlation_id=correlation_id,
                model_name=model,
                requested_outputs=outputs,
                parameters=parameters,
            )
        except (ValueError, TypeError, OverflowError, BadRequest):  # a parameter the encoder cannot write
            return None

    first, second = record(ids[0]), record(ids[1])
    if first is None or second is None:
        return
    with contextlib.suppress(BadRequest):  # a first record the decoder refuses teaches nothing
        decode_request(first.value, list(first.headers))
    learnt = len(layouts) == 1
    matched = layouts.match(second.value or b"", MEDIA) is not None
    fast, full = both_ways(second.value, list(second.headers))
    assert fast == full
    if learnt and full[0] == "request" and len(ids[1].encode()) < 0x80:
        assert matched, "a valid record of a learnt layout takes the fast path"


def test_learning_backs_off_when_no_record_repeats_a_layout(layouts: Layouts) -> None:
    """A sequence's chunks differ in a parameter each time: after LEARN_UNMATCHED layouts that no
    record matched, only one full decode in LEARN_BACKED_OFF_EVERY is learnt from; a match resumes."""
    from pipeline.contract.request_layouts import LEARN_BACKED_OFF_EVERY, LEARN_UNMATCHED, MATCH_BACKED_OFF_EVERY

    def chunk(index: int) -> Record:
        return features(index, parameters={"chunk_index": index})

    for index in range(LEARN_UNMATCHED + 200):
        record = chunk(index)
        decode_request(record.value, list(record.headers))
    assert layouts._unmatched == LEARN_UNMATCHED, "no more layouts learnt once backed off"
    index = LEARN_UNMATCHED + 200
    while layouts._unmatched == LEARN_UNMATCHED:
        index += 1
        record = chunk(index)
        decode_request(record.value, list(record.headers))
    assert index - LEARN_UNMATCHED == LEARN_BACKED_OFF_EVERY, (
        "one full decode in LEARN_BACKED_OFF_EVERY is still learnt from"
    )
    again = features(777, parameters={"chunk_index": index})  # repeats the layout just learnt
    # Matching backed off too (MATCH_UNMATCHED misses in a row): compared once in
    # MATCH_BACKED_OFF_EVERY records, and a hit ends the back-off.
    found = [layouts.match(again.value, MEDIA) is not None for _ in range(MATCH_BACKED_OFF_EVERY + 3)]
    first_hit = found.index(True)
    assert first_hit < MATCH_BACKED_OFF_EVERY and all(found[first_hit:]), found
    decode_request(again.value, list(again.headers))
    assert layouts._unmatched == 0 and layouts.wants() is True


def test_matching_backs_off_when_no_record_repeats_a_layout(layouts: Layouts) -> None:
    """After MATCH_UNMATCHED records in a row that matched nothing, only one in
    MATCH_BACKED_OFF_EVERY is compared with the layouts; the decoded requests are the same."""
    from pipeline.contract import request_layouts
    from pipeline.contract.request_layouts import MATCH_BACKED_OFF_EVERY, MATCH_UNMATCHED

    compared: set[bytes] = set()
    real = request_layouts._matches

    def counting(layout: Any, value: bytes, media: str) -> Any:
        compared.add(value)
        return real(layout, value, media)

    rounds = 10
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(request_layouts, "_matches", counting)
        for index in range(MATCH_UNMATCHED + 1 + rounds * MATCH_BACKED_OFF_EVERY):
            record = features(index, parameters={"chunk_index": index})
            request = decode_request(record.value, list(record.headers))
            assert request.parameters["chunk_index"] == index
    # The first record finds no layout yet (a miss all the same), the next MATCH_UNMATCHED - 1
    # are compared, then one in MATCH_BACKED_OFF_EVERY.
    assert len(compared) == MATCH_UNMATCHED - 1 + rounds, len(compared)
