"""A stateless Triton model as a batching backend: one batched gRPC call per batch.

Requests are checked against the model's metadata (names, datatypes,
per-row shapes, max batch size) before they are batched, and grouped by
everything that must be equal inside one call (version, tensor shapes after
the batch dimension, requested outputs, priority, timeout), so no padding is
ever added and no batch mixes shapes.

Live model management (Triton in explicit model-control mode), as observed on
Triton 2.51 with the default version policy (``latest { num_versions: 1 }``):

- ``load`` of a model whose repository now holds version 2: v1 keeps serving
  while v2 is LOADING, requests switch to v2 the moment it is READY, then v1 is
  UNLOADING (its in-flight requests finish) and ends ``UNAVAILABLE: unloaded``.
  No request fails at any point. With ``--strict-readiness`` the *server*
  reports not-ready while any version is LOADING or UNLOADING, although the
  model serves throughout. The same holds when the pushed copy holds only ``2/``.
- a response naming a version other than the last one seen makes the backend
  describe the model again, in a task off the event loop, and swap the
  description when that returns (batches in flight keep the one they started
  with); the switch is logged ("model X: now serving version 2").
- ``unload``: requests fail at once with ``NOT_FOUND: Request for unknown model:
  'X' has no available versions`` (a pinned version: ``UNAVAILABLE: ... version
  1 is not at ready state``), also while the model is still UNLOADING. Whatever
  the index says (UNLOADING, or settled ``UNAVAILABLE: unloaded``), that is an
  *outage* of the stage (pipeline/triton/failures.py says why): the batch waits,
  consumption pauses, readiness goes off; nothing is dead-lettered.
- ``load`` after an unload: requests fail "no available versions" while Triton
  fetches the model from the store and while it is LOADING (outage: they keep
  waiting), and succeed once it is READY. A failure whose index read already says
  READY lost that race and is retried (transient).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Sequence

import numpy as np
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import triton_to_np_dtype

from pipeline.contract.request import InferenceRequest
from pipeline.contract.validation import AcceptedLayouts, validate_inputs, validate_model, validate_outputs
from pipeline.failure_policy import Failure
from pipeline.observability.tracing import CallSpan, grpc_metadata
from pipeline.settings import TritonSettings
from pipeline.triton.admin import ModelDescription, TritonAdmin
from pipeline.triton.client import aio_client, grpc_target, triton_call_span
from pipeline.triton.failures import TritonFailureClassifier
from pipeline.triton.shared_memory import RegionPool, SharedMemoryOptions, message_infer, output_specs
from workers.stateless.backend import BatchOutput

log = logging.getLogger(__name__)

class TritonModelBackend:
    """Serve batches with one Triton model over gRPC (``tritonclient.grpc.aio``)."""

    def __init__(
        self,
        settings: TritonSettings,
        model: str,
        model_version: str = "",
        *,
        call_timeout_s: float = 30.0,
        shared_memory: SharedMemoryOptions = SharedMemoryOptions(),
        stage: str = "",
        count_shared_memory: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.settings, self.model, self.model_version = settings, model, model_version
        self.name = model
        self.call_timeout_s = call_timeout_s
        self.call_span: CallSpan = triton_call_span(settings, model, model_version)
        self.device: str | None = None
        self.description: ModelDescription | None = None
        self._client: triton_aio.InferenceServerClient | None = None
        self._classifier: TritonFailureClassifier | None = None
        # The version answering requests that name none, and when that call was sent.
        self._serving: str | None = None
        self._serving_since = 0.0
        self._refresh: asyncio.Task[None] | None = None
        # Large tensors through Triton system shared memory (pipeline/triton/shared_memory.py).
        self._shm_options, self._stage, self._count_shm = shared_memory, stage or model, count_shared_memory
        self._shm: RegionPool | None = None
        self._accepted = AcceptedLayouts()

    # ------------------------------------------------------------------ lifecycle
    async def setup(self) -> int:
        with TritonAdmin(self.settings) as admin:
            await asyncio.to_thread(admin.wait_ready, 120.0)
            self.description = await asyncio.to_thread(admin.describe, self.model, self.model_version)
        assert self.settings.grpc_url
        self._client = aio_client(self.settings)
        self._classifier = TritonFailureClassifier(
            self._client, self.model, self.model_version, probe_timeout_s=min(2.0, self.call_timeout_s)
        )
        if self._shm_options.mode != "off":
            pool = RegionPool(self._client, self._stage, self._shm_options, self._count_shm)
            if await pool.start(grpc_target(self.settings.grpc_url)[0]):
                self._shm = pool
        return self.description.max_batch_size

    async def close(self) -> None:
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
        if self._shm is not None:
            await self._shm.close()
        if self._client is not None:
            await self._client.close()

    async def warmup(self) -> None:
        """One zero-filled request, so the first real batch pays no lazy initialisation."""
        assert self.description is not None and self._client is not None
        inputs = []
        for spec in self.description.inputs:
            if spec.optional or spec.datatype == "BYTES":
                continue
            # A variable dim (-1) gets length 1: a model with a variable-length input (padded
            # batching's) must get every required input, or the warm-up call itself fails.
            shape = ([1] if self.description.batching else []) + [d if d >= 0 else 1 for d in spec.shape]
            tensor = InferInput(spec.name, shape, spec.datatype)
            tensor.set_data_from_numpy(np.zeros(shape, dtype=triton_to_np_dtype(spec.datatype)))
            inputs.append(tensor)
        await self._client.infer(
            self.model, inputs, model_version=self.model_version, client_timeout=self.call_timeout_s
        )

    async def ready(self) -> bool:
        """Whether the server answers ready with this model ready on it (a fleet's probe of
        a replica it took out, :mod:`workers.stateless.fleet_backend`)."""
        return self._classifier is not None and await self._classifier.serving()

    # ------------------------------------------------------------------ requests
    def check(self, request: InferenceRequest) -> None:
        """Model, version, tensor names, datatypes and shapes against the model's metadata
        (once per layout and description: :class:`AcceptedLayouts`)."""
        description = self.description
        assert description is not None
        key = AcceptedLayouts.key(request)
        if self._accepted.holds(key, description):
            return
        validate_model(request, model_name=self.model, model_version=self.model_version)
        validate_inputs(request, description.inputs, max_batch_size=description.max_batch_size)
        validate_outputs(request, description.outputs)
        self._accepted.add(key, description)

    def rows(self, request: InferenceRequest) -> int:
        assert self.description is not None
        return request_rows(request, self.description.batching)

    def batch_key(self, request: InferenceRequest) -> Hashable:
        batching = self.description is not None and self.description.batching
        tensors = tuple(
            (name, request.datatypes[name], array.shape[1:] if batching else array.shape)
            for name, array in request.inputs.items()
        )
        # Without a batch dimension every request is its own call.
        identity = None if batching else id(request)
        return (
            request.model_version or self.model_version,
            tensors,
            request.requested_outputs,
            request.priority or 0,
            request.timeout_us or 0,
            identity,
        )

    async def run(self, requests: Sequence[InferenceRequest], prepared: Sequence[object] = ()) -> BatchOutput:
        assert self._client is not None and self.description is not None
        description = self.description  # this batch's, even if a reload swaps it meanwhile
        first = requests[0]
        tensors = {}
        for name, datatype in first.datatypes.items():
            parts = [request.inputs[name] for request in requests]
            tensors[name] = (parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0), datatype)
        names = list(first.requested_outputs) or [o.name for o in description.outputs]
        batching = description.batching
        counts = [request_rows(r, batching) for r in requests]  # once each: asked twice cost ~60 us per call of 64
        sent_rows = sum(counts)
        shapes = [(n, description.output(n).datatype, description.output(n).shape) for n in names]
        outputs = output_specs(shapes, sent_rows if description.batching else None)
        client = self._client

        async def call(inputs: list[InferInput], requested: list[InferRequestedOutput]) -> triton_aio.InferResult:
            return await client.infer(
                self.model,
                inputs,
                model_version=first.model_version or self.model_version,
                outputs=requested,
                priority=first.priority or 0,
                timeout=first.timeout_us,
                client_timeout=call_timeout(requests, self.call_timeout_s),
                headers=grpc_metadata(),  # W3C trace context: Triton continues it when its tracing is on
            )

        sent = time.monotonic()
        pool = self._shm
        response, arrays = await (
            pool.infer(tensors, outputs, call) if pool is not None else message_infer(tensors, outputs, call)
        )
        result = response.get_response()
        if not first.model_version:
            self._observe_version(result.model_version, sent)
        for name, array in arrays.items():
            if array is None or (batching and (array.ndim == 0 or array.shape[0] != sent_rows)):
                shape = None if array is None else list(array.shape)
                raise OutputMismatch(f"model {self.model} returned {name} {shape} for {sent_rows} rows sent")
        named = {n: a for n, a in arrays.items() if a is not None}
        if not batching:
            return BatchOutput([dict(named) for _ in requests], result.model_name, result.model_version)
        # The whole batch, split per request only if the stage asks (results are encoded from it).
        return BatchOutput(None, result.model_name, result.model_version, arrays=named, rows=counts)

    # ------------------------------------------------------------------ versions
    def _observe_version(self, version: str, sent: float) -> None:
        """Note the version that answered a call sent at ``sent``; on a change, describe again.

        Answers to calls sent before the latest noted one are stale (batches
        overlap), so a late v1 answer after the switch does not flip it back.
        """
        if sent < self._serving_since:
            return
        self._serving_since = sent
        if version == self._serving:
            return
        previous, self._serving = self._serving, version
        if previous is None:
            return  # the first answer: setup() described this model already
        log.info("model %s: now serving version %s (was %s)", self.model, version, previous)
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self._refresh_description(), name=f"describe-{self.model}")

    async def _refresh_description(self) -> None:
        """Describe the model again (in a thread) and swap the description in when done."""
        try:
            description = await asyncio.to_thread(self._describe)
        except Exception as exc:  # noqa: BLE001 - keep serving with what we have
            log.warning("model %s: could not describe it again (%s); keeping the previous description", self.model, exc)
            return
        old = self.description
        self.description = description
        if old is not None and description.max_batch_size < old.max_batch_size:
            log.warning(
                "model %s: max_batch_size fell from %d to %d; batches are still cut at the old size",
                self.model, old.max_batch_size, description.max_batch_size,
            )

    def _describe(self) -> ModelDescription:
        with TritonAdmin(self.settings) as admin:
            return admin.describe(self.model, self.model_version)

    # ------------------------------------------------------------------ failures
    async def classify(self, exc: BaseException) -> Failure:
        assert self._classifier is not None
        return await self._classifier.classify(exc)


class OutputMismatch(Exception):
    """Triton answered, but not with one output row per row sent: the model's fault.
    Classified permanent, so the batch is split and each request gets its own answer."""


def call_timeout(requests: Sequence[InferenceRequest], limit_s: float) -> float:
    """The gRPC deadline of one call: the stage's ``call_timeout_s``, or the earliest request
    deadline in the batch when that comes first. Never unbounded: a hung Triton (stopped,
    deadlocked) must surface as DEADLINE_EXCEEDED, which the classifier then calls an outage
    when the server does not answer its readiness probe either."""
    deadlines = [r.deadline_ms for r in requests if r.deadline_ms is not None]
    if not deadlines:
        return limit_s
    return max(0.001, min(limit_s, min(deadlines) / 1000 - time.time()))


def request_rows(request: InferenceRequest, batching: bool) -> int:
    """Rows a request adds to a batch: its first input's leading dimension (1 without batching)."""
    if not batching or not request.inputs:
        return 1
    return int(next(iter(request.inputs.values())).shape[0])
