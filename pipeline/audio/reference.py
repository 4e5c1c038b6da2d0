"""The numpy/scipy reference of the DALI stage: the same transform, one chunk at a time.

Two resamplers, for two jobs:

- ``method="dali-kernel"`` (the test oracle): decode with numpy, mean the
  channels, clamp to [-1, 1], the same anti-aliasing FIR (in float64), DALI's
  windowed-sinc kernel ported to numpy
  (:func:`~pipeline.audio.resample.sinc_resample`), clamp again. It agrees with
  the DALI stage to float32 rounding (about 3e-7), so tests can hold DALI to a
  tight tolerance, on any input, chunk edges included.
- ``method="polyphase"`` (the baseline): what one would write without DALI,
  :func:`scipy.signal.resample_poly` (a Kaiser-windowed polyphase FIR). A
  different filter, so it agrees with the stage in the pass band (below
  0.45 x target_rate), not sample for sample; the benchmark times it.

The decode step reads the chunk as sent (``wav`` or ``pcm``), not the canonical
WAV the DALI stage decodes, so a bug in that rewrite shows up as a mismatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd
from typing import Literal

import numpy as np

from pipeline.audio.decode import DecodedAudio, decode_pcm, decode_wav
from pipeline.audio.inputs import AudioInput
from pipeline.audio.resample import antialias_kernel, apply_fir, sinc_resample

Method = Literal["dali-kernel", "polyphase"]


def decode_input(item: AudioInput) -> DecodedAudio:
    """The chunk as float32 ``[frames, channels]``, decoded by numpy from what was sent."""
    if item.wav is not None:
        return decode_wav(item.wav, item.limits)
    return decode_pcm(item.pcm, item.sample_rate, item.limits)


def reference_preprocess(
    item: AudioInput,
    target_rate: int = 16_000,
    *,
    method: Method = "dali-kernel",
    quality: float = 50.0,
    antialias: bool = True,
) -> np.ndarray:
    """One chunk -> 1-D float32 at ``target_rate``, clamped to [-1, 1]."""
    decoded = decode_input(item)
    mono = np.clip(decoded.mono(), -1.0, 1.0)  # float input may exceed full scale
    rate = decoded.info.sample_rate
    if method == "dali-kernel":
        if antialias:
            mono = apply_fir(mono, antialias_kernel(rate, target_rate))
        resampled = sinc_resample(mono, rate, target_rate, quality)
    elif method == "polyphase":
        resampled = polyphase_resample(mono, rate, target_rate)
    else:
        raise ValueError(f"unknown method {method!r}")
    return np.clip(resampled, -1.0, 1.0).astype(np.float32, copy=False)


def reference_batch(
    items: Sequence[AudioInput],
    target_rate: int = 16_000,
    *,
    method: Method = "dali-kernel",
    quality: float = 50.0,
    antialias: bool = True,
) -> list[np.ndarray]:
    """:func:`reference_preprocess` over a batch, one chunk after the other."""
    return [
        reference_preprocess(item, target_rate, method=method, quality=quality, antialias=antialias)
        for item in items
    ]


def polyphase_resample(signal: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """scipy's polyphase resampler; its length, ``ceil(n * out_rate / in_rate)``, is DALI's too."""
    from scipy.signal import resample_poly  # scipy is a test/benchmark dependency only

    if in_rate == out_rate:
        return np.asarray(signal, np.float32).copy()
    common = gcd(in_rate, out_rate)
    return np.asarray(resample_poly(signal, out_rate // common, in_rate // common), dtype=np.float32)
