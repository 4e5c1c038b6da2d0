"""A stateless stage's intake: from a consumed record to the request a batch carries.

Each step has its own owner; this module only puts them in their one order, so the
stage's batching loop sees a request that is decoded (the contract's trust boundary),
renamed to the model's tensors (tensor maps), addressed to its route's model (a stage
with ``routes``, :mod:`workers.routed_backend`), padded to its length bucket
(``padding``, :mod:`workers.padding`), checked by the backend, and carrying the
stage's defaults: a deadline from the record's timestamp, its lane's priority or
the stage's (:mod:`workers.lanes`), a timeout. Raises only :class:`BadRequest`,
which the stage dead-letters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from pipeline.contract.request import InferenceRequest, decode_request
from pipeline.kafka.records import ConsumedRecord
from pipeline.topology.lanes import Lane
from workers.backend import BatchBackend
from workers.lanes import lane_priority
from workers.padding import Padder
from workers.routing import TensorRouting

Selector = Callable[[ConsumedRecord, InferenceRequest], InferenceRequest]
"""Re-addresses a decoded request to the model of its route (:mod:`workers.routed_backend`)."""


class Defaults(Protocol):
    """The stage settings the intake applies (:class:`workers.stateless.BatchingSettings`)."""

    @property
    def max_request_bytes(self) -> int: ...
    @property
    def default_deadline_ms(self) -> int | None: ...
    @property
    def default_priority(self) -> int | None: ...
    @property
    def default_timeout_ms(self) -> int | None: ...


@dataclass(frozen=True)
class Admitted:
    """A record's request, ready for the batcher."""

    request: InferenceRequest  # as the backend sees it (model tensor names, padded)
    message: InferenceRequest  # as it arrived (topology tensor names)
    prepared: object  # what the backend's check returned, passed back to its run
    length: int | None  # a padded request's true length (its outputs are trimmed to it)
    elements: int  # a padded request's elements (the batch's element bound counts them)


@dataclass(frozen=True)
class RequestIntake:
    backend: BatchBackend
    settings: Defaults
    routing: TensorRouting
    select: Selector | None = None
    padding: Padder | None = None
    lanes: tuple[Lane, ...] = ()

    def admit(self, record: ConsumedRecord) -> Admitted:
        """The record's request for the batcher; :class:`BadRequest` when it cannot be served."""
        message = decode_request(
            record.value, list(record.headers or ()), max_value_bytes=self.settings.max_request_bytes
        )
        request = self.routing.to_model(message)
        if self.select is not None:
            request = self.select(record, request)
        padded = self.padding.pad(request) if self.padding is not None else None
        if padded is not None:
            request = padded.request  # keyed by its bucket, so mixed lengths share batches
        prepared = self.backend.check(request)
        return Admitted(
            self.with_defaults(request, record),
            message,
            prepared,
            padded.length if padded is not None else None,
            padded.elements if padded is not None else 0,
        )

    def with_defaults(self, request: InferenceRequest, record: ConsumedRecord) -> InferenceRequest:
        """Apply the stage's default deadline (from the record's timestamp), priority (its
        lane's, else the stage's) and timeout, where the request sets none."""
        s = self.settings
        changes: dict[str, Any] = {}
        lane = lane_priority(self.lanes, record.topic)
        priority = lane if lane is not None else s.default_priority
        if request.deadline_ms is None and s.default_deadline_ms is not None and record.timestamp > 0:
            changes["deadline_ms"] = record.timestamp + s.default_deadline_ms
        if request.priority is None and priority is not None:
            changes["priority"] = priority
        if request.timeout_us is None and s.default_timeout_ms is not None:
            changes["timeout_us"] = s.default_timeout_ms * 1000
        return replace(request, **changes) if changes else request
