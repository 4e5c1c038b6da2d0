"""``padding:`` of a stage against the model Triton serves (``pipeline validate``, stage start-up).

The YAML alone cannot say whether the padded input really has a variable
length, or whether the lengths input is an integer of shape [1]: only the
model's metadata can. Each problem is one sentence naming the stage and tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.topology.described import ModelLike, TensorLike
from pipeline.topology.padding import PaddingConfig

LENGTH_DATATYPES = ("INT32", "INT64")
MASK_DATATYPES = ("BOOL", "INT8", "INT32", "INT64", "FP16", "FP32")


def variable_dims(shape: Sequence[int]) -> list[int]:
    """Positions of the variable (-1) dims of a per-row shape."""
    return [axis for axis, dim in enumerate(shape) if dim < 0]


def _find(tensors: Sequence[TensorLike], name: str) -> TensorLike | None:
    return next((t for t in tensors if t.name == name), None)


def check_padding(stage: str, padding: PaddingConfig, model: ModelLike, label: str) -> list[str]:
    """Problems between a stage's ``padding`` and its model (``label``: "model 'x'"); [] = fine."""
    at = f"stage {stage!r}: padding"
    names = ", ".join(t.name for t in model.inputs) or "none"
    padded = _find(model.inputs, padding.input)
    if padded is None:
        return [f"{at}.input {padding.input!r} is not an input of {label} (its inputs: {names})"]
    problems = []
    axes = variable_dims(padded.shape)
    if len(axes) != 1:
        what = "no variable (-1) dim" if not axes else f"{len(axes)} variable (-1) dims"
        problems.append(
            f"{at}.input {padding.input!r} has shape {list(padded.shape)} in {label}: {what}; "
            "padding needs exactly one, the length"
        )
    if padded.datatype.upper() == "BYTES":
        problems.append(f"{at}.input {padding.input!r} is BYTES in {label}: only numeric tensors are padded")
    if padding.lengths_input is not None:
        lengths = _find(model.inputs, padding.lengths_input)
        if lengths is None:
            problems.append(f"{at}.lengths_input {padding.lengths_input!r} is not an input of {label} (its inputs: {names})")
        elif lengths.datatype.upper() not in LENGTH_DATATYPES or list(lengths.shape) != [1]:
            problems.append(
                f"{at}.lengths_input {padding.lengths_input!r} is {lengths.datatype} {list(lengths.shape)} "
                f"in {label}; it must be INT32 or INT64 [1]"
            )
    if padding.mask_input is not None:
        mask = _find(model.inputs, padding.mask_input)
        if mask is None:
            problems.append(f"{at}.mask_input {padding.mask_input!r} is not an input of {label} (its inputs: {names})")
        elif mask.datatype.upper() not in MASK_DATATYPES or list(mask.shape) != list(padded.shape):
            problems.append(
                f"{at}.mask_input {padding.mask_input!r} is {mask.datatype} {list(mask.shape)} in {label}; "
                f"it must have {padding.input!r}'s shape {list(padded.shape)} and one of "
                f"{', '.join(MASK_DATATYPES)}"
            )
    outputs = ", ".join(t.name for t in model.outputs) or "none"
    for name in padding.trim_outputs:
        output = _find(model.outputs, name)
        if output is None:
            problems.append(f"{at}.trim_outputs {name!r} is not an output of {label} (its outputs: {outputs})")
        elif not variable_dims(output.shape):
            problems.append(
                f"{at}.trim_outputs {name!r} has shape {list(output.shape)} in {label}: "
                "no variable (-1) dim to trim"
            )
    return problems
