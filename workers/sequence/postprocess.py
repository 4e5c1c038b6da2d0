"""What a sequence stage emits besides each chunk's model outputs, chosen in the topology.

The stage itself knows nothing of speech: per chunk it emits the model's outputs
(one row per frame). A *post-processor* turns the frames' outputs into further
results and keeps its own state inside the stream's checkpoint
(``StreamState.post``), so it survives crashes and rebalances like the rest.

- :class:`NoPostProcessing` (``postprocess: null``): chunk results only.
- :class:`VadSegments` (``postprocess: {kind: vad_segments, ...}``): speech
  segments as they close (Silero's hysteresis rule) and a summary when the
  stream ends, goes idle or is evicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from workers.sequence.state import StreamState


@dataclass(frozen=True)
class Emission:
    """One result to emit: its ``result-type`` header, tensors and parameters."""

    kind: str
    tensors: dict[str, np.ndarray]
    parameters: dict[str, object] = field(default_factory=dict)


class PostProcessor(Protocol):
    def on_frames(
        self, state: StreamState, outputs: list[dict[str, np.ndarray]], *, chunk_index: int, ending: bool
    ) -> list[Emission]:
        """A chunk's frames were inferred (``state.frames_done`` already counts them);
        update ``state.post`` and return what to emit after the chunk result."""

    def on_close(self, state: StreamState, reason: str) -> list[Emission]:
        """The stream was closed without an end chunk (``reason``: idle, evicted)."""


class NoPostProcessing:
    def on_frames(
        self, state: StreamState, outputs: list[dict[str, np.ndarray]], *, chunk_index: int, ending: bool
    ) -> list[Emission]:
        return []

    def on_close(self, state: StreamState, reason: str) -> list[Emission]:
        return []


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


@dataclass(frozen=True)
class VadSettings:
    """The ``vad_segments`` post-processor's settings (Silero's own defaults)."""

    output: str = "probability"
    """The model output holding the per-frame probability."""
    threshold: float = 0.5
    """A frame at or above it is speech (starts a segment)."""
    neg_threshold: float = 0.35
    """A frame below it is silence (may end a segment): the gap between the two is hysteresis."""
    min_speech_ms: float = 250.0
    min_silence_ms: float = 300.0


class VadSegments:
    """Speech segments and a per-stream summary from per-frame speech probabilities."""

    def __init__(self, settings: VadSettings, *, frame_size: int, sample_rate: int) -> None:
        self.settings = settings
        self.sample_rate = sample_rate
        self.frame_s = frame_size / sample_rate

    def _tracker(self, post: dict[str, Any]) -> SegmentTracker:
        s = self.settings
        tracker = SegmentTracker(
            threshold=s.threshold,
            neg_threshold=s.neg_threshold,
            min_speech_frames=round(s.min_speech_ms / 1000 / self.frame_s),
            min_silence_frames=round(s.min_silence_ms / 1000 / self.frame_s),
        )
        if post.get("tracker"):
            tracker.restore(post["tracker"])
        return tracker

    def on_frames(
        self, state: StreamState, outputs: list[dict[str, np.ndarray]], *, chunk_index: int, ending: bool
    ) -> list[Emission]:
        post = dict(state.post)
        tracker = self._tracker(post)
        first_frame = state.frames_done - len(outputs)
        speech_frames = int(post.get("speech_frames", 0))
        closed = []
        for offset, output in enumerate(outputs):
            probability = float(np.asarray(output[self.settings.output]).reshape(-1)[0])
            if probability >= self.settings.threshold:
                speech_frames += 1
            if segment := tracker.push(first_frame + offset, probability):
                closed.append(segment)
        if ending and (segment := tracker.finish(state.frames_done)):
            closed.append(segment)
        segments = int(post.get("segments", 0))
        emissions = []
        for segment in closed:
            emissions.append(
                Emission(
                    "segment",
                    {
                        "start_s": np.array([segment.start_frame * self.frame_s]),
                        "end_s": np.array([segment.end_frame * self.frame_s]),
                    },
                    {"chunk_index": chunk_index, "segment_index": segments},
                )
            )
            segments += 1
        state.post = {"tracker": tracker.to_dict(), "segments": segments, "speech_frames": speech_frames}
        if ending:
            emissions.append(self._summary(state, "end"))
        return emissions

    def on_close(self, state: StreamState, reason: str) -> list[Emission]:
        return [self._summary(state, reason)]

    def _summary(self, state: StreamState, reason: str) -> Emission:
        tensors = {
            "duration_s": np.array([state.samples_in / self.sample_rate]),
            "speech_s": np.array([int(state.post.get("speech_frames", 0)) * self.frame_s]),
            "segments": np.array([int(state.post.get("segments", 0))], dtype=np.int64),
            "chunks": np.array([state.next_index], dtype=np.int64),
        }
        return Emission("summary", tensors, {"chunk_index": state.next_index - 1, "reason": reason})
