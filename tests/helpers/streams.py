"""Audio streams as a client sends them, and the results a pipeline must give for them.

The expected results come from running the vendored Silero ONNX model in
process, chunk by chunk (tests/helpers/vad_reference.py), and the project's
segment tracker over those probabilities: the pipeline must reproduce both.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np
from aiokafka.structs import ConsumerRecord

from pipeline.contract.payload import ParamValue
from pipeline.contract.records import Record
from pipeline.contract.request import WireForm, encode_request
from pipeline.contract.response import decode_response
from tests.helpers.kafka_io import header
from tests.helpers.vad_reference import (
    CHUNK,
    SAMPLE_RATE,
    VadStream,
    speech_with_silence,
    to_chunks,
    vad_session,
)
from workers.sequence.postprocess import Segment, SegmentTracker

UTTERANCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Now every sequence stays on one worker.",
    "Hello world.",
)
SEQUENCE_STAGE = {
    "name": "vad",
    "kind": "sequence",
    "model": "silero_vad",
    "input_tensor": "audio",
    "state_map": {"state_in": "state_out", "context_in": "context_out"},
    "segments": {},
}


DALI_STAGE = {
    "name": "preprocess",
    "kind": "dali",
    "device": "cpu",
    "batching": {"max_batch_size": 64, "max_queue_delay_ms": 2.0},
}
AUDIO_STAGES = [DALI_STAGE, SEQUENCE_STAGE]
"""topologies/audio.yaml's stages: DALI preprocessing, then the sequence stage."""


@cache
def utterance(index: int, pad_s: float = 1.0) -> np.ndarray:
    """16 kHz float32 speech with ``pad_s`` of silence around it (cached per process)."""
    return speech_with_silence(UTTERANCES[index % len(UTTERANCES)], pad_s=pad_s)


def stream_records(key: str, audio: np.ndarray, chunk_samples: int = CHUNK) -> list[Record]:
    """One request record per chunk: FP32 ``audio`` at 16 kHz (``sample_rate`` given, so a DALI
    stage passes it through), ``chunk_index``, Triton's sequence flags."""
    pieces = [audio[i : i + chunk_samples] for i in range(0, len(audio), chunk_samples)]
    return chunk_records(key, pieces, sample_rate=SAMPLE_RATE)


def chunk_records(
    key: str,
    pieces: Sequence[np.ndarray],
    *,
    id_prefix: str | None = None,
    sample_rate: int | None = None,
    form: WireForm | str = WireForm.PROTOBUF,
) -> list[Record]:
    """One sequence request per piece of ``key``'s stream, in order: ``audio`` (one row),
    ``chunk_index`` (and ``sample_rate`` when given), sequence start on the first and end
    on the last; correlation IDs ``<id_prefix or key>/<index>``."""
    extra: dict[str, ParamValue] = {} if sample_rate is None else {"sample_rate": sample_rate}
    return [
        encode_request(
            {"audio": piece[None, :]},
            correlation_id=f"{id_prefix or key}/{i}",
            form=form,
            parameters={"chunk_index": i, **extra},
            sequence_id=key,
            sequence_start=i == 0,
            sequence_end=i == len(pieces) - 1,
            key=key,
        )
        for i, piece in enumerate(pieces)
    ]


def interleave(streams: list[list[Record]]) -> list[Record]:
    """Round-robin over streams, as many concurrent clients would produce."""
    return [r for group in itertools.zip_longest(*streams) for r in group if r is not None]


def speech_bounds(index: int, pad_s: float = 1.0) -> tuple[float, float]:
    """Where speech really is in ``utterance(index)``: first and last sample above 2% of the peak."""
    audio = utterance(index, pad_s)
    loud = np.flatnonzero(np.abs(audio) > 0.02 * np.abs(audio).max())
    return loud[0] / SAMPLE_RATE, (loud[-1] + 1) / SAMPLE_RATE


@dataclass
class Expected:
    probabilities: np.ndarray
    segments: list[tuple[float, float]]
    chunks: int


@cache
def _reference_probabilities(index: int) -> np.ndarray:
    return VadStream(vad_session()).run(to_chunks(utterance(index)))


def expected(index: int, chunk_samples: int = CHUNK) -> Expected:
    """What the pipeline must output for ``utterance(index)`` sent in ``chunk_samples`` chunks."""
    probs = _reference_probabilities(index)
    frame_s = CHUNK / SAMPLE_RATE
    tracker = SegmentTracker(0.5, 0.35, round(0.25 / frame_s), round(0.3 / frame_s))
    segments: list[Segment] = [s for i, p in enumerate(probs) if (s := tracker.push(i, float(p)))]
    if last := tracker.finish(len(probs)):
        segments.append(last)
    chunks = -(-len(utterance(index)) // chunk_samples)
    return Expected(
        probs, [(s.start_frame * frame_s, s.end_frame * frame_s) for s in segments], chunks
    )


@dataclass
class StreamResults:
    """Results of one stream, first occurrence of each identity kept, duplicates counted."""

    chunks: dict[int, np.ndarray] = field(default_factory=dict)
    chunk_order: list[int] = field(default_factory=list)
    segments: dict[int, tuple[float, float]] = field(default_factory=dict)
    summary: dict[str, float] | None = None
    duplicates: int = 0
    conflicting: int = 0

    def probabilities(self) -> np.ndarray:
        return (
            np.concatenate([self.chunks[i] for i in sorted(self.chunks)])
            if self.chunks
            else np.zeros(0)
        )


def gather(records: list[ConsumerRecord[bytes, bytes]]) -> dict[str, StreamResults]:
    """Group result records by stream; identical re-deliveries count as duplicates."""
    streams: dict[str, StreamResults] = defaultdict(StreamResults)
    seen: dict[tuple[str, str, int], bytes] = {}
    for record in records:
        key = record.key.decode()
        kind = header(record, "result-type") or "?"
        response = decode_response(record.value, record.headers)
        params = response.parameters
        ident = int(params.get("segment_index", params.get("chunk_index", -1)))  # type: ignore[arg-type]
        identity = (key, kind, ident)
        out = streams[key]
        if identity in seen:
            out.duplicates += 1
            if seen[identity] != record.value:
                out.conflicting += 1
            continue
        seen[identity] = record.value
        if kind == "chunk":
            out.chunks[ident] = response.outputs["probability"].reshape(-1)
            out.chunk_order.append(ident)
        elif kind == "segment":
            out.segments[ident] = (
                float(response.outputs["start_s"][0]),
                float(response.outputs["end_s"][0]),
            )
        elif kind == "summary":
            out.summary = {
                name: float(np.asarray(v).reshape(-1)[0]) for name, v in response.outputs.items()
            }
    return dict(streams)


def assert_stream_matches(results: StreamResults, want: Expected, key: str) -> None:
    assert results.summary is not None, f"{key}: no summary"
    assert sorted(results.chunks) == list(range(want.chunks)), f"{key}: chunks missing or extra"
    assert results.chunk_order == sorted(results.chunk_order), f"{key}: chunk results out of order"
    np.testing.assert_allclose(results.probabilities(), want.probabilities, atol=1e-5, err_msg=key)
    got_segments = [results.segments[i] for i in sorted(results.segments)]
    np.testing.assert_allclose(got_segments, want.segments, atol=1e-9, err_msg=key)
    assert results.summary["chunks"] == want.chunks
    assert results.conflicting == 0, f"{key}: re-delivered results differ from the first delivery"
