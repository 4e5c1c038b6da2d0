"""``OutRecord.plain``, the stateless stage's cheap way to build a result record, builds the
same record as the dataclass's own ``__init__`` (pipeline/kafka/out_record.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.kafka.outbox import OutRecord

_BYTES = st.none() | st.binary(max_size=16)


@settings(max_examples=200, deadline=None)
@given(
    st.text(min_size=1, max_size=20),
    _BYTES,
    _BYTES,
    st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=4),
    st.none() | st.integers(0, 2**41),
    st.none() | st.integers(0, 2**41),
)
def test_plain_equals_the_dataclass_built_the_usual_way(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes]],
    request_ts: int | None,
    ts: int | None,
) -> None:
    fast = OutRecord.plain(topic, key, value, headers, request_timestamp_ms=request_ts, timestamp_ms=ts)
    usual = OutRecord(topic, key, value, headers, request_timestamp_ms=request_ts, timestamp_ms=ts)
    assert fast == usual
    assert vars(fast) == vars(usual)  # every field set, none extra
    assert dataclasses.replace(fast, dead_letter=True) == dataclasses.replace(usual, dead_letter=True)


def test_plain_is_as_frozen() -> None:
    record = OutRecord.plain("t", b"k", b"v", [], request_timestamp_ms=None, timestamp_ms=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.topic = "other"  # type: ignore[misc]
