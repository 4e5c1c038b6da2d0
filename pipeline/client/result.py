"""What a call returns: a typed result decoded from the reply record."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.contract.payload import ParamValue
from pipeline.tools.decoding import Consumed


@dataclass(frozen=True, eq=False)
class InferResult:
    """One result record: output tensors as numpy arrays, who produced them, and where it was.

    ``result_type`` is a sequence stage's ``chunk``/``segment``/``summary``/``gap`` (None for
    stateless results); ``parameters`` are the response's OIP parameters (``chunk_index``...).
    """

    correlation_id: str
    outputs: dict[str, np.ndarray]
    model_name: str
    model_version: str
    headers: dict[str, str]
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    key: bytes | None = None
    topic: str = ""
    partition: int = -1
    offset: int = -1
    result_type: str | None = None

    @property
    def chunk_index(self) -> int | None:
        value = self.parameters.get("chunk_index")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @classmethod
    def of(cls, record: Consumed) -> InferResult:
        return cls(
            correlation_id=record.correlation_id or "",
            outputs=dict(record.tensors),
            model_name=record.model_name,
            model_version=record.model_version,
            headers=text_headers(record.headers),
            parameters=dict(record.parameters),
            key=record.key,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            result_type=record.result_type,
        )


def text_headers(headers: list[tuple[str, bytes]]) -> dict[str, str]:
    """Headers as text, the last value of a repeated name winning (as ``read_dead_letter`` reads)."""
    return {name: value.decode("utf-8", errors="replace") for name, value in headers}
