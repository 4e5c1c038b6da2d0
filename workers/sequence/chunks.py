"""A stream's chunks: parsing one from a record, and where it goes in the stream's order.

Per stream, chunks are applied strictly in ``chunk_index`` order: a chunk that
arrives early waits (up to ``reorder_window`` chunks ahead); one further ahead
*overflows* the window (the stage's gap policy decides: skip the missing chunks,
or refuse it); an exact duplicate of an applied or waiting chunk is dropped
(counted); a conflicting duplicate, or a chunk after the stream ended, is
dead-lettered; chunk 0 with ``sequence_start`` on an ended stream starts the
key's next stream (unless it is a replay of the ended stream's chunk 0).
:func:`placement` decides; it is pure, so it is unit-tested alone.
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
from pipeline.state.codec import payload_digest
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


def parse_chunk(record: ConsumedRecord, slot: Slot[Outputs], input_tensor: str, max_samples: int) -> Chunk:
    """Decode a chunk record; :class:`BadRequest` for anything that is not a usable chunk
    (including non-finite samples, and more than ``max_samples`` samples: a bound on the
    frames, so the Triton calls, one record can cost)."""
    if not record.key:
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, "a stream chunk needs the stream key as the record key")
    headers = list(record.headers or ())
    request = decode_request(record.value, headers)
    raw_index = request.parameters.get(CHUNK_INDEX, h.get_header(headers, "chunk-index"))
    # An integer parameter, or a header of decimal digits; never 1.5 truncated to 1, nor bool.
    if isinstance(raw_index, str) and raw_index.isascii() and raw_index.isdigit():
        raw_index = int(raw_index)
    if not isinstance(raw_index, int) or isinstance(raw_index, bool) or raw_index < 0:
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"{CHUNK_INDEX} must be a non-negative integer, got {raw_index!r}")
    index = raw_index
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
    if samples.size > max_samples:
        raise BadRequest(ErrorClass.SHAPE_MISMATCH, f"chunk of {samples.size} samples exceeds {max_samples}")
    if not np.isfinite(samples).all():
        raise BadRequest(ErrorClass.MALFORMED_REQUEST, "samples include NaN or infinity")
    return Chunk(record, slot, request, index, samples)


class Placement(enum.Enum):
    APPLY = "apply"  # the next chunk: apply it now
    RESTART = "restart"  # chunk 0 of the key's next stream: forget the ended one, apply it
    WAIT = "wait"  # ahead of a missing chunk, within the window: hold it
    OVERFLOW = "overflow"  # further ahead than the window: the gap policy decides
    DUPLICATE = "duplicate"  # exact copy of a chunk applied or waiting: drop, counted (reason given)
    REJECT = "reject"  # cannot be placed: dead-letter with the reason


def placement(
    state: StreamState | None, chunk: Chunk, waiting: dict[int, Chunk], reorder_window: int
) -> tuple[Placement, str]:
    """Where ``chunk`` goes given the stream's state and the chunks already waiting;
    the reason says why (a dead letter's reason, or a drop's metric label)."""
    expected = state.next_index if state is not None else 0
    payload = chunk.payload
    if state is not None and state.ended and chunk.index == 0 and chunk.request.sequence_start:
        if state.first_digest == payload_digest(payload) or state.is_exact_duplicate(0, payload):
            return Placement.DUPLICATE, "duplicate-chunk"
        return Placement.RESTART, ""
    if chunk.index < expected:
        assert state is not None
        if state.was_skipped(chunk.index):
            return Placement.REJECT, f"chunk {chunk.index} arrived after the stream went on without it (a gap)"
        same = state.is_exact_duplicate(chunk.index, payload)
        if same is False:
            return Placement.REJECT, f"chunk {chunk.index} conflicts with the chunk already applied at that index"
        # Too old to compare (beyond the remembered digests): a replay from before the
        # checkpoint, since applied indices never come back otherwise. Counted apart.
        return Placement.DUPLICATE, "duplicate-chunk" if same else "old-chunk-unverifiable"
    if state is not None and state.ended:
        return Placement.REJECT, f"stream {state.key!r} already ended at chunk {state.next_index - 1}"
    if chunk.index in waiting:
        if waiting[chunk.index].payload == payload:
            return Placement.DUPLICATE, "duplicate-chunk"
        return Placement.REJECT, f"chunk {chunk.index} conflicts with the chunk already waiting at that index"
    if chunk.index - expected > reorder_window:
        return Placement.OVERFLOW, f"chunk {chunk.index} cannot be placed: expected {expected}"
    if chunk.index > expected:
        return Placement.WAIT, ""
    if state is None and (not chunk.request.sequence_start or chunk.index != 0):
        key = chunk.record.key.decode("utf-8", "replace") if chunk.record.key else ""
        return Placement.REJECT, f"unknown stream {key!r}: its first chunk must be chunk 0 with sequence_start"
    return Placement.APPLY, ""
