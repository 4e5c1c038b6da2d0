"""Cumulative histogram buckets, and percentiles read from them as Prometheus reads them.

A snapshot carries a histogram as Prometheus exposes it: per upper bound ``le``,
the number of observations at or below it (cumulative, ``+Inf`` = all). Buckets of
several processes add up bound by bound (they share the bounds: one metrics
definition), and the observations of an interval are the later buckets minus the
earlier ones. :func:`quantile` is ``histogram_quantile``: linear interpolation inside
the bucket where the rank falls, so ``pipeline top`` and a Grafana panel agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Buckets:
    """Cumulative counts by upper bound (``math.inf`` included when the source had it)."""

    counts: Mapping[float, float] = field(default_factory=dict)

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[float, float]]) -> Buckets:
        counts: dict[float, float] = {}
        for bound, count in pairs:
            counts[bound] = counts.get(bound, 0.0) + count
        return cls(counts)

    @property
    def total(self) -> float:
        """Observations counted (the largest bound's count: ``+Inf``'s)."""
        return max(self.counts.values(), default=0.0)

    def __add__(self, other: Buckets) -> Buckets:
        return Buckets.from_pairs([*self.counts.items(), *other.counts.items()])

    def minus(self, earlier: Buckets) -> Buckets:
        """Observations made since ``earlier`` (a bound missing there counts as 0)."""
        return Buckets({bound: count - earlier.counts.get(bound, 0.0) for bound, count in self.counts.items()})


def quantile(q: float, buckets: Buckets) -> float | None:
    """The ``q``-quantile (0..1) of the observations, None when there are none.

    As Prometheus: within the bucket holding rank ``q * total``, interpolate linearly
    from the previous bound (0 for the first); a rank in the ``+Inf`` bucket answers
    the largest finite bound, as no upper value is known.
    """
    bounds = sorted(buckets.counts)
    total = buckets.total
    if not bounds or total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets.counts[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound
