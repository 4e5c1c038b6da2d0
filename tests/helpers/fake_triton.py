"""Stand-ins for the model metadata Triton reports (``pipeline.triton.admin``), for offline tests.

They carry only the fields the code under test reads (name, datatype, per-item
shape, optional; a model's inputs, outputs and max batch size), so a test
states a model in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FakeTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True)
class FakeModel:
    inputs: list[FakeTensor]
    outputs: list[FakeTensor]
    max_batch_size: int = 64


@dataclass
class FakeTriton:
    """``describe`` answers like ``TritonAdmin.describe``: a model, or an error for a missing one."""

    models: dict[str, FakeModel] = field(default_factory=dict)

    def describe(self, name: str, version: str = "") -> FakeModel:
        if name not in self.models:
            raise RuntimeError(f"Triton has no model {name!r}")
        return self.models[name]
