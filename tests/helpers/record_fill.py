"""Records sized to the byte against a topic's ``max.message.bytes``.

Apache Kafka refuses a record over its topic's ``max.message.bytes`` at the producer (Tansu
stores the setting without enforcing it), so a test of a result too large for any topic
sends a request just under the limit whose result, a few dozen bytes larger (the model's
name and version, the result's own headers), is over it."""

from __future__ import annotations

from pipeline.contract import headers as h
from pipeline.deadletter.oversize import record_size

RESULT_GROWTH_MARGIN = 25
"""Bytes a filled request stays under the limit: room for a header the test adds at send
time (a sequence number), less than the ~40 bytes a dense_classifier protobuf result adds."""


def filled(key: bytes | None, value: bytes | None, headers: h.Headers, name: str, limit: int) -> h.Headers:
    """``headers`` plus header ``name``, its value as long as keeps the record
    ``RESULT_GROWTH_MARGIN`` bytes under ``limit`` by the producer's own estimate."""
    target = limit - RESULT_GROWTH_MARGIN

    def with_fill(n: int) -> h.Headers:
        return [*headers, (name, b"f" * n)]

    n = target - record_size(key, value, headers)
    while record_size(key, value, with_fill(n)) > target:
        n -= 1
    return with_fill(n)
