"""Read WAV files into float32 samples: what audio models (Silero VAD) take as input.

There is one WAV reader in the project, :mod:`pipeline.audio` (the chunk
walker in :mod:`pipeline.audio.wav`, the scaling in :mod:`pipeline.audio.decode`);
the DALI stage uses it and a hypothesis test fuzzes it. Why it is hand-written
rather than the stdlib :mod:`wave` is measured and written down in
:mod:`pipeline.audio.wav`. This module only adapts it to files a user names:

- the per-chunk limits a stage applies (10 s, 8 channels, 8..192 kHz) do not
  apply to a whole recording, so :data:`FILE_LIMITS` lifts them (a file must
  still hold at least one sample, at a positive rate);
- a bad file is a :class:`~pipeline.errors.ConfigError`, one line naming it.

Samples are scaled to [-1, 1) float32, the convention of every speech model we
serve. :meth:`WavAudio.chunks` cuts the mono signal into fixed-size frames, the
shape chunked streaming sends one request per frame of.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.audio import AudioError, AudioLimits, DecodedAudio, SampleFormat, decode_wav
from pipeline.errors import ConfigError

#: A whole file, not one chunk: any length, any channel count or rate a WAV header can state.
FILE_LIMITS = AudioLimits(min_rate=1, max_rate=0xFFFF_FFFF, max_channels=0xFFFF, max_seconds=math.inf)

_SOURCE_FORMATS = {
    SampleFormat.PCM_U8: "PCM8",
    SampleFormat.PCM_S16: "PCM16",
    SampleFormat.PCM_S24: "PCM24",
    SampleFormat.PCM_S32: "PCM32",
    SampleFormat.FLOAT32: "FP32",
}


@dataclass(frozen=True, eq=False)
class WavAudio(DecodedAudio):
    """Decoded audio: ``samples`` is float32 ``(frames, channels)`` in [-1, 1)."""

    source_format: str  # "PCM16", "FP32", ...: what the file held, for messages

    @property
    def sample_rate(self) -> int:
        return self.info.sample_rate

    @property
    def channels(self) -> int:
        return self.info.channels

    def chunks(self, size: int, *, pad: bool = True) -> Iterator[np.ndarray]:
        """Consecutive mono frames of ``size`` samples; the last one zero-padded unless ``pad=False``."""
        if size <= 0:
            raise ValueError("chunk size must be positive")
        signal = self.mono()
        for start in range(0, len(signal), size):
            chunk = signal[start : start + size]
            if len(chunk) < size:
                if not pad:
                    return
                chunk = np.concatenate([chunk, np.zeros(size - len(chunk), np.float32)])
            yield chunk


def read_wav(path: str | Path) -> WavAudio:
    """Read a mono or multi-channel PCM (8/16/24/32-bit) or 32-bit IEEE-float WAV file.

    Raises :class:`~pipeline.errors.ConfigError` (one line, naming the file)
    for a missing, truncated, empty or unsupported file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read WAV file {path}: {exc.strerror or exc}") from None
    try:
        decoded = decode_wav(data, FILE_LIMITS)
    except AudioError as exc:
        raise ConfigError(f"{path}: not a WAV file this reader supports: {exc.reason}") from None
    return WavAudio(decoded.samples, decoded.info, _SOURCE_FORMATS[decoded.info.sample_format])
