"""The contract between the batching loop and the things that do the work.

A *backend* serves a whole batch in one call: a Triton model (one batched gRPC
request, :mod:`workers.stateless.triton_backend`) or a DALI pipeline (one run,
:mod:`workers.stateless.dali`). It checks each request before batching (so one bad request
never spoils a batch), says which requests may share a batch, and classifies its
own errors (:class:`pipeline.failure_policy.Failure`); the batching loop in
:mod:`workers.stateless.stage` applies the failure policy. Backends import this module,
never the stage.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.contract.request import InferenceRequest
from pipeline.failure_policy import Failure
from pipeline.observability.tracing import CallSpan


@dataclass(frozen=True)
class BatchOutput:
    """A backend call's result: one output dict per request, and who produced it."""

    outputs: list[dict[str, np.ndarray]]
    model_name: str
    model_version: str
    route: str | None = None  # the route that served it (stages with routes: pipeline-route header)


class BatchBackend(Protocol):
    """What the batching loop needs from the thing that does the work."""

    name: str  # metrics label (model name, "dali")
    device: str | None  # where it runs, when that is worth exporting ("cpu", "gpu")

    @property
    def call_span(self) -> CallSpan:
        """How one call is traced (name, CLIENT for a remote server, attributes)."""

    async def setup(self) -> int:
        """Connect, check readiness; return the backend's own row limit per call (0 = none)."""

    async def close(self) -> None: ...

    def check(self, request: InferenceRequest) -> object:
        """Raise :class:`BadRequest` for a request this backend cannot serve; else return
        whatever the backend prepared from it (passed back to :meth:`run`)."""

    def rows(self, request: InferenceRequest) -> int:
        """Rows the request adds to a batch."""

    def batch_key(self, request: InferenceRequest) -> Hashable:
        """Requests share a batch only when their keys are equal."""

    async def run(self, requests: Sequence[InferenceRequest], prepared: Sequence[object]) -> BatchOutput:
        """Serve all ``requests`` in one call; raise on failure (classified by :meth:`classify`)."""

    async def classify(self, exc: BaseException) -> Failure:
        """Decide whether ``exc`` is an outage, transient or the requests' fault."""

    async def warmup(self) -> None: ...
