"""Batched audio preprocessing on DALI: many chunks, of many streams, in one pipeline run.

Every chunk becomes 16 kHz (``target_rate``) mono float32 in [-1, 1]. The DALI
graph, built once per :class:`AudioPreprocessor` and fed through
``external_source``::

    canonical WAV bytes --decoders.audio(downmix)--> mono float32 at the chunk's rate
        [--.gpu()-->]                                  (GPU: everything after the decoder)
        --clamp(-1, 1)-->                               float input may exceed full scale
        --filter(anti-alias FIR, per chunk)-->          low-pass to target_rate / 2
        --audio_resample(in_rate=decoded rate)-->       target_rate
        --clamp(-1, 1)-->                               output (resampling can overshoot)

Why this shape:

- *One decode path.* Raw PCM tensors are wrapped in a 44-byte WAV header
  (:class:`~pipeline.audio.inputs.AudioInput` does it once, when the message is
  decoded), so WAV files and tensors of any format, rate and channel count share
  one batch and one run; libsndfile inside DALI converts the samples (8/16/24/32-bit
  integers, 32-bit float) and downmixes. It only ever reads headers we wrote, so
  no odd file can fail a batch.
- *Anti-aliasing.* DALI's resampler interpolates with a sinc at the *input*
  Nyquist frequency and does not low-pass when downsampling (see
  :mod:`pipeline.audio.resample`); ``fn.filter`` with a per-chunk kernel from
  :func:`~pipeline.audio.resample.antialias_kernel` does. For chunks at or below
  ``target_rate`` the kernel is ``[1]``.
- *Same graph on both devices.* The decoder has only a CPU implementation; the
  clamps, the filter and the resampler have GPU ones, and take the stage's data
  after one ``.gpu()``. The CPU tests therefore run the very operators the GPU
  path uses.

Streams: chunks are resampled independently, each from its own first sample,
with zeros beyond its edges. Timing is exact only when a chunk's length maps to
a whole number of output samples (a multiple of ``rate / gcd(rate, target_rate)``
samples: 441 at 22.05 or 44.1 kHz, 3 at 48 kHz, any length at 8 or 16 kHz);
otherwise every chunk rounds its length up (``ceil``) and the stream drifts
(706-sample chunks at 22.05 kHz: +0.71 sample per chunk, about 83 ms a minute).
Even aligned, the kernel's half-width at each chunk edge (16 input samples)
differs from resampling the stream whole (about 40 dB SNR for 20 ms chunks of
speech). Exact streaming resampling needs carry-over, like framing; clients that
send 16 kHz avoid the question (pass-through is exact).

Threading: a DALI pipeline is not re-entrant. One preprocessor owns one
pipeline; the stage calls :meth:`AudioPreprocessor.process` from its single
worker thread (off the asyncio loop). A lock makes accidental concurrent calls
wait instead of corrupting the pipeline's buffers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from pipeline.audio.device import Device, DeviceRequest, resolve_device
from pipeline.audio.inputs import AudioInput
from pipeline.audio.resample import antialias_kernel, lobes_for_quality
from pipeline.extras import DALI, require

if TYPE_CHECKING:
    from nvidia.dali.pipeline import Pipeline

log = logging.getLogger(__name__)

_ENCODED = "encoded"
_KERNEL = "antialias_kernel"


class PreprocessingFailed(RuntimeError):
    """DALI failed a run of valid inputs (a bug, not bad audio); the pipeline has been rebuilt."""


class AudioPreprocessor:
    """Decode, downmix, anti-alias and resample batches of :class:`AudioInput` with DALI.

    ``device``: ``"auto"`` (the GPU when DALI sees one), ``"cpu"`` or ``"gpu"``;
    resolved here, at construction, and exposed as :attr:`device` for logs and
    metric labels. ``quality`` is DALI's resampling quality (50: 16 sinc lobes).
    """

    def __init__(
        self,
        target_rate: int = 16_000,
        device: DeviceRequest = "auto",
        max_batch_size: int = 64,
        num_threads: int = 2,
        *,
        quality: float = 50.0,
        antialias: bool = True,
    ) -> None:
        if target_rate <= 0:
            raise ValueError(f"target_rate must be positive, not {target_rate}")
        if max_batch_size < 1 or num_threads < 1:
            raise ValueError("max_batch_size and num_threads must be at least 1")
        lobes_for_quality(quality)  # validates the range
        require("DALI audio preprocessing", DALI)  # one line naming the `audio` extra, not an ImportError
        self.target_rate = int(target_rate)
        self.max_batch_size = int(max_batch_size)
        self.num_threads = int(num_threads)
        self.quality = float(quality)
        self.antialias = antialias
        self._device: Device = resolve_device(device)
        self._lock = threading.Lock()
        self._pipe = self._build()
        log.info(
            "audio preprocessing on DALI %s, device=%s: -> %d Hz mono, max batch %d, "
            "%d threads, quality %g, anti-aliasing %s",
            _dali_version(),
            self._device,
            self.target_rate,
            self.max_batch_size,
            self.num_threads,
            self.quality,
            "on" if antialias else "off",
        )

    @property
    def device(self) -> Device:
        """``"gpu"`` or ``"cpu"``: where the pipeline runs (fixed at construction)."""
        return self._device

    def process(self, batch: Sequence[AudioInput]) -> list[np.ndarray]:
        """One DALI run for the whole batch; 1-D float32 arrays at ``target_rate``, in batch order.

        The arrays are the caller's own (copied out of DALI's buffers, which the
        next run reuses). Output ``i`` has ``ceil(frames_i * target_rate / rate_i)`` samples.
        """
        if not batch:
            return []
        if len(batch) > self.max_batch_size:
            raise ValueError(f"batch of {len(batch)} exceeds max_batch_size={self.max_batch_size}")
        for index, item in enumerate(batch):
            if not isinstance(item, AudioInput):
                raise TypeError(f"batch item {index} is {type(item).__name__}, not AudioInput")
        encoded = [np.frombuffer(item.canonical_wav, np.uint8) for item in batch]
        kernels = [
            antialias_kernel(item.info.sample_rate, self.target_rate)[None, :]
            for item in batch
            if self.antialias
        ]
        with self._lock:
            try:
                self._pipe.feed_input(_ENCODED, encoded)
                if self.antialias:
                    self._pipe.feed_input(_KERNEL, kernels)
                (out,) = self._pipe.run()
                if self._device == "gpu":
                    out = out.as_cpu()
                return [np.array(out[i], dtype=np.float32, copy=True) for i in range(len(batch))]
            except Exception as exc:
                # A DALI pipeline that failed a run cannot run again: replace it, then report.
                self._pipe = self._build()
                raise PreprocessingFailed(f"DALI failed a batch of {len(batch)}: {exc}") from exc

    def _build(self) -> Pipeline:
        return build_pipeline(
            device=self._device, max_batch_size=self.max_batch_size, num_threads=self.num_threads,
            target_rate=self.target_rate, quality=self.quality, antialias=self.antialias,
        )


def build_pipeline(
    *,
    device: Device,
    target_rate: int,
    quality: float,
    antialias: bool,
    max_batch_size: int,
    num_threads: int,
) -> Pipeline:
    """The DALI graph of this module's docstring, built and ready to feed.

    Inputs: ``encoded`` (uint8 WAV bytes, one per chunk) and, with ``antialias``,
    ``antialias_kernel`` (float32 ``[1, taps]`` per chunk). Output: the samples.
    """
    from nvidia.dali import fn, types
    from nvidia.dali import math as dmath
    from nvidia.dali.pipeline import Pipeline

    on_gpu = device == "gpu"
    pipe = Pipeline(
        batch_size=max_batch_size,
        num_threads=num_threads,
        device_id=0 if on_gpu else None,
        prefetch_queue_depth=1,  # fed and run synchronously, one batch at a time
    )
    with pipe:
        encoded = fn.external_source(name=_ENCODED, dtype=types.DALIDataType.UINT8, ndim=1)
        audio, rate = fn.decoders.audio(encoded, dtype=types.DALIDataType.FLOAT, downmix=True)
        if on_gpu:
            audio = audio.gpu()
        # Integer formats are in [-1, 1) already; a float sample of 1e30 would otherwise ring
        # through a whole neighbourhood of the chunk. Clipped, it is one loud sample.
        audio = dmath.clamp(audio, -1.0, 1.0)
        if antialias:
            kernel = fn.external_source(name=_KERNEL, dtype=types.DALIDataType.FLOAT, ndim=2)
            if on_gpu:
                kernel = kernel.gpu()
            # fn.filter works on 2-D "images": view the signal as one row, filter, flatten back.
            row = fn.reshape(fn.expand_dims(audio, axes=[0]), layout="HW")
            audio = fn.squeeze(fn.filter(row, kernel, border="constant", mode="same"), axes=[0])
        audio = fn.audio_resample(audio, in_rate=rate, out_rate=float(target_rate), quality=quality)
        pipe.set_outputs(dmath.clamp(audio, -1.0, 1.0))
    pipe.build()
    return pipe


def _dali_version() -> str:
    try:
        import nvidia.dali

        return str(nvidia.dali.__version__)
    except Exception:  # noqa: BLE001 - only for the log line
        return "?"
