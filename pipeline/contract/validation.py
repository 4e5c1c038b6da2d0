"""Checking a decoded request against a model's configuration.

Decoding proves a request is well-formed; these checks prove it fits the model
a stage serves. Doing them before calling Triton turns a model-side error
(opaque gRPC status) into a precise dead-letter reason, and keeps one bad
record from failing a whole dynamic batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.request import InferenceRequest


class DeclaredTensor(Protocol):
    """One input or output of a model config (e.g. parsed from Triton's model metadata)."""

    @property
    def name(self) -> str: ...

    @property
    def datatype(
        self,
    ) -> str: ...  # KServe name ("FP32"); Triton config names ("TYPE_FP32") are accepted too

    @property
    def shape(self) -> Sequence[int]: ...  # per-item dims, -1 = any; no batch dim

    @property
    def optional(self) -> bool: ...


def kserve_datatype(name: str) -> str:
    """``"TYPE_FP32"`` -> ``"FP32"``, ``"TYPE_STRING"`` -> ``"BYTES"``; KServe names pass through."""
    bare = name.removeprefix("TYPE_")
    return "BYTES" if bare == "STRING" else bare


def validate_model(request: InferenceRequest, *, model_name: str, model_version: str) -> None:
    """A request that names a model must name the stage's; empty names defer to the stage.
    A stage that follows the latest version (``model_version`` empty) accepts any."""
    if request.model_name and request.model_name != model_name:
        raise BadRequest(
            ErrorClass.UNKNOWN_MODEL,
            f"request is for model {request.model_name!r}, stage serves {model_name!r}",
        )
    if request.model_version and model_version and request.model_version != model_version:
        raise BadRequest(
            ErrorClass.MODEL_VERSION_MISMATCH,
            f"request asks version {request.model_version} of {model_name!r}; stage pins version {model_version}",
        )


def validate_inputs(
    request: InferenceRequest, inputs_spec: Sequence[DeclaredTensor], *, max_batch_size: int
) -> None:
    """Names, datatypes and shapes of the request's inputs against the model's.

    With ``max_batch_size > 0`` each input has a leading batch dimension in
    ``[1, max_batch_size]``, the same for all inputs; the spec shapes exclude it.
    """
    specs = {spec.name: spec for spec in inputs_spec}
    for name in request.inputs:
        if name not in specs:
            raise BadRequest(
                ErrorClass.UNKNOWN_INPUT, f"model has no input {name!r}; it has {sorted(specs)}"
            )
    for spec in inputs_spec:
        if spec.name not in request.inputs and not spec.optional:
            raise BadRequest(ErrorClass.MISSING_INPUT, f"required input {spec.name!r} is missing")
    batch_sizes: set[int] = set()
    for name, array in request.inputs.items():
        spec = specs[name]
        expected_type = kserve_datatype(spec.datatype)
        if request.datatypes[name] != expected_type:
            raise BadRequest(
                ErrorClass.DATATYPE_MISMATCH,
                f"input {name!r} is {request.datatypes[name]}, model expects {expected_type}",
            )
        shape = tuple(array.shape)
        if max_batch_size > 0:
            if not shape:
                raise BadRequest(
                    ErrorClass.SHAPE_MISMATCH, f"input {name!r} lacks the batch dimension"
                )
            batch, shape = shape[0], shape[1:]
            if batch < 1:
                raise BadRequest(ErrorClass.SHAPE_MISMATCH, f"input {name!r} has batch size 0")
            if batch > max_batch_size:
                raise BadRequest(
                    ErrorClass.BATCH_TOO_LARGE,
                    f"input {name!r} has batch {batch}, max {max_batch_size}",
                )
            batch_sizes.add(batch)
        if not _dims_match(shape, tuple(spec.shape)):
            raise BadRequest(
                ErrorClass.SHAPE_MISMATCH,
                f"input {name!r} has shape {list(shape)}, model expects {list(spec.shape)}",
            )
    if len(batch_sizes) > 1:
        raise BadRequest(
            ErrorClass.SHAPE_MISMATCH, f"inputs disagree on batch size: {sorted(batch_sizes)}"
        )


def validate_outputs(request: InferenceRequest, outputs_spec: Sequence[DeclaredTensor]) -> None:
    """Every requested output must exist in the model (none requested means all)."""
    known = {spec.name for spec in outputs_spec}
    for name in request.requested_outputs:
        if name not in known:
            raise BadRequest(
                ErrorClass.UNKNOWN_OUTPUT, f"model has no output {name!r}; it has {sorted(known)}"
            )


def _dims_match(actual: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    return len(actual) == len(expected) and all(e == -1 or a == e for a, e in zip(actual, expected, strict=False))


class AcceptedLayouts:
    """Request layouts one model description has accepted, so a repeated one is not checked again.

    What :func:`validate_model`, :func:`validate_inputs` and :func:`validate_outputs` decide
    depends on the request's layout alone: model and version, tensor names, datatypes and
    shapes, requested outputs. A producer repeats a few layouts, and checking each record
    again cost a stateless stage 10 % of its CPU (issue 22, ``benchmarks.stateless
    --profile``). Bounded (a stream of distinct layouts starts over, never grows), and
    emptied when the description it was checked against is replaced (a model reload).
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._description: object | None = None
        self._keys: set[object] = set()

    @staticmethod
    def key(request: InferenceRequest) -> object:
        shapes = tuple([(name, request.datatypes[name], array.shape) for name, array in request.inputs.items()])
        return request.model_name, request.model_version, request.requested_outputs, shapes

    def holds(self, key: object, description: object) -> bool:
        return description is self._description and key in self._keys

    def add(self, key: object, description: object) -> None:
        if description is not self._description or len(self._keys) >= self.capacity:
            self._description, self._keys = description, set()
        self._keys.add(key)
