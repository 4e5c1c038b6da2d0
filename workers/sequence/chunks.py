"""A stream's chunks: parsing one from a record, and where it goes in the stream's order.

Per stream, chunks are applied strictly in ``chunk_index`` order: a chunk that
arrives early waits (up to ``reorder_window`` chunks ahead); an exact duplicate
of an applied chunk is dropped (counted); a conflicting duplicate, a chunk too
far ahead, one that repeats a waiting index, or one after the stream ended is
dead-lettered. :func:`placement` decides; it is pure, so it is unit-tested alone.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import numpy as np

from pipeline.contract import headers as h
from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.request import InferenceRequest, decode_request
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs
from pipeline.kafka.records import ConsumedRecord
from workers.sequence.state import StreamState

CHUNK_INDEX = "chunk_index"


@dataclass(eq=False)
class Chunk:
    record: ConsumedRecord
    slot: Slot[Outputs]
    request: InferenceRequest
    index: int
    samples: np.ndarray
    arrived: float = field(default_factory=time.monotonic)

    @property
    def payload(self) -> bytes:
        return self.record.value or b""


def parse_chunk(record: ConsumedRecord, slot: Slot[Outputs], input_tensor: str) -> Chunk:
    """Decode a chunk record; :class:`BadRequest` for anything that is not a usable chunk."""
    if not record.key:
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, "a stream chunk needs the stream key as the record key")
    headers = list(record.headers or ())
    request = decode_request(record.value, headers)
    raw_index = request.parameters.get(CHUNK_INDEX, h.get_header(headers, "chunk-index"))
    try:
        index = int(raw_index)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"missing or invalid {CHUNK_INDEX!r} parameter") from None
    if index < 0 or isinstance(raw_index, bool):
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"{CHUNK_INDEX} must be a non-negative integer")
    tensor = request.inputs.get(input_tensor)
    if tensor is None:
        raise BadRequest(ErrorClass.MISSING_INPUT, f"chunk has no {input_tensor!r} tensor")
    if request.datatypes[input_tensor] not in ("FP32", "FP16", "FP64"):
        raise BadRequest(ErrorClass.DATATYPE_MISMATCH, f"{input_tensor!r} must be floating point samples")
    samples = np.asarray(tensor, dtype=np.float32)
    if samples.ndim == 2 and samples.shape[0] == 1:
        samples = samples[0]
    if samples.ndim != 1:
        raise BadRequest(ErrorClass.SHAPE_MISMATCH, f"samples must be [n] or [1, n], got {list(tensor.shape)}")
    return Chunk(record, slot, request, index, samples)


class Placement(enum.Enum):
    APPLY = "apply"  # the next chunk: apply it now
    WAIT = "wait"  # ahead of a missing chunk, within the window: hold it
    DUPLICATE = "duplicate"  # exact copy of an applied chunk (or too old to tell): drop, counted
    REJECT = "reject"  # cannot be placed: dead-letter with the reason


def placement(
    state: StreamState | None, chunk: Chunk, waiting: dict[int, Chunk], reorder_window: int
) -> tuple[Placement, str]:
    """Where ``chunk`` goes given the stream's state and the chunks already waiting."""
    expected = state.next_index if state is not None else 0
    if chunk.index < expected:
        assert state is not None
        if state.is_exact_duplicate(chunk.index, chunk.payload) is False:
            return Placement.REJECT, f"chunk {chunk.index} conflicts with the chunk already applied at that index"
        return Placement.DUPLICATE, ""
    if state is not None and state.ended:
        return Placement.REJECT, f"stream {state.key!r} already ended at chunk {state.next_index - 1}"
    if chunk.index > expected:
        if chunk.index - expected > reorder_window or chunk.index in waiting:
            return Placement.REJECT, f"chunk {chunk.index} cannot be placed: expected {expected}"
        return Placement.WAIT, ""
    if state is None and (not chunk.request.sequence_start or chunk.index != 0):
        key = chunk.record.key.decode("utf-8", "replace") if chunk.record.key else ""
        return Placement.REJECT, f"unknown stream {key!r}: its first chunk must be chunk 0 with sequence_start"
    return Placement.APPLY, ""
