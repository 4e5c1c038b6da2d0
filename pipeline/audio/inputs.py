"""One chunk of audio for the preprocessor, validated the moment it is made.

An :class:`AudioInput` is built where a message is decoded: bad audio raises
:class:`~pipeline.audio.errors.AudioError` there, so the stage dead-letters that
one message and every batch handed to
:meth:`~pipeline.audio.dali_preprocess.AudioPreprocessor.process` is valid.
Construction also produces ``canonical_wav``: the chunk as a WAV file with a
header this package wrote, which is what the DALI decoder reads (a WAV that is
already canonical is used as is, without a copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.audio.decode import DEFAULT_LIMITS, AudioInfo, AudioLimits, inspect_pcm, inspect_wav
from pipeline.audio.errors import AudioError
from pipeline.audio.wav import canonical_wav, is_canonical


@dataclass(frozen=True, eq=False)
class AudioInput:
    """``wav`` (a complete WAV file), or ``pcm`` (INT16/FP32) with its ``sample_rate``.

    ``pcm`` is ``[samples]`` or ``[samples, channels]``.

    ``info`` and ``canonical_wav`` are derived; construction raises AudioError for bad audio.
    """

    wav: bytes | None = None
    pcm: np.ndarray | None = None
    sample_rate: int | None = None
    limits: AudioLimits = field(default=DEFAULT_LIMITS, kw_only=True, repr=False)
    info: AudioInfo = field(init=False)
    canonical_wav: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.wav is None) == (self.pcm is None):
            raise TypeError("AudioInput takes exactly one of wav= or pcm=")
        if self.wav is not None:
            if self.sample_rate is not None:
                raise TypeError(
                    "a WAV file carries its own sample rate; pass sample_rate only with pcm"
                )
            if not isinstance(self.wav, (bytes, bytearray, memoryview)):
                raise TypeError(f"wav must be bytes, not {type(self.wav).__name__}")
            data = bytes(self.wav)  # no copy when it already is bytes
            info, layout = inspect_wav(data, self.limits)
            if is_canonical(data, layout):
                encoded = data
            else:
                payload = memoryview(data)[
                    layout.data_offset : layout.data_offset + layout.data_size
                ]
                encoded = canonical_wav(
                    layout.format_tag, info.channels, info.sample_rate, layout.bits, payload
                )
        else:
            if self.sample_rate is None:
                raise AudioError("raw PCM needs a sample rate", kind="bad-rate")
            info, samples = inspect_pcm(self.pcm, self.sample_rate, self.limits)
            fmt = info.sample_format
            encoded = canonical_wav(
                fmt.format_tag, info.channels, info.sample_rate, fmt.bits, samples.data
            )
        object.__setattr__(self, "info", info)
        object.__setattr__(self, "canonical_wav", encoded)

    @classmethod
    def from_wav(cls, data: bytes, *, limits: AudioLimits = DEFAULT_LIMITS) -> AudioInput:
        return cls(wav=data, limits=limits)

    @classmethod
    def from_pcm(
        cls, samples: np.ndarray, sample_rate: int, *, limits: AudioLimits = DEFAULT_LIMITS
    ) -> AudioInput:
        return cls(pcm=samples, sample_rate=sample_rate, limits=limits)

    @property
    def duration_s(self) -> float:
        return self.info.duration_s
