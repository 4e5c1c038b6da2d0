"""What makes a benchmark result count: every output present, of the right datatype and shape.

The tool cannot know the right *values* of a user's model (the tests check
``topologies/dense.yaml``'s against a reference), but it can refuse what is
certainly wrong: a result with no outputs, an output of another datatype, or
of a shape the model's metadata does not allow for the rows sent. The same
check judges direct Triton answers, so both columns of the table count alike.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pipeline.triton.admin import ModelDescription, TensorSpec


class OutputVerifier:
    """Checks one request's outputs against ``model``'s declared outputs.

    Outputs named as the model names them are checked in full (datatype, every
    fixed dimension). A result whose tensors carry other names (an ensemble's
    ``output_map``, a later stage's model) can only be checked for its batch
    dimension: one row out per row in.
    """

    def __init__(self, model: ModelDescription) -> None:
        self.model = model
        self._specs = {spec.name: spec for spec in model.outputs}

    def problem(self, outputs: Mapping[str, np.ndarray], datatypes: Mapping[str, str], rows: int) -> str | None:
        """None when the outputs are right for ``rows`` rows sent; else what is wrong, in one line."""
        if not outputs:
            return "result has no outputs"
        known = [name for name in outputs if name in self._specs]
        if known:
            missing = sorted(set(self._specs) - set(outputs))
            if missing:
                return f"outputs {', '.join(missing)} of model {self.model.name} missing"
            for name in known:
                found = self._mismatch(self._specs[name], outputs[name], datatypes.get(name), rows)
                if found:
                    return found
            return None
        if self.model.batching:
            for name, array in outputs.items():
                if array.ndim == 0 or array.shape[0] != rows:
                    return f"output {name} has shape {list(array.shape)} for {rows} row(s) sent"
        return None

    def _mismatch(self, spec: TensorSpec, array: np.ndarray, datatype: str | None, rows: int) -> str | None:
        if datatype is not None and datatype != spec.datatype:
            return f"output {spec.name} is {datatype}, model declares {spec.datatype}"
        expected = [rows, *spec.shape] if self.model.batching else list(spec.shape)
        shape = list(array.shape)
        if len(shape) != len(expected) or any(e not in (-1, s) for e, s in zip(expected, shape, strict=True)):
            return f"output {spec.name} has shape {shape}, expected {expected} (-1: any)"
        return None
