"""Classify a failed Triton inference call: outage, transient, or the request's fault.

One classifier for every path that calls Triton (batching stages, sequence
stages), so "is Triton down or is this request bad?" is decided once. gRPC and
Triton use ``UNAVAILABLE`` both for "nothing answered" and for "model not
available", so the status alone cannot tell: the message, the repository index
and the server's readiness are consulted too.

Live model management, as observed on Triton 2.51 (see workers/stateless/triton_backend.py
for the whole reload story): a model that is not loaded, whether being loaded or
unloaded right now or settled unloaded (a person unloaded it, a load failed), is an
*outage* of the stage, not the request's fault: the stage's model is fixed by the
topology and checked for every request before it is sent (a request naming
another model or a version other than the pinned one is dead-lettered there), so
no request could succeed until the model is back, and dead-lettering them would
turn an unload, a failed reload or a maintenance window into every record of the
meantime needing a manual replay. So they wait, consumption pauses and the
watchdog turns readiness off, as for a Triton that is down; loading the model
again (`pipeline models load`) resumes the stage with nothing lost. A failure
whose index read already says READY (a version became ready meanwhile, or the
request named a version that is not the one serving) is *transient*: retried,
then dead-lettered, so a request for a version that never comes cannot wait forever.

Hangs: every call carries a client deadline (the stage's ``call_timeout_s``), so a
Triton that stops answering (process stopped, deadlocked) ends each call with
``DEADLINE_EXCEEDED``. That status alone cannot tell a hung server from a slow
model, so the readiness probe decides: no answer within the probe timeout is an
*outage* (the batch waits, consumption pauses, nothing is dead-lettered); a
ready server that was merely too slow is *transient* (retried, then
``deadline-exceeded``).
"""

from __future__ import annotations

import tritonclient.grpc.aio as triton_aio
from tritonclient.utils import InferenceServerException

from pipeline.contract.errors import ErrorClass
from pipeline.failure_policy import Failure, FailureKind

TRANSIENT_STATUSES = (
    "StatusCode.UNAVAILABLE",
    "StatusCode.DEADLINE_EXCEEDED",
    "StatusCode.RESOURCE_EXHAUSTED",
    # A server that was stopped (SIGSTOP) and resumed cancels calls whose deadline passed
    # meanwhile: observed as "[StatusCode.CANCELLED]" with no message. Not the request's fault.
    "StatusCode.CANCELLED",
)
_OUTAGE_MARKERS = ("failed to connect", "connection refused", "socket closed", "connection reset", "connect failed")
_PROBE_TIMEOUT_S = 2.0


class TritonFailureClassifier:
    """Turn an exception from ``client.infer`` for ``model`` into a :class:`Failure`."""

    def __init__(
        self,
        client: triton_aio.InferenceServerClient,
        model: str,
        model_version: str = "",
        *,
        probe_timeout_s: float = _PROBE_TIMEOUT_S,
    ) -> None:
        self.client = client
        self.model = model
        self.model_version = model_version
        self.probe_timeout_s = probe_timeout_s

    async def classify(self, exc: BaseException) -> Failure:
        if not isinstance(exc, InferenceServerException):
            return Failure(FailureKind.PERMANENT, ErrorClass.INFERENCE_FAILED, f"{type(exc).__name__}: {exc}")
        message = " ".join(str(exc.message() or exc).split())
        status = str(exc.status() or "")
        if is_connection_failure(status, message):
            return Failure(FailureKind.OUTAGE, ErrorClass.MODEL_UNAVAILABLE, message)
        if is_overload(status, message):
            # Queue full / resource exhausted: backpressure from a live server, not the
            # request's fault; wait (consumer paused) instead of spending attempts.
            return Failure(FailureKind.OUTAGE, ErrorClass.MODEL_UNAVAILABLE, f"Triton overloaded: {message}")
        error_class = error_class_of(status, message)
        if error_class is ErrorClass.MODEL_UNAVAILABLE:
            return unloaded_model_failure(self.model, message, await self.model_states())
        if not await self.server_ready():
            # Unreachable, hung, starting or shutting down: the server's problem, not the request's.
            return Failure(FailureKind.OUTAGE, ErrorClass.MODEL_UNAVAILABLE, message)
        kind = FailureKind.TRANSIENT if status in TRANSIENT_STATUSES else FailureKind.PERMANENT
        return Failure(kind, error_class, message)

    async def model_states(self) -> set[str] | None:
        """The states of this model's versions (the pinned one only) in the repository
        index; ``None`` when the index cannot be read."""
        try:
            index = await self.client.get_model_repository_index(client_timeout=self.probe_timeout_s)
        except InferenceServerException:
            return None
        return {
            m.state
            for m in index.models
            if m.name == self.model and (not self.model_version or m.version == self.model_version)
        }

    async def server_ready(self) -> bool:
        try:
            return bool(await self.client.is_server_ready(client_timeout=self.probe_timeout_s))
        except InferenceServerException:
            return False

    async def serving(self) -> bool:
        """The server ready with this model ready on it: the probe that brings a replica a
        fleet took out back in (stateless and sequence fleets alike)."""
        try:
            return bool(await self.client.is_server_ready(client_timeout=self.probe_timeout_s)) and bool(
                await self.client.is_model_ready(self.model, self.model_version, client_timeout=self.probe_timeout_s)
            )
        except InferenceServerException:
            return False


def unloaded_model_failure(model: str, message: str, states: set[str] | None) -> Failure:
    """Triton said the stage's model is not loaded; ``states`` are its versions' states in
    the repository index (None: the index could not be read). READY somewhere: transient
    (it became ready meanwhile, or the request named a version that is not the one serving);
    otherwise an outage of the stage, waited out (see the module docstring)."""
    if states is not None and "READY" in states:
        return Failure(FailureKind.TRANSIENT, ErrorClass.MODEL_UNAVAILABLE, f"{message} (model {model} is ready)")
    if states is None or states & {"LOADING", "UNLOADING"}:
        reason = f"{message} (model {model} is being loaded or unloaded)"
    else:
        reason = f"model {model!r} is not loaded on Triton; waiting until it is: {message}"
    return Failure(FailureKind.OUTAGE, ErrorClass.MODEL_UNAVAILABLE, reason)


def is_connection_failure(status: str, message: str) -> bool:
    """True when gRPC says nothing answered (as opposed to Triton answering "no")."""
    text = message.lower()
    return status == "StatusCode.UNAVAILABLE" and any(m in text for m in _OUTAGE_MARKERS)


def is_overload(status: str, message: str) -> bool:
    """Triton's dynamic batcher queue is full (``max_queue_size``), or gRPC resources ran out."""
    text = message.lower()
    return status == "StatusCode.RESOURCE_EXHAUSTED" or "exceeds maximum queue size" in text or "queue is full" in text


def error_class_of(status: str, message: str) -> ErrorClass:
    """The dead-letter error class a Triton error maps to."""
    text = message.lower()
    if "no available versions" in text or "is not ready" in text or "is not at ready state" in text:
        return ErrorClass.MODEL_UNAVAILABLE  # known to the repository, but not loaded
    if "unknown model" in text or "not found" in text:
        return ErrorClass.UNKNOWN_MODEL
    if "unavailable" in text or "not ready" in text:
        return ErrorClass.MODEL_UNAVAILABLE
    if status == "StatusCode.DEADLINE_EXCEEDED" or "timeout" in text:
        return ErrorClass.DEADLINE_EXCEEDED
    return ErrorClass.INFERENCE_FAILED
