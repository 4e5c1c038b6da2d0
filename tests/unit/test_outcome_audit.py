"""The fault campaigns' outcome audit (tests/helpers/outcome_audit.py) finds a record a stage
consumed without an outcome, and only that: outputs by key and chunk index, dead letters by
position, a sequence stage's ``gap`` result never counting as one."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from pipeline.contract.request import encode_request
from tests.helpers.outcome_audit import Hop, account

STAGES = [Hop("preprocess", ("chunks",), "features"), Hop("vad", ("features",), "results")]


def rec(topic: str, offset: int, key: bytes, *, chunk: int | None = None, headers: list[tuple[str, bytes]] | None = None) -> ConsumerRecord:  # type: ignore[type-arg]
    params = {} if chunk is None else {"chunk_index": chunk}
    request = encode_request({"x": [1.0]}, correlation_id=key.decode(), parameters=params)
    return ConsumerRecord(topic, 0, offset, 0, 0, key, request.value, None, 0, 0, [*request.headers, *(headers or [])])


def dead(topic: str, offset: int) -> ConsumerRecord:  # type: ignore[type-arg]
    position = [("source-topic", topic.encode()), ("source-partition", b"0"), ("source-offset", str(offset).encode())]
    return ConsumerRecord("dlq", 0, 0, 0, 0, b"s", b"{}", None, 0, 0, position)


def test_every_chunk_accounted_for_by_an_output_or_a_dead_letter() -> None:
    records = [
        rec("chunks", 0, b"s", chunk=0), rec("chunks", 1, b"s", chunk=1), rec("chunks", 2, b"s", chunk=2),
        rec("features", 0, b"s", chunk=0), rec("features", 1, b"s", chunk=2),
        dead("chunks", 1),
        rec("results", 0, b"s", chunk=0), rec("results", 1, b"s", chunk=2),
    ]
    audit = account(STAGES, records, "dlq", "other-results")
    assert audit.problems() == []
    assert audit.consumed == {"preprocess": 3, "vad": 2}


def test_a_chunk_lost_between_stages_is_named_by_its_position_and_a_gap_result_does_not_hide_it() -> None:
    records = [
        rec("chunks", 0, b"s", chunk=0), rec("chunks", 1, b"s", chunk=1), rec("chunks", 2, b"s", chunk=2),
        rec("features", 0, b"s", chunk=0), rec("features", 1, b"s", chunk=2),
        rec("results", 0, b"s", chunk=0), rec("results", 1, b"s", chunk=1, headers=[("result-type", b"gap")]),
        rec("results", 2, b"s", chunk=2),
    ]
    audit = account(STAGES, records, "dlq", "other-results")
    assert audit.unaccounted == {"preprocess": ["chunks[0]@1"], "vad": []}
    assert audit.problems() == ["stage preprocess: 1 of 3 input records have no outcome, e.g. ['chunks[0]@1']"]
