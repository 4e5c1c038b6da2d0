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

import functools
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.contract.request import InferenceRequest
from pipeline.failure_policy import Failure
from pipeline.observability.tracing import CallSpan


@dataclass(frozen=True, eq=False)
class BatchOutput:
    """A backend call's result: one output dict per request, and who produced it.

    A batched call may instead give the whole batch's ``arrays`` and each request's ``rows``
    of them (in request order): the stage then encodes results straight from the batch
    (:func:`pipeline.contract.response_batch.encode_batched_responses`), and ``outputs`` is
    split from them only when something asks for it (a result step, an unusual batch)."""

    parts: list[dict[str, np.ndarray]] | None
    model_name: str
    model_version: str
    route: str | None = None  # the route that served it (stages with routes: pipeline-route header)
    arrays: Mapping[str, np.ndarray] | None = None  # the whole batch's outputs, first axis = rows
    rows: Sequence[int] = ()  # each request's rows of ``arrays``

    @functools.cached_property
    def outputs(self) -> list[dict[str, np.ndarray]]:
        """Each request's outputs (views of ``arrays`` when the call gave those)."""
        if self.parts is not None:
            return self.parts
        assert self.arrays is not None, "a BatchOutput needs its parts or its arrays"
        split: list[dict[str, np.ndarray]] = []
        offset = 0
        for count in self.rows:
            end = offset + count
            split.append({name: array[offset:end] for name, array in self.arrays.items()})
            offset = end
        return split


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
