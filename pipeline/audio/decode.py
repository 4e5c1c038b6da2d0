"""Validate one chunk of audio, and decode it with numpy for the reference path.

A chunk is either a complete WAV file (``bytes``) or a raw PCM tensor
(``INT16`` or ``FP32``, shape ``[samples]`` or ``[samples, channels]``) with its
sample rate. :func:`inspect_wav` / :func:`inspect_pcm` check it against
:class:`AudioLimits` without converting a sample (the batched DALI path decodes);
:func:`decode_wav` / :func:`decode_pcm` also convert it to float32 ``[frames,
channels]`` in [-1, 1], with exactly the scaling DALI's decoder (libsndfile)
applies, so the numpy reference and the DALI stage agree bit for bit before
resampling:

=========  ===========================  =========================
format     WAV                          float value
=========  ===========================  =========================
PCM_U8     8-bit, unsigned              (x - 128) / 128
PCM_S16    16-bit, or an INT16 tensor   x / 32768
PCM_S24    24-bit packed                x / 2**23
PCM_S32    32-bit                       float32(x) / 2**31
FLOAT32    IEEE float, or FP32 tensor   x (must be finite)
=========  ===========================  =========================

Every function here raises :class:`~pipeline.audio.errors.AudioError` for bad
audio and nothing else, whatever the bytes (a hypothesis test holds us to it).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from enum import Enum

import numpy as np

from pipeline.audio.errors import AudioError
from pipeline.audio.wav import WAVE_FORMAT_IEEE_FLOAT, WAVE_FORMAT_PCM, WavLayout, parse_wav


class SampleFormat(str, Enum):
    """How samples are stored, as a WAV file (or a tensor) holds them."""

    PCM_U8 = "PCM_U8"
    PCM_S16 = "PCM_S16"
    PCM_S24 = "PCM_S24"
    PCM_S32 = "PCM_S32"
    FLOAT32 = "FLOAT32"

    @property
    def bits(self) -> int:
        return _BITS[self]

    @property
    def format_tag(self) -> int:
        return WAVE_FORMAT_IEEE_FLOAT if self is SampleFormat.FLOAT32 else WAVE_FORMAT_PCM

    @classmethod
    def of(cls, format_tag: int, bits: int) -> SampleFormat:
        if format_tag == WAVE_FORMAT_IEEE_FLOAT:
            return cls.FLOAT32
        return {8: cls.PCM_U8, 16: cls.PCM_S16, 24: cls.PCM_S24, 32: cls.PCM_S32}[bits]


_BITS = {
    SampleFormat.PCM_U8: 8,
    SampleFormat.PCM_S16: 16,
    SampleFormat.PCM_S24: 24,
    SampleFormat.PCM_S32: 32,
    SampleFormat.FLOAT32: 32,
}


@dataclass(frozen=True)
class AudioLimits:
    """What one chunk may be. The cap on duration bounds the work (and memory) one message costs."""

    min_rate: int = 8_000
    max_rate: int = 192_000
    max_channels: int = 8
    max_seconds: float = 10.0


DEFAULT_LIMITS = AudioLimits()


@dataclass(frozen=True)
class AudioInfo:
    """A validated chunk's shape: enough to size, route and label it without its samples."""

    sample_format: SampleFormat
    channels: int
    sample_rate: int
    frames: int

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate


@dataclass(frozen=True, eq=False)
class DecodedAudio:
    """``samples``: float32 ``[frames, channels]`` in [-1, 1] (float input is passed through)."""

    samples: np.ndarray
    info: AudioInfo

    def mono(self) -> np.ndarray:
        """The mean of the channels, float32 ``[frames]`` (DALI's ``downmix=True``)."""
        if self.samples.shape[1] == 1:
            return np.array(self.samples[:, 0])
        return np.asarray(self.samples.mean(axis=1, dtype=np.float32))


# --------------------------------------------------------------------------- WAV
def inspect_wav(
    data: bytes | bytearray | memoryview, limits: AudioLimits = DEFAULT_LIMITS
) -> tuple[AudioInfo, WavLayout]:
    """Validate a WAV file: container, sample format, limits and (for float) finiteness."""
    data = _byte_view(data)
    layout = parse_wav(data)
    info = AudioInfo(
        SampleFormat.of(layout.format_tag, layout.bits),
        layout.channels,
        layout.sample_rate,
        layout.data_size // layout.block_align,
    )
    check_limits(info, limits)
    if info.sample_format is SampleFormat.FLOAT32:
        _check_finite(np.frombuffer(_payload(data, layout), "<f4"))
    return info, layout


def decode_wav(
    data: bytes | bytearray | memoryview, limits: AudioLimits = DEFAULT_LIMITS
) -> DecodedAudio:
    """Validate and convert a WAV file to float32 ``[frames, channels]``."""
    data = _byte_view(data)
    info, layout = inspect_wav(data, limits)
    samples = pcm_bytes_to_float(_payload(data, layout), info.sample_format, info.channels)
    return DecodedAudio(samples, info)


def _byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    """A flat byte view of ``data`` (offsets in a WAV are byte offsets)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"WAV data must be bytes, not {type(data).__name__}")
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1 or not view.contiguous:
        view = memoryview(view.tobytes())
    return view


def _payload(data: memoryview, layout: WavLayout) -> memoryview:
    return data[layout.data_offset : layout.data_offset + layout.data_size]


def pcm_bytes_to_float(
    payload: bytes | memoryview, sample_format: SampleFormat, channels: int
) -> np.ndarray:
    """Little-endian interleaved samples -> float32 ``[frames, channels]``, as libsndfile scales."""
    if sample_format is SampleFormat.PCM_U8:
        flat = (np.frombuffer(payload, np.uint8).astype(np.float32) - 128.0) * np.float32(1 / 128)
    elif sample_format is SampleFormat.PCM_S16:
        flat = np.frombuffer(payload, "<i2").astype(np.float32) * np.float32(1 / 32768)
    elif sample_format is SampleFormat.PCM_S24:
        octets = np.frombuffer(payload, np.uint8).reshape(-1, 3).astype(np.int32)
        values = octets[:, 0] | (octets[:, 1] << 8) | (octets[:, 2] << 16)
        values = np.where(values & 0x800000, values - (1 << 24), values)
        flat = values.astype(np.float32) * np.float32(2.0**-23)
    elif sample_format is SampleFormat.PCM_S32:
        flat = np.frombuffer(payload, "<i4").astype(np.float32) * np.float32(2.0**-31)
    else:
        flat = np.frombuffer(payload, "<f4").astype(np.float32)
    return flat.reshape(-1, channels)


# --------------------------------------------------------------------------- PCM tensors
_PCM_DTYPES = {("i", 2): SampleFormat.PCM_S16, ("f", 4): SampleFormat.FLOAT32}


def inspect_pcm(
    array: object, sample_rate: object, limits: AudioLimits = DEFAULT_LIMITS
) -> tuple[AudioInfo, np.ndarray]:
    """Validate a PCM tensor; return its info and its samples, C-contiguous little-endian 2-D.

    ``array`` and ``sample_rate`` usually come straight from a request, so any
    value is answered with :class:`AudioError`, never another exception.
    """
    if not isinstance(array, np.ndarray):
        raise AudioError(
            f"PCM must be a numpy array, not {type(array).__name__}", kind="bad-tensor"
        )
    sample_format = _PCM_DTYPES.get((array.dtype.kind, array.dtype.itemsize))
    if sample_format is None:
        raise AudioError(
            f"PCM tensors must be INT16 or FP32, not {array.dtype}", kind="unsupported-format"
        )
    if array.ndim not in (1, 2):
        raise AudioError(
            f"PCM shape {array.shape}: [samples] or [samples, channels] expected", kind="bad-tensor"
        )
    table = array if array.ndim == 2 else array[:, None]
    frames, channels = table.shape
    if channels > limits.max_channels:
        raise AudioError(
            f"PCM shape {array.shape} has {channels} channels (at most {limits.max_channels}; "
            "the layout is [samples, channels])",
            kind="bad-tensor",
        )
    info = AudioInfo(sample_format, channels, coerce_rate(sample_rate), frames)
    check_limits(info, limits)
    dtype = "<f4" if sample_format is SampleFormat.FLOAT32 else "<i2"
    samples = np.ascontiguousarray(table, dtype=dtype)
    if sample_format is SampleFormat.FLOAT32:
        _check_finite(samples)
    return info, samples


def decode_pcm(
    array: object, sample_rate: object, limits: AudioLimits = DEFAULT_LIMITS
) -> DecodedAudio:
    """Validate and convert a PCM tensor to float32 ``[frames, channels]``."""
    info, samples = inspect_pcm(array, sample_rate, limits)
    if info.sample_format is SampleFormat.PCM_S16:
        return DecodedAudio(samples.astype(np.float32) * np.float32(1 / 32768), info)
    return DecodedAudio(samples.astype(np.float32, copy=True), info)


def coerce_rate(sample_rate: object) -> int:
    """A sample rate as an ``int``: integers and integral floats pass, anything else is bad-rate."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Real):
        raise AudioError(f"sample rate {sample_rate!r} is not a number", kind="bad-rate")
    value = float(sample_rate)
    if not math.isfinite(value) or value != math.floor(value):
        raise AudioError(
            f"sample rate {sample_rate!r} is not a whole number of Hz", kind="bad-rate"
        )
    return int(value)


# --------------------------------------------------------------------------- shared checks
def check_limits(info: AudioInfo, limits: AudioLimits) -> None:
    """Raise AudioError when ``info`` breaks ``limits`` (channels, rate, emptiness, duration)."""
    if info.channels < 1:
        raise AudioError("zero channels", kind="no-samples")
    if info.channels > limits.max_channels:
        raise AudioError(
            f"{info.channels} channels (at most {limits.max_channels})", kind="unsupported-format"
        )
    if not limits.min_rate <= info.sample_rate <= limits.max_rate:
        raise AudioError(
            f"sample rate {info.sample_rate} Hz is outside {limits.min_rate}..{limits.max_rate} Hz",
            kind="bad-rate",
        )
    if info.frames == 0:
        raise AudioError("zero samples", kind="no-samples")
    if info.duration_s > limits.max_seconds:
        raise AudioError(
            f"{info.duration_s:.3f} s of audio (at most {limits.max_seconds:g} s per chunk)",
            kind="too-long",
        )


def _check_finite(samples: np.ndarray) -> None:
    if not np.isfinite(samples).all():
        raise AudioError("float samples include NaN or infinity", kind="non-finite")
