"""Audio preprocessing for streaming models: chunks in any WAV/PCM form -> 16 kHz mono float32.

- :class:`AudioInput` (``inputs``): one chunk, validated when made; bad audio
  raises :class:`AudioError` (``errors``), a ``BadRequest`` the stage dead-letters.
- :class:`AudioPreprocessor` (``dali_preprocess``): batches of chunks through one
  DALI run, on the GPU when there is one. Imported lazily, so ``import
  pipeline.audio`` does not load DALI.
- ``decode``/``wav``: validation and numpy decoding; ``resample``: the resampling
  math; ``reference``: the numpy/scipy reference of the whole transform.

Framing into model windows (512 samples for Silero VAD) needs carry-over between
chunks, so it belongs to the stateful stage, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.audio.decode import (
    DEFAULT_LIMITS,
    AudioInfo,
    AudioLimits,
    DecodedAudio,
    SampleFormat,
    decode_pcm,
    decode_wav,
    inspect_pcm,
    inspect_wav,
)
from pipeline.audio.errors import AudioError
from pipeline.audio.inputs import AudioInput

if TYPE_CHECKING:
    from pipeline.audio.dali_preprocess import AudioPreprocessor, PreprocessingFailed

__all__ = [
    "DEFAULT_LIMITS",
    "AudioError",
    "AudioInfo",
    "AudioInput",
    "AudioLimits",
    "AudioPreprocessor",
    "DecodedAudio",
    "PreprocessingFailed",
    "SampleFormat",
    "decode_pcm",
    "decode_wav",
    "inspect_pcm",
    "inspect_wav",
]


def __getattr__(name: str) -> object:
    if name in ("AudioPreprocessor", "PreprocessingFailed"):
        from pipeline.audio import dali_preprocess

        return getattr(dali_preprocess, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
