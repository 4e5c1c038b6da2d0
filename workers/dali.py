"""The DALI preprocessing stage: audio chunks to 16 kHz mono float32, batched across records.

A batching backend like a Triton model, so it runs in the same batching loop
(:class:`workers.stateless.BatchingStage`): records of many streams are decoded,
downmixed and resampled in one DALI pipeline run. DALI runs on one dedicated
worker thread, off the event loop, on the GPU when there is one (chosen at
start-up, logged, and exported as ``pipeline_stage_device_info``).

A chunk is either a WAV file (a BYTES tensor holding the file) or raw PCM (an
INT16 or FP32 tensor, ``[samples]``, ``[1, samples]`` or ``[samples, channels]``)
with a ``sample_rate`` request parameter. Bad audio is refused in :meth:`check`,
before it can fail a batch; it goes to the dead-letter topic with the reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Literal

import numpy as np

from pipeline.audio import AudioInput, AudioLimits
from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.request import InferenceRequest
from pipeline.failure_policy import Failure, FailureKind
from workers.backend import BatchOutput

if TYPE_CHECKING:
    from pipeline.audio.dali_preprocess import AudioPreprocessor

log = logging.getLogger(__name__)

SAMPLE_RATE_PARAMETER = "sample_rate"


class DaliAudioBackend:
    """Serve batches of audio chunks with one DALI pipeline."""

    name = "dali"

    def __init__(
        self,
        *,
        input_tensor: str = "audio",
        output_tensor: str = "audio",
        target_rate: int = 16_000,
        device: Literal["auto", "cpu", "gpu"] = "auto",
        max_batch_size: int = 64,
        max_chunk_seconds: float = 10.0,
    ) -> None:
        self.input_tensor = input_tensor
        self.output_tensor = output_tensor
        self.target_rate = target_rate
        self.requested_device = device
        self.max_batch_size = max_batch_size
        self.limits = AudioLimits(max_seconds=max_chunk_seconds)
        self.device: str | None = None  # known after setup()
        self._preprocessor: AudioPreprocessor | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dali")

    # ------------------------------------------------------------------ lifecycle
    async def setup(self) -> int:
        from pipeline.audio.dali_preprocess import AudioPreprocessor

        loop = asyncio.get_running_loop()
        self._preprocessor = await loop.run_in_executor(
            self._thread,
            lambda: AudioPreprocessor(
                target_rate=self.target_rate, device=self.requested_device, max_batch_size=self.max_batch_size
            ),
        )
        self.device = self._preprocessor.device
        log.info("DALI audio preprocessing on the %s (batches up to %d)", self._preprocessor.device.upper(), self.max_batch_size)
        return self.max_batch_size

    async def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)

    async def warmup(self) -> None:
        silence = AudioInput(pcm=np.zeros(self.target_rate // 100, np.float32), sample_rate=self.target_rate)
        await self.run([], [silence])

    # ------------------------------------------------------------------ requests
    def check(self, request: InferenceRequest) -> AudioInput:
        """Validate the chunk now, so one bad chunk never fails a batch."""
        tensor = request.inputs.get(self.input_tensor)
        if tensor is None:
            raise BadRequest(ErrorClass.MISSING_INPUT, f"chunk has no {self.input_tensor!r} tensor")
        datatype = request.datatypes[self.input_tensor]
        if datatype == "BYTES":
            if tensor.size != 1:
                raise BadRequest(ErrorClass.SHAPE_MISMATCH, "a WAV chunk is one BYTES element holding the file")
            return AudioInput(wav=bytes(tensor.reshape(-1)[0]), limits=self.limits)
        if datatype not in ("INT16", "FP32"):
            raise BadRequest(ErrorClass.DATATYPE_MISMATCH, f"PCM must be INT16 or FP32, not {datatype}")
        rate = request.parameters.get(SAMPLE_RATE_PARAMETER)
        if isinstance(rate, bool) or not isinstance(rate, int):
            raise BadRequest(ErrorClass.MALFORMED_REQUEST, f"raw PCM needs an integer {SAMPLE_RATE_PARAMETER!r} parameter")
        pcm = tensor[0] if tensor.ndim == 2 and tensor.shape[0] == 1 else tensor
        return AudioInput(pcm=np.ascontiguousarray(pcm), sample_rate=rate, limits=self.limits)

    def rows(self, request: InferenceRequest) -> int:
        return 1

    def batch_key(self, request: InferenceRequest) -> Hashable:
        return "audio"  # DALI takes chunks of any length and rate in one run

    async def run(self, requests: Sequence[InferenceRequest], prepared: Sequence[object]) -> BatchOutput:
        assert self._preprocessor is not None
        inputs = [p for p in prepared if isinstance(p, AudioInput)]
        loop = asyncio.get_running_loop()
        samples = await loop.run_in_executor(self._thread, self._preprocessor.process, inputs)
        return BatchOutput(
            [{self.output_tensor: s[None, :]} for s in samples], model_name="dali", model_version=self.device or ""
        )

    async def classify(self, exc: BaseException) -> Failure:
        if isinstance(exc, BadRequest):  # AudioError is a BadRequest
            return Failure(FailureKind.PERMANENT, exc.error_class, exc.reason)
        # A DALI failure on valid input: splitting the batch finds the chunk that causes it.
        return Failure(FailureKind.PERMANENT, ErrorClass.INFERENCE_FAILED, f"{type(exc).__name__}: {exc}")

