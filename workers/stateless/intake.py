"""A stateless stage's intake: from a consumed record to the request a batch carries.

The bare path decodes the Open Inference Protocol request (the contract's trust boundary)
and lets the backend check it. Whatever else a topology asks for on the way (tensor maps,
routes, padding, defaults, fair tenants) is a request step the stage's features assembled
(:mod:`workers.stateless.features`), run here in order between the two. Raises only
:class:`BadRequest`, which the stage dead-letters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from pipeline.contract.request import InferenceRequest, decode_request
from pipeline.kafka.records import ConsumedRecord
from workers.stateless.backend import BatchBackend
from workers.stateless.features import Draft, RequestStep


class Admitted(NamedTuple):
    """A record's request, ready for the batcher (a named tuple: one per record, made in a
    third of a frozen dataclass's time)."""

    request: InferenceRequest  # as the backend sees it (model tensor names, padded)
    message: InferenceRequest  # as it arrived (topology tensor names)
    prepared: object  # what the backend's check returned, passed back to its run
    length: int | None  # a padded request's true length (its outputs are trimmed to it)
    elements: int  # a padded request's elements (the batch's element bound counts them)
    tenant: str  # fair batches: whose rows these are ("" otherwise)


class RequestIntake(Protocol):
    def admit(self, record: ConsumedRecord) -> Admitted:
        """The record's request for the batcher; :class:`BadRequest` when it cannot be served."""
        ...


@dataclass(frozen=True)
class BareIntake:
    """Decode and check: a stage with no request steps."""

    backend: BatchBackend
    max_request_bytes: int

    def admit(self, record: ConsumedRecord) -> Admitted:
        message = decode_request(record.value, list(record.headers or ()), max_value_bytes=self.max_request_bytes)
        return Admitted(message, message, self.backend.check(message), None, 0, "")


@dataclass(frozen=True)
class SteppedIntake:
    """Decode, the stage's request steps in order, check."""

    backend: BatchBackend
    max_request_bytes: int
    steps: tuple[RequestStep, ...]

    def admit(self, record: ConsumedRecord) -> Admitted:
        message = decode_request(record.value, list(record.headers or ()), max_value_bytes=self.max_request_bytes)
        draft = Draft(record, message)
        for step in self.steps:
            step(draft)
        return Admitted(
            draft.request, message, self.backend.check(draft.request), draft.length, draft.elements, draft.tenant
        )


def request_intake(backend: BatchBackend, max_request_bytes: int, steps: tuple[RequestStep, ...]) -> RequestIntake:
    """The bare intake when there are no steps, else the stepped one."""
    return SteppedIntake(backend, max_request_bytes, steps) if steps else BareIntake(backend, max_request_bytes)
