"""Per-stream state of a sequence stage, and its checkpoint encoding.

Everything a stream's next output depends on lives here: the next chunk index,
the samples carried over to the next frame, the model's recurrent state (the
model's state outputs, fed back as state inputs on resume), the segment
tracker, and digests of recently applied chunks (to tell an exact duplicate
from a conflicting one). The stage checkpoints this value to a compacted
Kafka topic after the results it accounts for are acknowledged, so a worker
that restores it continues exactly where the checkpoint left off.

Pure data and logic: no I/O, unit-tested on its own.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

DIGEST_MEMORY = 64  # applied chunks remembered per stream for duplicate detection


@dataclass(frozen=True)
class Segment:
    start_frame: int
    end_frame: int


@dataclass
class SegmentTracker:
    """Streaming version of Silero VAD's hysteresis over per-frame speech probabilities.

    A segment opens at the first frame >= ``threshold``; it closes at the first
    frame < ``neg_threshold`` once ``min_silence_frames`` frames have passed
    below it; segments shorter than ``min_speech_frames`` are discarded.
    """

    threshold: float
    neg_threshold: float
    min_speech_frames: int
    min_silence_frames: int
    triggered: bool = False
    start: int = 0
    temp_end: int | None = None

    def push(self, frame: int, probability: float) -> Segment | None:
        """Feed frame ``frame``'s probability; returns a segment when one closes."""
        if probability >= self.threshold and self.temp_end is not None:
            self.temp_end = None
        if probability >= self.threshold and not self.triggered:
            self.triggered = True
            self.start = frame
            return None
        if probability < self.neg_threshold and self.triggered:
            if self.temp_end is None:
                self.temp_end = frame
            if frame - self.temp_end >= self.min_silence_frames:
                end, self.triggered, self.temp_end = self.temp_end, False, None
                if end - self.start >= self.min_speech_frames:
                    return Segment(self.start, end)
        return None

    def finish(self, frames: int) -> Segment | None:
        """The stream ended after ``frames`` frames: close an open segment."""
        if not self.triggered:
            return None
        end = self.temp_end if self.temp_end is not None else frames
        self.triggered, self.temp_end = False, None
        return Segment(self.start, end) if end - self.start >= self.min_speech_frames else None

    def to_dict(self) -> dict[str, Any]:
        return {"triggered": self.triggered, "start": self.start, "temp_end": self.temp_end}

    def restore(self, data: dict[str, Any]) -> None:
        self.triggered = bool(data["triggered"])
        self.start = int(data["start"])
        self.temp_end = None if data["temp_end"] is None else int(data["temp_end"])


@dataclass
class StreamState:
    """One stream's progress; see the module docstring for why each field exists."""

    key: str
    next_index: int = 0
    frames_done: int = 0
    samples_in: int = 0
    carry: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    model_state: dict[str, np.ndarray] = field(default_factory=dict)
    tracker: dict[str, Any] | None = None
    segments: int = 0
    speech_frames: int = 0
    ended: bool = False
    digests: OrderedDict[int, str] = field(default_factory=OrderedDict)

    def copy(self) -> StreamState:
        """A copy to work on: arrays and the tracker dict are replaced, never changed in
        place, so only the containers are copied (a deepcopy costs ~8x more per chunk)."""
        return replace(self, model_state=dict(self.model_state), digests=OrderedDict(self.digests))

    def remember(self, index: int, payload: bytes) -> None:
        self.digests[index] = chunk_digest(payload)
        while len(self.digests) > DIGEST_MEMORY:
            self.digests.popitem(last=False)

    def is_exact_duplicate(self, index: int, payload: bytes) -> bool | None:
        """True/False for a remembered index; None when it is too old to tell."""
        digest = self.digests.get(index)
        if digest is None:
            return None
        return digest == chunk_digest(payload)


def chunk_digest(payload: bytes) -> str:
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


def _array_to_json(array: np.ndarray) -> dict[str, Any]:
    contiguous = np.ascontiguousarray(array, dtype=np.float32)
    return {"shape": list(contiguous.shape), "f32": base64.b64encode(contiguous.tobytes()).decode()}


def _array_from_json(data: dict[str, Any]) -> np.ndarray:
    raw = base64.b64decode(data["f32"])
    return np.frombuffer(raw, dtype="<f4").reshape(data["shape"]).astype(np.float32)


CHECKPOINT_VERSION = 1


def encode_checkpoint(state: StreamState) -> bytes:
    """A self-describing JSON checkpoint (float tensors as little-endian base64)."""
    return json.dumps(
        {
            "v": CHECKPOINT_VERSION,
            "key": state.key,
            "next_index": state.next_index,
            "frames_done": state.frames_done,
            "samples_in": state.samples_in,
            "carry": _array_to_json(state.carry),
            "model_state": {name: _array_to_json(a) for name, a in state.model_state.items()},
            "tracker": state.tracker,
            "segments": state.segments,
            "speech_frames": state.speech_frames,
            "ended": state.ended,
            "digests": [[i, d] for i, d in state.digests.items()],
        },
        separators=(",", ":"),
    ).encode()


def decode_checkpoint(value: bytes) -> StreamState:
    data = json.loads(value)
    if data.get("v") != CHECKPOINT_VERSION:
        raise ValueError(f"unsupported checkpoint version {data.get('v')!r}")
    return StreamState(
        key=data["key"],
        next_index=int(data["next_index"]),
        frames_done=int(data["frames_done"]),
        samples_in=int(data["samples_in"]),
        carry=_array_from_json(data["carry"]),
        model_state={name: _array_from_json(a) for name, a in data["model_state"].items()},
        tracker=data["tracker"],
        segments=int(data["segments"]),
        speech_frames=int(data["speech_frames"]),
        ended=bool(data["ended"]),
        digests=OrderedDict((int(i), str(d)) for i, d in data["digests"]),
    )


def frame(carry: np.ndarray, samples: np.ndarray, size: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Split ``carry + samples`` into whole frames of ``size`` and the new carry."""
    joined = np.concatenate([carry, samples.astype(np.float32, copy=False)]) if carry.size else samples
    joined = np.asarray(joined, dtype=np.float32)
    whole = (joined.size // size) * size
    frames = [joined[i : i + size] for i in range(0, whole, size)]
    return frames, joined[whole:].copy()
