"""The resampling math, in numpy: DALI's windowed-sinc kernel, and the anti-aliasing prefilter.

What DALI's ``fn.audio_resample`` computes (DALI 2.x, ``dali/kernels/signal/
resampling*.{h,cc}``; :func:`sinc_resample` ports it and matches its output to
about 2e-7):

- output sample ``n`` sits at input position ``p = n * in_rate / out_rate``
  (sample 0 on sample 0), and the output length is ``ceil(n_in * out_rate / in_rate)``;
- ``y[n] = sum(x[i] * w(i - p))`` over the ``2 * lobes`` inputs ``ceil(p) - lobes
  <= i < ceil(p) + lobes`` that exist (zeros beyond the edges), where ``w`` is a
  sinc with zeros on the *input* sample grid times a Hann window spanning
  ``lobes`` zero crossings each side;
- ``lobes = round(0.007 q^2 - 0.09 q + 3)`` for ``quality = q`` (50 gives 16);
  ``w`` is read from a table of ``64 * lobes + 1`` points with linear
  interpolation; positions advance in float32 inside blocks of 256 outputs, each
  block restarting from a float64 position (the port keeps all of this, which is
  why it matches to rounding);
- channels are resampled independently; equal rates still run the kernel
  (``w`` is 1 at 0 and about 1e-8 at other integers, so it is a near-exact copy).

What it does **not** do: low-pass to the *output* Nyquist frequency when
downsampling. The sinc's zeros sit on the input grid, so its cutoff is the input
Nyquist frequency, and content between the two folds back: a 12 kHz tone at
44.1 kHz comes out as a full-amplitude 4 kHz tone at 16 kHz. The DALI stage
therefore low-passes first (``fn.filter`` with :func:`antialias_kernel`, a
Kaiser-windowed sinc: flat to 0.45 x out_rate, 60 dB down from 0.55 x out_rate,
so the band below 0.45 x out_rate (7.2 kHz at 16 kHz) is alias-free).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

_LOOKUP_PER_LOBE = 64
_BLOCK = 256  # DALI's CPU kernel restarts the float32 position every 256 outputs


def lobes_for_quality(quality: float) -> int:
    """DALI's ``ResamplingParams::FromQuality``: 0 -> 3 lobes, 50 -> 16, 100 -> 64."""
    if not 0.0 <= quality <= 100.0:
        raise ValueError(f"quality must be in [0, 100], not {quality}")
    return int(np.round(0.007 * quality * quality - 0.09 * quality + 3))


def resampled_length(n_in: int, in_rate: float, out_rate: float) -> int:
    """DALI's output length: ``ceil(n_in * out_rate / in_rate)`` in float64."""
    return math.ceil(n_in * float(out_rate) / float(in_rate))


@lru_cache(maxsize=8)
def _window_table(lobes: int) -> tuple[np.ndarray, np.float32, np.float32]:
    """DALI's ``windowed_sinc`` lookup table: (table, center, scale), all float32 as in C++."""
    coeffs = lobes * _LOOKUP_PER_LOBE + 1
    scale = np.float32(2.0 * lobes / (coeffs - 1))
    scale_envelope = np.float32(2.0 / coeffs)
    center = (coeffs - 1) // 2
    offsets = (np.arange(coeffs) - center).astype(np.float32)
    x = np.pi * (offsets * scale).astype(np.float64)
    sinc = np.divide(np.sin(x), x, out=np.ones_like(x), where=x != 0)
    hann = 0.5 * (1.0 + np.cos(np.pi * (offsets * scale_envelope).astype(np.float64)))
    table = np.zeros(coeffs + 5, np.float32)  # a leading zero, then zeros past the end
    table[1 : coeffs + 1] = (sinc * hann).astype(np.float32)
    table.setflags(write=False)
    return table, np.float32(center + 1), np.float32(1.0 / scale)


def sinc_resample(
    signal: np.ndarray, in_rate: float, out_rate: float, quality: float = 50.0
) -> np.ndarray:
    """Resample a mono float32 signal exactly as DALI's CPU ``audio_resample`` does."""
    x = np.asarray(signal, np.float32)
    if x.ndim != 1:
        raise ValueError("sinc_resample takes a 1-D (mono) signal")
    lobes = lobes_for_quality(quality)
    table, center, window_scale = _window_table(lobes)
    n_in = len(x)
    n_out = resampled_length(n_in, in_rate, out_rate)
    step = float(in_rate) / float(out_rate)
    out = np.empty(n_out, np.float32)
    taps = np.arange(2 * lobes)
    for block_start in range(0, n_out, _BLOCK):
        count = min(_BLOCK, n_out - block_start)
        start = block_start * step
        base = math.floor(start)
        increments = np.full(count, np.float32(step), np.float32)
        increments[0] = np.float32(start - base)
        positions = np.cumsum(increments, dtype=np.float32)  # sequential float32 adds, as in C++
        first = np.ceil(positions).astype(np.int64) - lobes
        index = first[:, None] + taps[None, :]  # relative to `base`
        valid = (index + base >= 0) & (index + base < n_in)
        distance = index.astype(np.float32) - positions[:, None]
        fi = distance * window_scale + center
        cell = np.floor(fi)
        frac = fi - cell
        cell = cell.astype(np.int64)
        weight = table[cell] + frac * (table[cell + 1] - table[cell])
        gathered = x[np.clip(index + base, 0, max(n_in - 1, 0))]
        out[block_start : block_start + count] = np.where(valid, weight * gathered, 0).sum(
            axis=1, dtype=np.float32
        )
    return out


# --------------------------------------------------------------------------- anti-aliasing
#: The transition band of the prefilter, as fractions of the output rate.
PASSBAND_EDGE = 0.45
STOPBAND_EDGE = 0.55
STOPBAND_ATTENUATION_DB = 60.0


@lru_cache(maxsize=64)
def antialias_kernel(in_rate: int, out_rate: int) -> np.ndarray:
    """Low-pass FIR (odd length, float32, unit DC gain) to run before downsampling.

    A Kaiser-windowed sinc with its cutoff at ``out_rate / 2`` (Kaiser's formulas
    for the length and beta). When ``in_rate <= out_rate`` nothing can alias and
    the kernel is ``[1.0]``, so upsampling and pass-through stay exact.
    The length grows with ``in_rate / out_rate``: 51 taps at 22.05 kHz, 101 at
    44.1 kHz, 111 at 48 kHz, 437 at 192 kHz (for a 16 kHz output).
    """
    if in_rate <= out_rate:
        return _readonly(np.ones(1, np.float32))
    attenuation = STOPBAND_ATTENUATION_DB
    beta = 0.1102 * (attenuation - 8.7)
    width = 2.0 * np.pi * (STOPBAND_EDGE - PASSBAND_EDGE) * out_rate / in_rate  # rad/sample
    taps = math.ceil((attenuation - 7.95) / (2.285 * width)) + 1
    taps += 1 - taps % 2  # odd: centred on a sample, so no delay
    cutoff = 0.5 * out_rate / in_rate  # cycles/sample
    n = np.arange(taps) - (taps - 1) / 2
    kernel = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(taps, beta)
    return _readonly((kernel / kernel.sum()).astype(np.float32))


def apply_fir(signal: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """``same``-size filtering with zeros beyond the edges (``fn.filter(border="constant")``).

    Computed in float64, so it is an independent check of DALI's float32 filter.
    """
    if len(kernel) == 1:
        return np.asarray(signal, np.float32) * np.float32(kernel[0])
    # DALI correlates (no flip); the kernel is symmetric, so convolution is the same thing.
    full = np.convolve(np.asarray(signal, np.float64), kernel.astype(np.float64), mode="full")
    half = (len(kernel) - 1) // 2
    return full[half : half + len(signal)].astype(np.float32)


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array
