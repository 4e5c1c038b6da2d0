"""Which route serves a record: sticky weighted choice by key, or the ``task`` header.

Weighted routes (canary, A/B): the record key (else its correlation ID) is hashed
with BLAKE2b, never Python's salted ``hash()``, to a point in [0, 1) which falls
into one route's share of the cumulative weights. The same key therefore lands on
the same route in every process, after every restart and rebalance, and the shares
converge to the weights over many keys. Changing the weights moves only the keys
whose point crosses a boundary that moved.

Task routes (multi-task): the ``task`` header names the route; no header, or a
name no route has, is the request's fault (``unknown-task`` dead letter).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.contract import headers as h
from pipeline.contract.errors import BadRequest, ErrorClass

_HASH_BYTES = 8
_HASH_SPAN = float(1 << (8 * _HASH_BYTES))


@dataclass(frozen=True)
class Route:
    """One route as the stage sees it (from the topology's ``routes``)."""

    name: str
    model: str
    model_version: str = ""
    weight: float | None = None


def stable_point(key: bytes) -> float:
    """``key``'s point in [0, 1): the same in every process (BLAKE2b, 64 bits)."""
    digest = hashlib.blake2b(key, digest_size=_HASH_BYTES).digest()
    return int.from_bytes(digest, "big") / _HASH_SPAN


class RouteTable:
    """Pick a route per record, by key and weight or by task header."""

    def __init__(self, routes: Sequence[Route], *, by_task: bool) -> None:
        if not routes:
            raise ValueError("a route table needs at least one route")
        self.routes = list(routes)
        self.by_task = by_task
        self._by_name = {route.name: route for route in self.routes}
        if not by_task:
            total = sum(route.weight or 0.0 for route in self.routes)
            if total <= 0:
                raise ValueError("weights must not all be zero")
            # Cumulative upper bounds; a zero-weight route gets an empty share.
            self._bounds = [b / total for b in itertools.accumulate(route.weight or 0.0 for route in self.routes)]

    def pick(self, key: bytes | None, correlation_id: str, headers: h.HeaderPairs | None) -> Route:
        """The route of one record; raises :class:`BadRequest` (``unknown-task``) when it has none."""
        if self.by_task:
            return self._by_task(headers)
        point = stable_point(key if key else correlation_id.encode("utf-8"))
        index = bisect.bisect_right(self._bounds, point)
        # Float rounding can leave the last bound a hair under 1.0; and skip empty shares.
        index = min(index, len(self.routes) - 1)
        while not self.routes[index].weight and index > 0:
            index -= 1
        return self.routes[index]

    def _by_task(self, headers: h.HeaderPairs | None) -> Route:
        task = h.get_header(headers, h.TASK)
        if task is None:
            raise BadRequest(ErrorClass.UNKNOWN_TASK, f"no {h.TASK!r} header; tasks: {', '.join(self._by_name)}")
        route = self._by_name.get(task)
        if route is None:
            raise BadRequest(ErrorClass.UNKNOWN_TASK, f"task {task!r} is none of {', '.join(self._by_name)}")
        return route
