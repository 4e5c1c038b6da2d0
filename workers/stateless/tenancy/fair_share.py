"""A fair share of one batch's rows between the tenants waiting in it (max-min fairness).

When more rows wait than one call takes, each tenant with rows waiting gets an equal share
of ``max_rows``; a tenant needing less than its share leaves the rest to the others
(water-filling), so a busy tenant still fills a batch nobody else needs. Within a tenant,
requests go first in, first out, and a request is never split: a tenant whose next
request is larger than what its share has left stops there. The oldest request waiting
always goes, so a single request larger than every share is never starved.

Pure logic: :class:`workers.stateless.batching.DynamicBatcher` calls :func:`fair_pick` when a group
holds more rows than one call takes (``pick`` hook).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def fair_pick(waiting: Sequence[tuple[Hashable, int]], max_rows: int) -> list[int]:
    """Indexes (in arrival order) of the requests that go in the next batch.

    ``waiting``: (tenant, rows) of each request, oldest first.
    """
    if not waiting:
        return []
    queues: dict[Hashable, list[int]] = {}
    for index, (tenant, _) in enumerate(waiting):
        queues.setdefault(tenant, []).append(index)
    first = waiting[0][0]
    chosen = [0]  # the oldest request always goes (so a large one is never starved), in its tenant's share
    used = dict.fromkeys(queues, 0)
    used[first] = waiting[0][1]
    heads = {tenant: (1 if tenant == first else 0) for tenant in queues}
    left = max_rows - waiting[0][1]

    def head(tenant: Hashable) -> int | None:
        return queues[tenant][heads[tenant]] if heads[tenant] < len(queues[tenant]) else None

    def take(tenant: Hashable) -> None:
        nonlocal left
        index = queues[tenant][heads[tenant]]
        chosen.append(index)
        heads[tenant] += 1
        used[tenant] += waiting[index][1]
        left -= waiting[index][1]

    level = 0  # the water level: each tenant's rows so far may reach it
    active = [t for t in queues if head(t) is not None]
    while left > 0 and active:
        level += max(left // len(active), 1)
        progressed = False
        for tenant in active:
            while (nxt := head(tenant)) is not None and waiting[nxt][1] <= min(level - used[tenant], left):
                take(tenant)
                progressed = True
        if not progressed:
            # Every head is larger than an equal share but one may fit what is left: the oldest goes.
            fitting = [t for t in active if (i := head(t)) is not None and waiting[i][1] <= left]
            if not fitting:
                break
            take(min(fitting, key=lambda t: queues[t][heads[t]]))
        active = [t for t in active if (i := head(t)) is not None and waiting[i][1] <= left]
    return sorted(chosen)
