"""Result records of a sequence stage: a chunk's outputs, segments, summaries.

Every result answers one chunk (its :class:`Origin`): same key, the chunk's
request identity and headers, plus ``pipeline-stage``, ``model-name``,
``model-version`` and a ``result-type`` header (``chunk``, ``segment``,
``summary``) so a consumer can tell them apart without decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.contract.records import result_headers
from pipeline.contract.request import InferenceRequest
from pipeline.contract.response import encode_response
from pipeline.kafka.outbox import OutRecord
from workers.runtime.stage_io import StageIO
from workers.sequence.chunks import Chunk
from workers.sequence.postprocess import Emission

RESULT_TYPE = "result-type"


@dataclass(frozen=True)
class Origin:
    """What a result answers: the record key, the decoded request (for its wire form), headers."""

    key: bytes
    request: InferenceRequest
    headers: list[tuple[str, bytes]]
    timestamp: int
    partition: int | None = None

    @classmethod
    def of(cls, chunk: Chunk) -> Origin:
        r = chunk.record
        return cls(r.key or b"", chunk.request, list(r.headers or ()), r.timestamp, r.partition)


class ResultWriter:
    """Encodes results for one stage and model as output records."""

    def __init__(self, io: StageIO, *, model_name: str, model_version: str = "") -> None:
        self.io = io
        self.model_name = model_name
        self.model_version = model_version

    def result(
        self, origin: Origin, tensors: dict[str, np.ndarray], params: dict[str, object], kind: str
    ) -> OutRecord:
        value, content_type = encode_response(
            origin.request,
            tensors,
            model_name=self.model_name,
            model_version=self.model_version,
            parameters=params,  # type: ignore[arg-type]
        )
        headers = result_headers(
            origin.headers,
            correlation_id=origin.request.correlation_id,
            stage=self.io.stage,
            model_name=self.model_name,
            model_version=self.model_version,
            content_type=content_type,
        ) + [(RESULT_TYPE, kind.encode())]
        return OutRecord(
            topic=self.io.output_topic,
            key=origin.key,
            value=value,
            headers=headers,
            request_timestamp_ms=origin.timestamp or None,
            timestamp_ms=origin.timestamp if self.io.emit_requests else None,
            partition=origin.partition if self.io.emit_requests else None,  # a next stage's: one writer each
        )

    def emission(self, origin: Origin, emission: Emission) -> OutRecord:
        return self.result(origin, emission.tensors, emission.parameters, emission.kind)


def gap_emission(start: int, stop: int) -> Emission:
    """The ``gap`` result: chunks ``start`` to ``stop - 1`` the stream went on without
    (``missing_chunks`` = [start, stop): a range, since a gap may be huge)."""
    tensors = {"missing_chunks": np.array([start, stop], dtype=np.int64)}
    return Emission("gap", tensors, {"chunk_index": start, "missing": stop - start})
