"""The shape of a consumed Kafka record, as this project reads it.

aiokafka's ``ConsumerRecord[bytes, bytes]`` carries these attributes, but
aiokafka ships no type information; stating the shape once here lets the stages
and the client tools be type-checked against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class ConsumedRecord(Protocol):
    """A record fetched from Kafka: where it came from, and its key, value and headers
    (read-only, so frozen stand-ins, such as a record salvaged by position, fit too)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...
