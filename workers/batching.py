"""Dynamic batching: group compatible requests, release a group when full or old enough.

A group is keyed by everything that must be equal inside one Triton call
(model, version, tensor names, dtypes and per-row shapes, requested outputs,
priority, timeout). Requests of different shapes therefore never share a
batch and no padding is ever added. A group is released when it holds
``max_rows`` rows (or ``max_bytes`` of payload: 64 rows of 16 MiB must not become one
1 GiB gRPC call; or ``max_elements`` tensor elements: 64 rows padded to 4096 positions
cost Triton what their padded size says, not what their rows say) or its oldest
request has waited ``max_delay_s``.

No I/O here: the stage decides what to do with a released batch.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Batch(Generic[T]):
    key: Hashable
    items: list[T] = field(default_factory=list)
    rows: int = 0
    size: int = 0  # payload bytes
    elements: int = 0  # tensor elements, as sent (padded)
    opened_at: float = field(default_factory=time.monotonic)


class DynamicBatcher(Generic[T]):
    """Open groups by key; :meth:`add` and :meth:`due` return the batches to send now."""

    def __init__(
        self, max_rows: int, max_delay_s: float, max_bytes: int | None = None, max_elements: int | None = None
    ) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        self.max_rows = max_rows
        self.max_delay_s = max_delay_s
        self.max_bytes = max_bytes
        self.max_elements = max_elements
        self._open: dict[Hashable, Batch[T]] = {}

    def add(
        self, key: Hashable, item: T, rows: int, now: float | None = None, size: int = 0, elements: int = 0
    ) -> list[Batch[T]]:
        """Add ``item`` (``rows`` rows, ``size`` bytes, ``elements`` tensor elements); returns
        batches released by this addition. An item over ``max_bytes`` or ``max_elements`` on its
        own still goes, alone."""
        now = time.monotonic() if now is None else now
        released: list[Batch[T]] = []
        group = self._open.get(key)
        if group is not None and (
            group.rows + rows > self.max_rows or self._over(group.size + size, group.elements + elements)
        ):
            released.append(self._open.pop(key))
            group = None
        if group is None:
            group = self._open[key] = Batch(key=key, opened_at=now)
        group.items.append(item)
        group.rows += rows
        group.size += size
        group.elements += elements
        if group.rows >= self.max_rows or self._over(group.size, group.elements):
            released.append(self._open.pop(key))
        return released

    def _over(self, size: int, elements: int) -> bool:
        """Whether a group holding ``size`` bytes and ``elements`` elements is past a bound."""
        return (self.max_bytes is not None and size > self.max_bytes) or (
            self.max_elements is not None and elements > self.max_elements
        )

    def due(self, now: float | None = None) -> list[Batch[T]]:
        """Groups whose oldest request has waited ``max_delay_s``."""
        now = time.monotonic() if now is None else now
        ready = [k for k, g in self._open.items() if now - g.opened_at >= self.max_delay_s]
        return [self._open.pop(k) for k in ready]

    def next_due(self) -> float | None:
        """Monotonic time at which the next group becomes due, if any is open."""
        if not self._open:
            return None
        return min(g.opened_at for g in self._open.values()) + self.max_delay_s

    def drain(self) -> list[Batch[T]]:
        """Release every open group (shutdown, rebalance)."""
        batches = list(self._open.values())
        self._open.clear()
        return batches

    def __len__(self) -> int:
        return sum(len(g.items) for g in self._open.values())
