"""The stateless stage: one dynamic-batching loop in front of a Triton model.

Per record: decode the Open Inference Protocol request, check it against the
model's metadata, check its deadline, and put it in the batcher. A released
batch becomes one gRPC call (inputs concatenated along the batch dimension);
up to ``max_inflight_batches`` calls run at once. The response is split back
per request and each result completes its outbox slot, which produces it in
arrival order and commits past it once the broker has it.

Failure policy:
- a bad request is dead-lettered at decode/validation, before it can spoil a batch;
- Triton unreachable or not ready (down, starting, shutting down) is an
  outage, not a bad request: the batch waits for the server with backoff,
  holding its in-flight slot, so the consumer pauses (bounded memory) and
  nothing is dead-lettered for it;
- a transient error from a live server (UNAVAILABLE, timeout) is retried with
  backoff up to ``retry.max_attempts``; then the batch's requests are
  dead-lettered with the reason;
- any other error for a batch of several requests is retried request by
  request, so only the request that causes it is dead-lettered.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.records import result_headers
from pipeline.contract.request import InferenceRequest, decode_request
from pipeline.contract.response import encode_response
from pipeline.contract.validation import validate_inputs, validate_outputs
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import OutRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import KafkaSettings, TritonSettings
from pipeline.triton.admin import ModelDescription, TritonAdmin
from workers.base import Record, StageIO, StreamStage
from workers.batching import Batch, DynamicBatcher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with full jitter (attempt counts from 1)."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * (2 ** (attempt - 1)))
        return random.uniform(cap / 2, cap)  # noqa: S311 - jitter, not security


@dataclass(frozen=True)
class StatelessSettings:
    model: str
    model_version: str = ""
    max_batch_size: int | None = None  # None: the model's own max_batch_size
    max_queue_delay_s: float = 0.005
    max_inflight_batches: int = 4
    default_deadline_ms: int | None = None
    default_priority: int | None = None
    default_timeout_ms: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_request_bytes: int = 16 * 1024 * 1024
    warmup: bool = False


@dataclass(eq=False)
class _Pending:
    record: Record
    slot: Slot[OutRecord]
    request: InferenceRequest
    rows: int
    enqueued: float


class _Outage(Exception):
    """Triton did not answer at all (connection refused, server down)."""


_TRANSIENT = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED", "StatusCode.RESOURCE_EXHAUSTED")
_OUTAGE_MARKERS = ("failed to connect", "connection refused", "socket closed", "connection reset", "connect failed")


class StatelessStage(StreamStage):
    """Dynamic batching into Triton for any stateless model."""

    def __init__(
        self,
        io: StageIO,
        settings: StatelessSettings,
        *,
        kafka: KafkaSettings,
        triton: TritonSettings,
        metrics: PipelineMetrics,
    ) -> None:
        super().__init__(io, kafka, metrics)
        self.settings = settings
        self.triton_settings = triton
        self.description: ModelDescription | None = None
        self._client: triton_aio.InferenceServerClient | None = None
        self._batcher: DynamicBatcher[_Pending] | None = None
        self._inflight = asyncio.Semaphore(settings.max_inflight_batches)
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ setup
    async def setup(self) -> None:
        with TritonAdmin(self.triton_settings) as admin:
            await asyncio.to_thread(admin.wait_ready, 120.0)
            self.description = await asyncio.to_thread(
                admin.describe, self.settings.model, self.settings.model_version
            )
        model_max = self.description.max_batch_size
        max_rows = self.settings.max_batch_size or model_max or 1
        if model_max and max_rows > model_max:
            raise BadRequest(
                ErrorClass.BATCH_TOO_LARGE,
                f"stage {self.io.stage}: max_batch_size {max_rows} exceeds the model's {model_max}",
            )
        self._batcher = DynamicBatcher(max_rows, self.settings.max_queue_delay_s)
        assert self.triton_settings.grpc_url
        self._client = triton_aio.InferenceServerClient(self.triton_settings.grpc_url)
        if self.settings.warmup:
            await self._warmup()
        log.info(
            "%s: model %s ready (max_batch_size=%d, batching up to %d rows, %.1f ms delay)",
            self.io.stage, self.settings.model, model_max, max_rows, self.settings.max_queue_delay_s * 1000,
        )

    async def _warmup(self) -> None:
        """One zero-filled request of fixed shapes, so the first real batch pays no lazy init."""
        assert self.description is not None and self._client is not None
        inputs = []
        for spec in self.description.inputs:
            if spec.optional or any(d < 0 for d in spec.shape) or spec.datatype == "BYTES":
                continue
            shape = ([1] if self.description.batching else []) + list(spec.shape)
            tensor = InferInput(spec.name, shape, spec.datatype)
            tensor.set_data_from_numpy(np.zeros(shape, dtype=_np_dtype(spec.datatype)))
            inputs.append(tensor)
        await self._client.infer(self.settings.model, inputs, model_version=self.settings.model_version)

    async def teardown(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.close()

    # ------------------------------------------------------------------ per record
    async def handle(self, record: Record, slot: Slot[OutRecord]) -> None:
        assert self.description is not None and self._batcher is not None
        try:
            request = decode_request(
                record.value, list(record.headers or ()), max_value_bytes=self.settings.max_request_bytes
            )
            self._check_model(request)
            validate_inputs(request, self.description.inputs, max_batch_size=self.description.max_batch_size)
            validate_outputs(request, self.description.outputs)
        except BadRequest as bad:
            self.dead_letter(record, slot, bad.error_class, bad.reason)
            return
        request = self._with_defaults(request, record)
        if _expired(request):
            self.dead_letter(record, slot, ErrorClass.DEADLINE_EXCEEDED, "deadline exceeded before batching")
            return
        rows = _rows(request, self.description)
        pending = _Pending(record, slot, request, rows, time.monotonic())
        for batch in self._batcher.add(self._batch_key(request), pending, rows):
            self._dispatch(batch)

    def _check_model(self, request: InferenceRequest) -> None:
        if request.model_name and request.model_name != self.settings.model:
            raise BadRequest(
                ErrorClass.UNKNOWN_MODEL,
                f"request names model {request.model_name!r}; stage {self.io.stage} serves {self.settings.model!r}",
            )
        pinned = self.settings.model_version
        if request.model_version and pinned and request.model_version != pinned:
            raise BadRequest(
                ErrorClass.MODEL_VERSION_MISMATCH,
                f"request asks version {request.model_version}; stage pins version {pinned}",
            )

    def _with_defaults(self, request: InferenceRequest, record: Record) -> InferenceRequest:
        """Apply the stage's default deadline (from the record's timestamp), priority and timeout."""
        s = self.settings
        changes: dict[str, Any] = {}
        if request.deadline_ms is None and s.default_deadline_ms is not None and record.timestamp > 0:
            changes["deadline_ms"] = record.timestamp + s.default_deadline_ms
        if request.priority is None and s.default_priority is not None:
            changes["priority"] = s.default_priority
        if request.timeout_us is None and s.default_timeout_ms is not None:
            changes["timeout_us"] = s.default_timeout_ms * 1000
        return replace(request, **changes) if changes else request

    def _batch_key(self, request: InferenceRequest) -> tuple[Any, ...]:
        tensors = tuple(
            (name, request.datatypes[name], array.shape[1:] if self.description and self.description.batching else array.shape)
            for name, array in request.inputs.items()
        )
        return (
            request.model_version or self.settings.model_version,
            tensors,
            request.requested_outputs,
            request.priority or 0,
            request.timeout_us or 0,
        )

    # ------------------------------------------------------------------ batches
    async def tick(self) -> None:
        assert self._batcher is not None
        for batch in self._batcher.due():
            self._dispatch(batch)

    def next_tick_s(self) -> float:
        if self._batcher is None:
            return 0.05
        due = self._batcher.next_due()
        if due is None:
            return 0.05
        return max(0.0, min(0.05, due - time.monotonic()))

    async def release(self, partitions: list[Any] | None = None) -> None:
        if self._batcher is None:
            return
        for batch in self._batcher.drain():
            self._dispatch(batch)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.io.drain_timeout_s)

    def _dispatch(self, batch: Batch[_Pending]) -> None:
        task = asyncio.create_task(self._run_batch(batch.items), name=f"{self.io.stage}-batch")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_batch(self, items: list[_Pending]) -> None:
        async with self._inflight:
            gauge = self.metrics.inflight_batches.labels(self.io.stage)
            gauge.inc()
            try:
                await self._infer_with_retries(items)
            except Exception as exc:  # noqa: BLE001 - never lose a slot to a bug
                log.exception("%s: batch failed unexpectedly", self.io.stage)
                for item in items:
                    self._fail(item, ErrorClass.INFERENCE_FAILED, f"internal error: {exc!r}")
            finally:
                gauge.dec()

    async def _infer_with_retries(self, items: list[_Pending]) -> None:
        retry = self.settings.retry
        attempt = 0
        outage = 0
        while True:
            items = self._drop_expired(items)
            if not items:
                return
            try:
                await self._infer(items)
                return
            except _Outage as exc:
                outage += 1  # server down: wait for it, do not burn the requests' attempts
                self.metrics.triton_retries.labels(self.io.stage).inc()
                if outage == 1 or outage % 20 == 0:
                    log.warning("%s: Triton unreachable (%s); waiting", self.io.stage, exc)
                await asyncio.sleep(retry.backoff(min(outage, 10)))
            except InferenceServerException as exc:
                status = str(exc.status() or "")
                if status in _TRANSIENT:
                    attempt += 1
                    if attempt >= retry.max_attempts:
                        for item in items:
                            self._fail(item, _error_class(exc), f"gave up after {attempt} attempts: {_message(exc)}")
                        return
                    self.metrics.triton_retries.labels(self.io.stage).inc()
                    await asyncio.sleep(retry.backoff(attempt))
                elif len(items) > 1:
                    # Find the culprit: each request alone (they may still succeed).
                    await asyncio.gather(*(self._infer_with_retries([i]) for i in items))
                    return
                else:
                    self._fail(items[0], _error_class(exc), _message(exc))
                    return

    async def _infer(self, items: list[_Pending]) -> None:
        assert self._client is not None and self.description is not None
        first = items[0].request
        now = time.monotonic()
        for item in items:
            self.metrics.queue_delay.labels(self.io.stage).observe(now - item.enqueued)
        inputs = []
        for name, datatype in first.datatypes.items():
            arrays = [item.request.inputs[name] for item in items]
            data = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
            tensor = InferInput(name, list(data.shape), datatype)
            tensor.set_data_from_numpy(data)
            inputs.append(tensor)
        output_names = list(first.requested_outputs) or [o.name for o in self.description.outputs]
        outputs = [InferRequestedOutput(name) for name in output_names]
        rows = sum(item.rows for item in items)
        self.metrics.batch_size.labels(self.io.stage).observe(rows)
        started = time.perf_counter()
        try:
            response = await self._client.infer(
                self.settings.model,
                inputs,
                model_version=first.model_version or self.settings.model_version,
                outputs=outputs,
                priority=first.priority or 0,
                timeout=first.timeout_us,
                client_timeout=_client_timeout(first),
            )
        except InferenceServerException as exc:
            if _is_outage(exc) or not await self._server_ready():
                # Unreachable, starting or shutting down: the server's problem, not the request's.
                raise _Outage(_message(exc)) from exc
            raise
        self.metrics.triton_latency.labels(self.io.stage, self.settings.model).observe(time.perf_counter() - started)
        result = response.get_response()
        arrays = {name: response.as_numpy(name) for name in output_names}
        offset = 0
        for item in items:
            if self.description.batching:
                part = {n: a[offset : offset + item.rows] for n, a in arrays.items()}
            else:
                part = arrays
            offset += item.rows
            self._succeed(item, part, result.model_name, result.model_version)

    async def _server_ready(self) -> bool:
        assert self._client is not None
        try:
            return bool(await self._client.is_server_ready(client_timeout=2.0))
        except InferenceServerException:
            return False

    def _succeed(self, item: _Pending, outputs: dict[str, np.ndarray], model: str, version: str) -> None:
        try:
            value, content_type = encode_response(item.request, outputs, model_name=model, model_version=version)
        except BadRequest as bad:
            self._fail(item, bad.error_class, bad.reason)
            return
        headers = result_headers(
            list(item.record.headers or ()),
            correlation_id=item.request.correlation_id,
            stage=self.io.stage,
            model_name=model,
            model_version=version,
            content_type=content_type,
        )
        self.outbox.complete(
            item.slot,
            OutRecord(
                topic=self.io.output_topic,
                key=item.record.key,
                value=value,
                headers=headers,
                request_timestamp_ms=item.record.timestamp,
            ),
        )

    def _fail(self, item: _Pending, error_class: ErrorClass, reason: str) -> None:
        self.dead_letter(item.record, item.slot, error_class, reason)

    def _drop_expired(self, items: list[_Pending]) -> list[_Pending]:
        """Dead-letter requests whose deadline passed while they waited; keep the rest."""
        live = []
        for item in items:
            if _expired(item.request):
                self._fail(item, ErrorClass.DEADLINE_EXCEEDED, "deadline exceeded while queued")
            else:
                live.append(item)
        return live


def _rows(request: InferenceRequest, description: ModelDescription) -> int:
    if not description.batching or not request.inputs:
        return 1
    return int(next(iter(request.inputs.values())).shape[0])


def _expired(request: InferenceRequest) -> bool:
    return request.deadline_ms is not None and time.time() * 1000 >= request.deadline_ms


def _client_timeout(request: InferenceRequest) -> float | None:
    if request.deadline_ms is None:
        return None
    return max(0.001, request.deadline_ms / 1000 - time.time())


def _message(exc: InferenceServerException) -> str:
    return " ".join(str(exc.message() or exc).split())


def _is_outage(exc: InferenceServerException) -> bool:
    text = _message(exc).lower()
    return str(exc.status()) == "StatusCode.UNAVAILABLE" and any(m in text for m in _OUTAGE_MARKERS)


def _error_class(exc: InferenceServerException) -> ErrorClass:
    text = _message(exc).lower()
    if "unknown model" in text or "not found" in text:
        return ErrorClass.UNKNOWN_MODEL
    if "unavailable" in text or "not ready" in text:
        return ErrorClass.MODEL_UNAVAILABLE
    if str(exc.status()) == "StatusCode.DEADLINE_EXCEEDED" or "timeout" in text:
        return ErrorClass.DEADLINE_EXCEEDED
    return ErrorClass.INFERENCE_FAILED


def _np_dtype(datatype: str) -> np.dtype[Any]:
    from tritonclient.utils import triton_to_np_dtype

    return np.dtype(triton_to_np_dtype(datatype))
