"""The DALI preprocessing stage: audio chunks to 16 kHz mono float32, batched across records.

A batching backend like a Triton model, so it runs in the same batching loop
(:class:`workers.stateless.stage.BatchingStage`): records of many streams are decoded,
downmixed and resampled in one DALI pipeline run. DALI runs on one dedicated
worker thread, off the event loop, on the GPU when there is one (chosen at
start-up, logged, and exported as ``pipeline_stage_device_info``).

A chunk is either a WAV file (a BYTES tensor holding the file) or raw PCM (an
INT16 or FP32 tensor, ``[samples]``, ``[1, samples]`` or ``[samples, channels]``)
with a ``sample_rate`` request parameter. Bad audio is refused in :meth:`check`,
before it can fail a batch; it goes to the dead-letter topic with the reason.

Run timeout (``run_timeout_s``): DALI offers no way to interrupt a run, so a run
past its bound is *abandoned*: its thread is a daemon (it can never hold up the
process's exit) and keeps whatever it is stuck in, while a fresh thread with a
fresh pipeline serves every later run. The timed-out batch fails like any DALI
error on valid input (permanent: the batch is split to find the chunk that
causes it, which is then dead-lettered as ``inference-failed``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import queue
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from pipeline.audio import AudioInput, AudioLimits
from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.request import InferenceRequest
from pipeline.failure_policy import Failure, FailureKind
from pipeline.observability.tracing import CallSpan
from workers.stateless.backend import BatchOutput

if TYPE_CHECKING:
    from pipeline.audio.dali_preprocess import AudioPreprocessor

log = logging.getLogger(__name__)

SAMPLE_RATE_PARAMETER = "sample_rate"
R = TypeVar("R")


class DaliRunTimeout(Exception):
    """A DALI run did not finish within ``run_timeout_s`` (its thread was abandoned)."""


class _DaliThread:
    """One daemon thread running submitted calls in order (the DALI pipeline is built and
    used on it). Daemon, unlike a ``ThreadPoolExecutor``'s workers, which the interpreter
    joins at exit: a run stuck forever must not turn SIGTERM into a hang."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None]
        self._calls = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="dali", daemon=True).start()

    def _serve(self) -> None:
        while (job := self._calls.get()) is not None:
            call, future = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                    future.set_exception(exc)

    def submit(self, call: Callable[[], R]) -> asyncio.Future[R]:
        future: concurrent.futures.Future[R] = concurrent.futures.Future()
        self._calls.put((call, future))
        return asyncio.wrap_future(future)

    def stop(self) -> None:
        """Let the thread end after the call it runs (if it ever returns)."""
        self._calls.put(None)


@dataclasses.dataclass(frozen=True)
class DaliSettings:
    """A DALI stage's plain settings (the topology's ``kind: dali`` stage, see DaliStageConfig)."""

    input_tensor: str = "audio"
    """Request tensor with the chunk: BYTES (a WAV file) or INT16/FP32 PCM with ``sample_rate``."""
    output_tensor: str = "audio"
    sample_rate: int = 16_000
    """The rate every chunk is resampled to (the model's)."""
    device: Literal["auto", "cpu", "gpu"] = "auto"
    max_batch_size: int = 64
    """Chunks of many streams in one DALI run."""
    max_chunk_seconds: float = 10.0
    run_timeout_s: float = 30.0
    """A run that takes longer is abandoned with its thread (DALI cannot be interrupted)."""


class DaliAudioBackend:
    """Serve batches of audio chunks with one DALI pipeline."""

    name = "dali"

    def __init__(self, settings: DaliSettings | None = None) -> None:
        settings = settings or DaliSettings()
        self.input_tensor = settings.input_tensor
        self.output_tensor = settings.output_tensor
        self.target_rate = settings.sample_rate
        self.requested_device = settings.device
        self.max_batch_size = settings.max_batch_size
        self.limits = AudioLimits(max_seconds=settings.max_chunk_seconds)
        self.run_timeout_s = settings.run_timeout_s
        self.device: str | None = None  # known after setup()
        self._preprocessor: AudioPreprocessor | None = None
        self._thread = _DaliThread()
        self._one_run = asyncio.Lock()  # runs are serial; waiting for the lock is not run time
        self.abandoned_runs = 0

    @property
    def call_span(self) -> CallSpan:
        """A DALI run is local work (INTERNAL), on the device chosen at setup."""
        return CallSpan("dali preprocess", remote=False, attributes={"dali.device": self.device or ""})

    # ------------------------------------------------------------------ lifecycle
    async def setup(self) -> int:
        self._preprocessor = await self._thread.submit(self._build)
        self.device = self._preprocessor.device
        log.info("DALI audio preprocessing on the %s (batches up to %d)", self._preprocessor.device.upper(), self.max_batch_size)
        return self.max_batch_size

    def _build(self) -> AudioPreprocessor:
        from pipeline.audio.dali_preprocess import AudioPreprocessor

        return AudioPreprocessor(
            target_rate=self.target_rate, device=self.requested_device, max_batch_size=self.max_batch_size
        )

    async def close(self) -> None:
        self._thread.stop()

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
        inputs = [p for p in prepared if isinstance(p, AudioInput)]
        async with self._one_run:
            try:
                preprocessor = self._preprocessor
                if preprocessor is None:  # the previous thread was abandoned
                    preprocessor = await asyncio.wait_for(self._thread.submit(self._build), self.run_timeout_s)
                    self._preprocessor = preprocessor
                samples = await asyncio.wait_for(
                    self._thread.submit(functools.partial(preprocessor.process, inputs)), timeout=self.run_timeout_s
                )
            except asyncio.TimeoutError:
                self._abandon_thread()
                raise DaliRunTimeout(f"DALI run of {len(inputs)} chunks took over {self.run_timeout_s:g}s") from None
        return BatchOutput(
            [{self.output_tensor: s[None, :]} for s in samples], model_name="dali", model_version=self.device or ""
        )

    def _abandon_thread(self) -> None:
        """Leave the stuck thread (and its pipeline) behind; the next run builds a fresh pair."""
        self.abandoned_runs += 1
        log.error("DALI run exceeded %.1fs; abandoning its thread (%d so far)", self.run_timeout_s, self.abandoned_runs)
        self._thread.stop()
        self._thread = _DaliThread()
        self._preprocessor = None

    async def classify(self, exc: BaseException) -> Failure:
        if isinstance(exc, BadRequest):  # AudioError is a BadRequest
            return Failure(FailureKind.PERMANENT, exc.error_class, exc.reason)
        # A DALI failure on valid input: splitting the batch finds the chunk that causes it.
        return Failure(FailureKind.PERMANENT, ErrorClass.INFERENCE_FAILED, f"{type(exc).__name__}: {exc}")

