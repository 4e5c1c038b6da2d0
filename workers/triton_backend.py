"""A stateless Triton model as a batching backend: one batched gRPC call per batch.

Requests are checked against the model's metadata (names, datatypes,
per-row shapes, max batch size) before they are batched, and grouped by
everything that must be equal inside one call (version, tensor shapes after
the batch dimension, requested outputs, priority, timeout), so no padding is
ever added and no batch mixes shapes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Sequence

import numpy as np
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.request import InferenceRequest
from pipeline.contract.validation import validate_inputs, validate_outputs
from pipeline.settings import TritonSettings
from pipeline.triton.admin import ModelDescription, TritonAdmin
from workers.stateless import BatchOutput, Failure, FailureKind

log = logging.getLogger(__name__)

_TRANSIENT = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED", "StatusCode.RESOURCE_EXHAUSTED")
_OUTAGE_MARKERS = ("failed to connect", "connection refused", "socket closed", "connection reset", "connect failed")


class TritonModelBackend:
    """Serve batches with one Triton model over gRPC (``tritonclient.grpc.aio``)."""

    def __init__(self, settings: TritonSettings, model: str, model_version: str = "") -> None:
        self.settings = settings
        self.model = model
        self.model_version = model_version
        self.name = model
        self.description: ModelDescription | None = None
        self._client: triton_aio.InferenceServerClient | None = None

    # ------------------------------------------------------------------ lifecycle
    async def setup(self) -> int:
        with TritonAdmin(self.settings) as admin:
            await asyncio.to_thread(admin.wait_ready, 120.0)
            self.description = await asyncio.to_thread(admin.describe, self.model, self.model_version)
        assert self.settings.grpc_url
        self._client = triton_aio.InferenceServerClient(self.settings.grpc_url)
        return self.description.max_batch_size

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def warmup(self) -> None:
        """One zero-filled request, so the first real batch pays no lazy initialisation."""
        assert self.description is not None and self._client is not None
        inputs = []
        for spec in self.description.inputs:
            if spec.optional or any(d < 0 for d in spec.shape) or spec.datatype == "BYTES":
                continue
            shape = ([1] if self.description.batching else []) + list(spec.shape)
            tensor = InferInput(spec.name, shape, spec.datatype)
            tensor.set_data_from_numpy(np.zeros(shape, dtype=triton_to_np_dtype(spec.datatype)))
            inputs.append(tensor)
        await self._client.infer(self.model, inputs, model_version=self.model_version)

    # ------------------------------------------------------------------ requests
    def check(self, request: InferenceRequest) -> None:
        """Model, version, tensor names, datatypes and shapes against the model's metadata."""
        assert self.description is not None
        if request.model_name and request.model_name != self.model:
            raise BadRequest(
                ErrorClass.UNKNOWN_MODEL, f"request names model {request.model_name!r}; stage serves {self.model!r}"
            )
        if request.model_version and self.model_version and request.model_version != self.model_version:
            raise BadRequest(
                ErrorClass.MODEL_VERSION_MISMATCH,
                f"request asks version {request.model_version}; stage pins version {self.model_version}",
            )
        validate_inputs(request, self.description.inputs, max_batch_size=self.description.max_batch_size)
        validate_outputs(request, self.description.outputs)

    def rows(self, request: InferenceRequest) -> int:
        assert self.description is not None
        if not self.description.batching or not request.inputs:
            return 1
        return int(next(iter(request.inputs.values())).shape[0])

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
        first = requests[0]
        inputs = []
        for name, datatype in first.datatypes.items():
            arrays = [request.inputs[name] for request in requests]
            data = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
            tensor = InferInput(name, list(data.shape), datatype)
            tensor.set_data_from_numpy(data)
            inputs.append(tensor)
        names = list(first.requested_outputs) or [o.name for o in self.description.outputs]
        response = await self._client.infer(
            self.model,
            inputs,
            model_version=first.model_version or self.model_version,
            outputs=[InferRequestedOutput(name) for name in names],
            priority=first.priority or 0,
            timeout=first.timeout_us,
            client_timeout=_client_timeout(first),
        )
        result = response.get_response()
        arrays = {name: response.as_numpy(name) for name in names}
        outputs: list[dict[str, np.ndarray]] = []
        offset = 0
        for request in requests:
            rows = self.rows(request)
            if self.description.batching:
                outputs.append({n: a[offset : offset + rows] for n, a in arrays.items()})
            else:
                outputs.append(arrays)
            offset += rows
        return BatchOutput(outputs, result.model_name, result.model_version)

    # ------------------------------------------------------------------ failures
    async def classify(self, exc: BaseException) -> Failure:
        if not isinstance(exc, InferenceServerException):
            return Failure(FailureKind.PERMANENT, ErrorClass.INFERENCE_FAILED, f"{type(exc).__name__}: {exc}")
        message = " ".join(str(exc.message() or exc).split())
        status = str(exc.status() or "")
        if _is_connection_failure(status, message) or not await self._server_ready():
            # Unreachable, starting or shutting down: the server's problem, not the request's.
            return Failure(FailureKind.OUTAGE, ErrorClass.MODEL_UNAVAILABLE, message)
        error_class = _error_class(status, message)
        kind = FailureKind.TRANSIENT if status in _TRANSIENT else FailureKind.PERMANENT
        return Failure(kind, error_class, message)

    async def _server_ready(self) -> bool:
        assert self._client is not None
        try:
            return bool(await self._client.is_server_ready(client_timeout=2.0))
        except InferenceServerException:
            return False


def _client_timeout(request: InferenceRequest) -> float | None:
    if request.deadline_ms is None:
        return None
    return max(0.001, request.deadline_ms / 1000 - time.time())


def _is_connection_failure(status: str, message: str) -> bool:
    text = message.lower()
    return status == "StatusCode.UNAVAILABLE" and any(m in text for m in _OUTAGE_MARKERS)


def _error_class(status: str, message: str) -> ErrorClass:
    text = message.lower()
    if "no available versions" in text or "is not ready" in text:
        return ErrorClass.MODEL_UNAVAILABLE  # known to the repository, but not loaded
    if "unknown model" in text or "not found" in text:
        return ErrorClass.UNKNOWN_MODEL
    if "unavailable" in text or "not ready" in text:
        return ErrorClass.MODEL_UNAVAILABLE
    if status == "StatusCode.DEADLINE_EXCEEDED" or "timeout" in text:
        return ErrorClass.DEADLINE_EXCEEDED
    return ErrorClass.INFERENCE_FAILED

