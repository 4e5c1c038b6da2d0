"""The shape of a consumed Kafka record, as this project reads it.

aiokafka's ``ConsumerRecord[bytes, bytes]`` carries these attributes, but
aiokafka ships no type information; stating the shape once here lets the stages
and the client tools be type-checked against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class ConsumedRecord(Protocol):
    """A record fetched from Kafka: where it came from, and its key, value and headers."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]
