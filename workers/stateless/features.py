"""A stateless stage's optional features, as the steps its builder assembles.

The bare path of :class:`~workers.stateless.stage.BatchingStage` is decode, check, batch, call,
encode. Everything else a topology may ask for is a step added here by the builder
(:func:`pipeline.runtime.stages.build_stateless`), never an ``if`` the bare path asks per
record:

- **request steps**, in order, on each decoded request before the backend checks it:
  the tensor map in (:class:`RenameInputs`), the route's model (:class:`AssignRoute`),
  the length bucket (:class:`PadToBucket`), the stage's and the lanes' defaults
  (:class:`ApplyDefaults`), the tenant that fair batches share rows by (:class:`NameTenant`);
- **result steps** on each request's model outputs (:class:`TrimPadding`);
- **batch observers**, which see each batch as it goes to the backend (the shadow copy);
- **admission**, which every record passes before decoding (the tenant gate).

A topology with none of them (``topologies/dense.yaml``) gets :data:`NO_FEATURES`;
``tests/unit/test_stage_features.py`` holds the builder to that. The next feature is one
step class here (or in its own module) plus one line in the builder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from pipeline.contract.request import InferenceRequest
from pipeline.kafka.records import ConsumedRecord
from pipeline.topology.lanes import Lane
from workers.runtime.lanes import lane_priority
from workers.stateless.padding import Padder
from workers.stateless.shadow import ShadowCopy, ShadowMirror
from workers.stateless.tensor_map import TensorMap

RouteAssigner = Callable[[ConsumedRecord, InferenceRequest], InferenceRequest]
"""Re-addresses a decoded request to the model of its route (:mod:`workers.stateless.routed_backend`)."""


@dataclass
class Draft:
    """One record's request on its way to the batcher, as the request steps change it."""

    record: ConsumedRecord
    request: InferenceRequest  # as the backend will see it
    length: int | None = None  # a padded request's true length (its outputs are trimmed to it)
    elements: int = 0  # a padded request's elements (the batch's element bound counts them)
    tenant: str = ""  # fair batches: whose rows these are


class RequestStep(Protocol):
    """Changes a :class:`Draft`; raises :class:`~pipeline.contract.errors.BadRequest` for a
    request the stage cannot serve (it is dead-lettered)."""

    def __call__(self, draft: Draft) -> None: ...


class ResultStep(Protocol):
    """Changes one request's model outputs before they are encoded."""

    def __call__(self, outputs: dict[str, np.ndarray], length: int | None) -> dict[str, np.ndarray]: ...


class Served(Protocol):
    """A request in a batch, as observers see it."""

    @property
    def record(self) -> ConsumedRecord: ...
    @property
    def message(self) -> InferenceRequest: ...  # as it arrived (topology tensor names)
    @property
    def request(self) -> InferenceRequest: ...  # as the backend sees it (model tensor names)


class BatchObserver(Protocol):
    """Sees each batch as it goes to the backend; returns at once."""

    def __call__(self, batch: Sequence[Served]) -> None: ...


@dataclass(frozen=True)
class RenameInputs:
    """The tensor map in (``input_map``): the model's inputs under its own names."""

    tensor_map: TensorMap

    def __call__(self, draft: Draft) -> None:
        draft.request = self.tensor_map.to_model(draft.request)


@dataclass(frozen=True)
class AssignRoute:
    """``routes:``: the request goes to the model of its route."""

    assign: RouteAssigner

    def __call__(self, draft: Draft) -> None:
        draft.request = self.assign(draft.record, draft.request)


@dataclass(frozen=True)
class PadToBucket:
    """``padding:``: the input padded to its length bucket, keyed by the bucket so mixed
    lengths share batches; the true length is kept for :class:`TrimPadding`."""

    padder: Padder

    def __call__(self, draft: Draft) -> None:
        padded = self.padder.pad(draft.request)
        draft.request, draft.length, draft.elements = padded.request, padded.length, padded.elements


@dataclass(frozen=True)
class TrimPadding:
    """``padding:``: a padded request's outputs cut back to its true length."""

    padder: Padder

    def __call__(self, outputs: dict[str, np.ndarray], length: int | None) -> dict[str, np.ndarray]:
        return outputs if length is None else self.padder.trim(outputs, length)


class StageDefaults(Protocol):
    """The stage settings :class:`ApplyDefaults` reads (:class:`workers.stateless.stage.BatchingSettings`)."""

    @property
    def default_deadline_ms(self) -> int | None: ...
    @property
    def default_priority(self) -> int | None: ...
    @property
    def default_timeout_ms(self) -> int | None: ...


@dataclass(frozen=True)
class ApplyDefaults:
    """Where the request sets none: a deadline from the record's timestamp, its lane's
    priority (:mod:`workers.runtime.lanes`) or the stage's, a timeout."""

    settings: StageDefaults
    lanes: tuple[Lane, ...] = ()

    @staticmethod
    def wanted(settings: StageDefaults, lanes: Sequence[Lane]) -> bool:
        """Whether a stage with these settings and lanes has any default to apply."""
        return bool(lanes) or any(
            v is not None for v in (settings.default_deadline_ms, settings.default_priority, settings.default_timeout_ms)
        )

    def __call__(self, draft: Draft) -> None:
        draft.request = self.applied(draft.request, draft.record)

    def applied(self, request: InferenceRequest, record: ConsumedRecord) -> InferenceRequest:
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


@dataclass(frozen=True)
class NameTenant:
    """Fair batches (``tenants.fair_share``): the record's tenant, whose rows the batcher
    shares out (:func:`workers.stateless.tenancy.fair_share.fair_pick`)."""

    tenant_of: Callable[[ConsumedRecord], str]

    def __call__(self, draft: Draft) -> None:
        draft.tenant = self.tenant_of(draft.record)


@dataclass(frozen=True)
class MirrorToShadow:
    """``shadow:``: each main batch mirrored to the shadow model, never awaited."""

    shadow: ShadowMirror

    def __call__(self, batch: Sequence[Served]) -> None:
        self.shadow.offer([ShadowCopy(item.record, item.message, item.request) for item in batch])


@dataclass(frozen=True)
class StageFeatures:
    """The steps one stateless stage runs besides its bare path (each tuple in order)."""

    requests: tuple[RequestStep, ...] = ()
    results: tuple[ResultStep, ...] = ()
    observers: tuple[BatchObserver, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.requests or self.results or self.observers)


NO_FEATURES = StageFeatures()


@dataclass(frozen=True)
class FeatureParts:
    """What the builder hands a stateless stage for its optional features (all off by default)."""

    tensor_map: TensorMap = field(default_factory=TensorMap)
    padding: Padder | None = None
    assign_route: RouteAssigner | None = None
    shadow: ShadowMirror | None = None
    warmup: bool = False  # one call before consuming (not a step: setup only)


def assemble(
    settings: StageDefaults,
    parts: FeatureParts,
    *,
    lanes: Sequence[Lane] = (),
    tenant_of: Callable[[ConsumedRecord], str] | None = None,
) -> StageFeatures:
    """The steps a stage needs for what its topology asks: none for none of it."""
    padding, shadow = parts.padding, parts.shadow
    requests: list[RequestStep] = []
    if parts.tensor_map.input_map:
        requests.append(RenameInputs(parts.tensor_map))
    if parts.assign_route is not None:
        requests.append(AssignRoute(parts.assign_route))
    if padding is not None:
        requests.append(PadToBucket(padding))
    if ApplyDefaults.wanted(settings, lanes):
        requests.append(ApplyDefaults(settings, tuple(lanes)))
    if tenant_of is not None:
        requests.append(NameTenant(tenant_of))
    return StageFeatures(
        requests=tuple(requests),
        results=(TrimPadding(padding),) if padding is not None else (),
        observers=(MirrorToShadow(shadow),) if shadow is not None else (),
    )
