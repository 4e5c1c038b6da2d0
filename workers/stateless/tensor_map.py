"""Tensor maps between a topology's names and a model's names (as Triton ensembles map them).

A step sees the message's tensors under topology-wide names. ``input_map``
(model input -> topology tensor) picks and renames what the model gets;
``output_map`` (model output -> topology tensor) renames what it returns. In a
graph the step's outgoing message carries the incoming tensors too, so steps
downstream find everything produced upstream on their path; the step that
writes the result keeps only the topology's ``outputs``.

Pure functions over :class:`InferenceRequest`; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.request import InferenceRequest
from pipeline.contract.tensors import datatype_of


@dataclass(frozen=True)
class TensorMap:
    input_map: Mapping[str, str] = field(default_factory=dict)
    output_map: Mapping[str, str] = field(default_factory=dict)
    carry: bool = False  # outgoing messages keep the incoming tensors (graph steps)
    keep: Sequence[str] | None = None  # the result keeps only these tensors

    @property
    def passes_through(self) -> bool:
        """Whether the outgoing message's tensors are the model's outputs as they are."""
        return not self.output_map and not self.carry and self.keep is None

    def to_model(self, request: InferenceRequest) -> InferenceRequest:
        """The request as the model sees it: its inputs under the model's names."""
        if not self.input_map:
            return request
        inputs: dict[str, np.ndarray] = {}
        datatypes: dict[str, str] = {}
        for model_name, tensor in self.input_map.items():
            if tensor not in request.inputs:
                raise BadRequest(
                    ErrorClass.MISSING_INPUT,
                    f"tensor {tensor!r} (model input {model_name!r}) is not in the message",
                )
            inputs[model_name] = request.inputs[tensor]
            datatypes[model_name] = request.datatypes[tensor]
        return replace(request, inputs=inputs, datatypes=datatypes)

    def from_model(
        self, request: InferenceRequest, outputs: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """The tensors (and datatypes) of the outgoing message, under topology names."""
        produced = {self.output_map.get(name, name): array for name, array in outputs.items()}
        if self.output_map:
            produced = {t: a for t, a in produced.items() if t in self.output_map.values()}
        tensors: dict[str, np.ndarray] = dict(request.inputs) if self.carry else {}
        datatypes: dict[str, str] = dict(request.datatypes) if self.carry else {}
        for name, array in produced.items():
            tensors[name] = array
            datatypes[name] = datatype_of(np.asarray(array))
        if self.keep is not None:
            missing = [t for t in self.keep if t not in tensors]
            if missing:
                raise BadRequest(ErrorClass.UNKNOWN_OUTPUT, f"result tensors {missing} were not produced")
            tensors = {t: tensors[t] for t in self.keep}
            datatypes = {t: datatypes[t] for t in self.keep}
        return tensors, datatypes
