"""Dead-letter records: the original key, value and headers, byte for byte, plus why.

Every path that gives a record up builds its dead letter here (a bad request, a
failed call, a join window that closed, a state record that did not decode), so
they all carry the same ``error-*`` headers (docs/message-contract.md). A dead
letter of a consumed record also says where it was read (``source-topic``,
``-partition``, ``-offset``): ``pipeline replay`` sends it back there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pipeline.contract.errors import ErrorClass, one_line
from pipeline.contract.records import dead_letter_headers, read_source, source_position_headers
from pipeline.kafka.outbox import OutRecord
from pipeline.kafka.records import ConsumedRecord
from pipeline.state import RestoreReport


def dead_letter_record(
    *,
    stage: str,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    error_class: ErrorClass | str,
    reason: str,
    request_timestamp_ms: int | None = None,
    source: tuple[str, int, int] | None = None,
) -> OutRecord:
    """``source``: the consumed record's topic, partition and offset, appended as
    ``source-*`` headers before the ``error-*`` ones (unless the headers already end
    with that very position: a record salvaged by position carries it)."""
    error = ErrorClass(error_class)
    kept = list(headers)
    if source is not None:
        known = read_source(kept)
        if known is None or (known.topic, known.partition, known.offset) != source:
            kept += source_position_headers(*source)
    return OutRecord(
        topic=topic,
        key=key,
        value=value,
        headers=dead_letter_headers(
            kept, stage=stage, error_class=error, reason=one_line(reason), now_ms=int(time.time() * 1000)
        ),
        dead_letter=True,
        error_class=error.value,
        request_timestamp_ms=request_timestamp_ms,
    )


def dead_letter_of(
    record: ConsumedRecord, *, stage: str, topic: str, error_class: ErrorClass | str, reason: str
) -> OutRecord:
    """A consumed record, byte for byte, as a dead letter (keeping the request's timestamp)."""
    return dead_letter_record(
        stage=stage, topic=topic, key=record.key, value=record.value, headers=record.headers or (),
        error_class=error_class, reason=reason, request_timestamp_ms=record.timestamp,
        source=(record.topic, record.partition, record.offset),
    )


def corrupt_state_records(stage: str, topic: str, report: RestoreReport) -> list[OutRecord]:
    """One dead letter per state record that did not decode on restore (key and value as stored)."""
    return [
        dead_letter_record(
            stage=stage,
            topic=topic,
            key=key,
            value=value,
            headers=[],
            error_class=ErrorClass.CORRUPT_STATE,
            reason=f"state record in partition {partition}: {reason}; the key starts fresh",
        )
        for key, value, partition, reason in report.corrupt
    ]
