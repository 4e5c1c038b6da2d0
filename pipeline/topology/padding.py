"""``padding:`` of a stateless stage: length-aware batching of a variable-length input.

Without it a batch holds only requests of the exact same per-row shapes, so
token sequences of lengths 7, 9 and 12 each make their own tiny Triton call.
With it, the stage pads the named input up to the smallest bucket that holds
it (``np.pad`` with ``pad_value``), so requests group by *bucket*; it fills the
model's lengths (or mask) input itself, and trims the per-position outputs
listed in ``trim_outputs`` back to each request's true length, so a caller
never sees padding.

Tensor names here are the *model's* names (after ``input_map``). What the
model must look like (a variable dim on the padded input and on each trimmed
output, lengths/mask dtype and shape) is checked against Triton by
``pipeline validate`` (:mod:`pipeline.topology.padding_compat`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, model_validator

from pipeline.topology.fields import _located, _Strict

TensorName = Annotated[str, Field(min_length=1)]


class PaddingConfig(_Strict):
    """Pad one variable-length model input to length buckets, so mixed lengths share batches."""

    input: TensorName
    """Model input to pad; its shape must have exactly one variable (-1) dim, the length."""
    pad_value: float = 0.0
    """Value written into the padded positions (cast to the input's datatype)."""
    buckets: list[PositiveInt] = Field(min_length=1)
    """Padded lengths, strictly increasing: a request is padded to the first bucket >= its length."""
    lengths_input: TensorName | None = None
    """Model input (INT32/INT64, shape [1]) the stage fills with each row's true length."""
    mask_input: TensorName | None = None
    """Model input (the padded input's shape) the stage fills with 1 for real, 0 for padded positions."""
    trim_outputs: list[TensorName] = Field(default_factory=list)
    """Model outputs with one value per position (a variable dim): cut back to the true length."""
    too_long: Literal["dead_letter", "exact"] = "dead_letter"
    """A request longer than the last bucket: dead_letter (class ``length-out-of-range``) or
    exact (sent unpadded, batched only with requests of its exact length)."""
    max_batch_elements: PositiveInt | None = None
    """At most this many elements of the padded input per batch (rows x padded length x other
    dims), whatever its rows; a request larger than this goes alone. null = rows/bytes only."""

    @model_validator(mode="after")
    def _check(self) -> PaddingConfig:
        for index, (before, after) in enumerate(zip(self.buckets, self.buckets[1:], strict=False), start=1):
            if after <= before:
                raise _located(
                    f"buckets must be strictly increasing: {after} follows {before}", ("buckets", index)
                )
        if self.lengths_input is not None and self.mask_input is not None:
            raise _located("give lengths_input or mask_input, not both", ("mask_input",))
        for field in ("lengths_input", "mask_input"):
            if getattr(self, field) == self.input:
                raise _located(f"{field} names the padded input {self.input!r} itself", (field,))
        seen: set[str] = set()
        for index, name in enumerate(self.trim_outputs):
            if name in seen:
                raise _located(f"trim_outputs lists {name!r} twice", ("trim_outputs", index))
            seen.add(name)
        return self

    def bucket(self, length: int) -> int | None:
        """The padded length of a row of ``length`` positions; None when longer than every bucket."""
        return next((b for b in self.buckets if b >= length), None)
