"""The requests a bench run sends: random tensors shaped by the model's Triton metadata.

The same generator as ``pipeline produce --random``
(:func:`pipeline.tools.sources.random_requests`). A fixed pool is drawn once
and cycled, so drawing random numbers costs nothing inside the measured
steps, and both paths (Kafka and direct Triton) send the same tensors.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.tools.sources import RequestTemplate, random_requests
from pipeline.triton.admin import ModelDescription

#: Distinct requests drawn, then cycled.
POOL_SIZE = 256


@dataclass(frozen=True)
class Workload:
    """The model, the pool of requests and the rows each request carries."""

    model: ModelDescription
    templates: tuple[RequestTemplate, ...]
    rows: int
    """Rows per request (the batch dimension a batching model's outputs must match)."""

    @classmethod
    def random(cls, model: ModelDescription, *, seed: int = 0, length: int = 16, size: int = POOL_SIZE) -> Workload:
        templates = tuple(itertools.islice(random_requests(model, length=length, seed=seed), size))
        first = next(iter(templates[0].inputs.values()))
        rows = int(first.shape[0]) if model.batching and first.ndim else 1
        return cls(model=model, templates=templates, rows=rows)

    def cycle(self) -> Iterator[RequestTemplate]:
        return itertools.cycle(self.templates)
