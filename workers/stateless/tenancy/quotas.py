"""Per-tenant token buckets (aiolimiter's leaky bucket) and the capped metric label.

``rate`` r/s with ``burst`` b is ``AsyncLimiter(max_rate=b, time_period=b/r)``: the bucket
holds b and drains at b / (b/r) = r per second, which is a token bucket of size b refilled
at r. A request is admitted when the bucket has room for it *now* (``has_capacity``, then
``acquire``, which does not wait then): an over-quota request is never awaited, it gets its
outcome at once (delay topic or dead letter), so it never holds up other tenants.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from aiolimiter import AsyncLimiter

OTHER = "other"
NO_TENANT_LABEL = "none"
MAX_BUCKETS = 100_000
"""Buckets kept at once; past it the idlest is forgotten (that tenant starts with a full burst)."""


@dataclass(frozen=True)
class QuotaSpec:
    rate: float
    burst: int


class TenantQuotas:
    """Admission per tenant, and when an over-quota request of a tenant may come back."""

    def __init__(self, default: QuotaSpec, overrides: dict[str, QuotaSpec], *, max_delay_s: float) -> None:
        self.default = default
        self.overrides = overrides
        self.max_delay_s = max_delay_s
        self._buckets: OrderedDict[str, AsyncLimiter] = OrderedDict()
        self._scheduled: dict[str, float] = {}

    def quota(self, tenant: str) -> QuotaSpec:
        return self.overrides.get(tenant, self.default)

    async def admit(self, tenant: str) -> bool:
        """Take a token for ``tenant`` if one is there now; never waits."""
        bucket = self._buckets.get(tenant)
        if bucket is None:
            spec = self.quota(tenant)
            bucket = self._buckets[tenant] = AsyncLimiter(spec.burst, spec.burst / spec.rate)
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(tenant)
        if not bucket.has_capacity():
            return False
        await bucket.acquire()  # has room: returns without waiting
        return True

    def come_back_at(self, tenant: str, now: float | None = None) -> float:
        """Epoch seconds at which a request delayed now should be tried again.

        The tenant's delayed requests are spread one token interval apart after each other
        (so they come back at the tenant's rate, not all at once), at most ``max_delay_s`` ahead.
        """
        now = time.time() if now is None else now
        step = 1.0 / self.quota(tenant).rate
        due = min(max(now, self._scheduled.get(tenant, now)) + step, now + self.max_delay_s)
        self._scheduled[tenant] = due
        if len(self._scheduled) > MAX_BUCKETS:
            self._scheduled = {t: d for t, d in self._scheduled.items() if d > now}
        return due


class TenantLabels:
    """The ``tenant`` label of a tenant: its name for the configured tenants and the first
    ``limit`` seen, ``other`` for the rest (a caller must not blow up the series count)."""

    def __init__(self, configured: list[str], limit: int) -> None:
        self._named = set(configured)
        self._limit = max(limit, len(self._named))

    def __call__(self, tenant: str) -> str:
        if not tenant:
            return NO_TENANT_LABEL
        if tenant in self._named:
            return tenant
        if len(self._named) < self._limit:
            self._named.add(tenant)
            return tenant
        return OTHER
