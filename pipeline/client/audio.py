"""Read WAV files into float32 samples: what audio models (Silero VAD) take as input.

PCM files (8/16/24/32-bit integer) are read with the stdlib :mod:`wave`
module. ``wave`` refuses IEEE-float files (format tag 3, what many audio tools
write by default) and, before Python 3.12, ``WAVE_FORMAT_EXTENSIBLE`` headers;
for those a minimal RIFF chunk reader takes over. No third-party audio library
is needed either way.

Samples are scaled to [-1, 1) float32, the convention of every speech model we
serve. :meth:`WavAudio.chunks` cuts the mono signal into fixed-size frames, the
shape chunked streaming sends one request per frame of.
"""

from __future__ import annotations

import io
import struct
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import ConfigError

WAVE_FORMAT_PCM = 0x0001
WAVE_FORMAT_IEEE_FLOAT = 0x0003
WAVE_FORMAT_EXTENSIBLE = 0xFFFE

_FMT = struct.Struct("<HHIIHH")  # format tag, channels, rate, byte rate, block align, bits
_CHUNK_HEADER = struct.Struct("<4sI")


@dataclass(frozen=True, eq=False)
class WavAudio:
    """Decoded audio: ``samples`` is float32 ``(frames, channels)`` in [-1, 1)."""

    samples: np.ndarray
    sample_rate: int
    source_format: str  # e.g. "PCM16", "FP32": what the file held, for messages

    @property
    def channels(self) -> int:
        return int(self.samples.shape[1])

    @property
    def frames(self) -> int:
        return int(self.samples.shape[0])

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate if self.sample_rate else 0.0

    def mono(self) -> np.ndarray:
        """One channel: the mean of all channels (a stereo file becomes its downmix)."""
        if self.channels == 1:
            return self.samples[:, 0]
        return self.samples.mean(axis=1, dtype=np.float32)

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
    """Read a mono or multi-channel PCM or IEEE-float WAV file.

    Raises :class:`~pipeline.errors.ConfigError` (one line, naming the file)
    for a missing, truncated or unsupported file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read WAV file {path}: {exc.strerror or exc}") from None
    try:
        return _read_with_wave(data, path)
    except wave.Error:
        pass  # not plain PCM as `wave` knows it: try the RIFF reader below
    except EOFError:
        raise ConfigError(f"{path}: truncated WAV file") from None
    try:
        return _read_riff(data)
    except (ValueError, struct.error) as exc:
        raise ConfigError(f"{path}: not a WAV file this reader supports: {exc}") from None


def pcm_to_float(raw: bytes, sample_width: int) -> np.ndarray:
    """Little-endian integer PCM bytes -> float32 in [-1, 1) (8-bit WAV is unsigned)."""
    if sample_width == 1:
        return (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    if sample_width == 2:
        return np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    if sample_width == 3:
        octets = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        values = octets[:, 0] | (octets[:, 1] << 8) | (octets[:, 2] << 16)
        values = np.where(values & 0x800000, values - (1 << 24), values)
        return values.astype(np.float32) / float(1 << 23)
    if sample_width == 4:
        return (np.frombuffer(raw, "<i4").astype(np.float64) / float(1 << 31)).astype(np.float32)
    raise ValueError(f"{sample_width * 8}-bit PCM is not supported")


def _read_with_wave(data: bytes, path: Path) -> WavAudio:
    with wave.open(io.BytesIO(data), "rb") as wav:
        channels = wav.getnchannels()
        width = wav.getsampwidth()
        rate = wav.getframerate()
        raw = wav.readframes(wav.getnframes())
    usable = len(raw) - len(raw) % (width * channels)  # a truncated last frame is dropped
    try:
        flat = pcm_to_float(raw[:usable], width)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return WavAudio(flat.reshape(-1, channels), rate, f"PCM{width * 8}")


def _read_riff(data: bytes) -> WavAudio:
    """The RIFF/WAVE chunks ``wave`` does not handle: IEEE float and WAVE_FORMAT_EXTENSIBLE."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("no RIFF/WAVE header")
    fmt: tuple[int, ...] | None = None
    subformat: int | None = None
    payload: bytes | None = None
    offset = 12
    while offset + _CHUNK_HEADER.size <= len(data):
        chunk_id, size = _CHUNK_HEADER.unpack_from(data, offset)
        body = data[offset + _CHUNK_HEADER.size : offset + _CHUNK_HEADER.size + size]
        if chunk_id == b"fmt ":
            fmt = _FMT.unpack_from(body)
            if fmt[0] == WAVE_FORMAT_EXTENSIBLE and len(body) >= 26:
                # cbSize, valid bits, channel mask, then a GUID whose first two bytes are the format.
                (subformat,) = struct.unpack_from("<H", body, 24)
        elif chunk_id == b"data":
            payload = body
        offset += _CHUNK_HEADER.size + size + (size & 1)  # chunks are padded to even sizes
    if fmt is None or payload is None:
        raise ValueError("missing 'fmt ' or 'data' chunk")
    tag, channels, rate, _byte_rate, _align, bits = fmt
    if tag == WAVE_FORMAT_EXTENSIBLE:
        if subformat is None:
            raise ValueError("WAVE_FORMAT_EXTENSIBLE header without a subformat")
        tag = subformat
    if channels < 1 or bits % 8:
        raise ValueError(f"{channels} channel(s) of {bits}-bit samples")
    frame = channels * bits // 8
    payload = payload[: len(payload) - len(payload) % frame]
    if tag == WAVE_FORMAT_IEEE_FLOAT and bits in (32, 64):
        flat = np.frombuffer(payload, "<f4" if bits == 32 else "<f8").astype(np.float32)
        return WavAudio(flat.reshape(-1, channels), rate, f"FP{bits}")
    if tag == WAVE_FORMAT_PCM:
        return WavAudio(pcm_to_float(payload, bits // 8).reshape(-1, channels), rate, f"PCM{bits}")
    raise ValueError(f"format tag {tag:#06x} with {bits}-bit samples")
