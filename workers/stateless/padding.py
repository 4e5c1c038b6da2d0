"""Length-aware batching: pad a variable-length input to a bucket, fill lengths/mask, trim outputs.

A batching stage groups requests whose per-row shapes are equal (the backend's
``batch_key``). Padding a request to its bucket *before* it is keyed is all it
takes for lengths 7, 9 and 12 to share the batch of bucket 16. The model learns
each row's true length from the lengths (or mask) input, which the stage fills
so callers never send it; outputs with one value per position (``trim_outputs``)
are cut back to that length before the result is written, so callers never see
the padding either. The arriving message is never changed: intermediate stages
forward it unpadded.

Which dim is the length is read from the model's metadata at start-up (the one
-1 dim of the padded input), never guessed from a request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from tritonclient.utils import triton_to_np_dtype

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.request import InferenceRequest
from pipeline.errors import ConfigError
from pipeline.topology.described import ModelLike
from pipeline.topology.padding import PaddingConfig
from pipeline.topology.padding_compat import check_padding, variable_dims


@dataclass(frozen=True)
class Padded:
    """A request as the model gets it, and what is needed to undo the padding in its result."""

    request: InferenceRequest
    length: int  # the true length of every row of the request
    elements: int  # elements of the padded input: what the batch bound counts


@dataclass(frozen=True)
class _Bound:
    """What :meth:`Padder.bind` reads once from the model's metadata."""

    lead: int  # 1 when requests carry a batch dim, else 0
    axis: int  # the length's axis in a request's padded input (batch dim included)
    ndim: int
    extra: tuple[tuple[str, str, np.dtype], ...]  # (name, datatype, dtype) of lengths/mask
    trim_axes: dict[str, int]


class Padder:
    """Pads requests per a stage's ``padding:`` and trims their results."""

    def __init__(self, config: PaddingConfig, stage: str, model: str, describe: Callable[[], ModelLike | None]) -> None:
        self.config, self.stage, self.model = config, stage, model
        self._describe = describe
        self._bound: _Bound | None = None

    @property
    def max_batch_elements(self) -> int | None:
        return self.config.max_batch_elements

    def bind(self) -> None:
        """Read the length axis, the lengths/mask datatype and the trim axes from the model.

        The same checks as ``pipeline validate``: a stage started without it must
        not discover a wrong topology one dead letter at a time."""
        described = self._describe()
        if described is None:
            raise ConfigError(f"stage {self.stage!r}: model {self.model!r} is not described; cannot pad")
        problems = check_padding(self.stage, self.config, described, f"model {self.model!r}")
        if problems:
            raise ConfigError("; ".join(problems))
        c = self.config
        spec = next(t for t in described.inputs if t.name == c.input)
        lead = 1 if described.max_batch_size > 0 else 0
        extra = []
        for name in (c.lengths_input, c.mask_input):
            if name is not None:
                datatype = next(t.datatype for t in described.inputs if t.name == name).upper()
                extra.append((name, datatype, np.dtype(triton_to_np_dtype(datatype))))
        self._bound = _Bound(
            lead=lead,
            axis=lead + variable_dims(spec.shape)[0],
            ndim=lead + len(spec.shape),
            extra=tuple(extra),
            trim_axes={
                t.name: lead + variable_dims(t.shape)[0] for t in described.outputs if t.name in c.trim_outputs
            },
        )

    def pad(self, request: InferenceRequest) -> Padded:
        """The request with its input padded to its bucket and the lengths/mask input added.

        Raises :class:`BadRequest` for a request the stage must not pad: one that sends
        the lengths/mask input itself, lacks the padded input, has the wrong rank, or is
        longer than the last bucket (with ``too_long: dead_letter``)."""
        assert self._bound is not None, "bind() first"
        b, c = self._bound, self.config
        for name, _, _ in b.extra:
            if name in request.inputs:
                raise BadRequest(
                    ErrorClass.UNKNOWN_INPUT, f"input {name!r} is filled by the stage from {c.input!r}; do not send it"
                )
        array = request.inputs.get(c.input)
        if array is None:
            raise BadRequest(ErrorClass.MISSING_INPUT, f"missing input {c.input!r}")
        if array.ndim != b.ndim:
            raise BadRequest(
                ErrorClass.SHAPE_MISMATCH, f"input {c.input!r} has shape {list(array.shape)}: {b.ndim} dims expected"
            )
        length = int(array.shape[b.axis])
        target = c.bucket(length)
        if target is None:
            if c.too_long == "dead_letter":
                raise BadRequest(
                    ErrorClass.LENGTH_OUT_OF_RANGE,
                    f"input {c.input!r} has length {length}, longer than the largest padding bucket {c.buckets[-1]}",
                )
            target = length  # too_long: exact, batched only with requests of this very length
        widths = [(0, 0)] * array.ndim
        widths[b.axis] = (0, target - length)
        padded = np.pad(array, widths, mode="constant", constant_values=np.asarray(c.pad_value, array.dtype))
        rows = int(array.shape[0]) if b.lead else 1
        inputs = {**request.inputs, c.input: padded}
        datatypes = dict(request.datatypes)
        for name, datatype, dtype in b.extra:
            if name == c.lengths_input:
                inputs[name] = np.full((rows, 1) if b.lead else (1,), length, dtype)
            else:
                mask = np.zeros(padded.shape, dtype)
                index = [slice(None)] * padded.ndim
                index[b.axis] = slice(0, length)
                mask[tuple(index)] = 1
                inputs[name] = mask
            datatypes[name] = datatype
        return Padded(replace(request, inputs=inputs, datatypes=datatypes), length, int(padded.size))

    def trim(self, outputs: dict[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
        """``outputs`` with every ``trim_outputs`` tensor cut back to ``length`` positions."""
        assert self._bound is not None, "bind() first"
        trimmed = dict(outputs)
        for name, axis in self._bound.trim_axes.items():
            array = outputs.get(name)
            if array is not None and array.ndim > axis:
                index = [slice(None)] * array.ndim
                index[axis] = slice(0, length)
                trimmed[name] = array[tuple(index)]
        return trimmed
