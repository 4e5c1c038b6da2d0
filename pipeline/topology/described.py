"""What the topology checks read of a model Triton serves (structural, so the checks stay pure logic).

:class:`pipeline.triton.admin.ModelDescription` satisfies these; tests pass small stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol


class TensorLike(Protocol):
    """What the checks read of one tensor of a model description."""

    @property
    def name(self) -> str: ...

    @property
    def datatype(self) -> str:
        """KServe v2 datatype name (``FP32``, ``INT64``, ``BYTES``...)."""
        ...

    @property
    def shape(self) -> Sequence[int]:
        """Per-item dims without the batch dimension; -1 = variable."""
        ...

    @property
    def optional(self) -> bool: ...


class ModelLike(Protocol):
    """What the checks read of a model description."""

    @property
    def inputs(self) -> Sequence[TensorLike]: ...

    @property
    def outputs(self) -> Sequence[TensorLike]: ...

    @property
    def max_batch_size(self) -> int: ...


Describe = Callable[[str, str], ModelLike]
"""``describe(model_name, version)``; raises when Triton cannot describe the model."""
