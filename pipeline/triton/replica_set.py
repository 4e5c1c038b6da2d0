"""A stage's Triton replicas, up or out, joining and leaving: what a stateless fleet and a
sequence fleet share (issue 27). What each replica holds (a model backend, a sequence
model's channel) is the stage's; which replica a call goes to is the caller's choice among
:meth:`ReplicaSet.up`, by load (:meth:`least_busy`) or by key (:meth:`by_key`).

- **Start.** Every replica of :class:`~pipeline.triton.replicas.ReplicaSpec` is set up at
  once; the set is ready as soon as one is, the others join when they are, and one that
  failed to set up is tried again every ``probe_every_s``.
- **Out and back.** :meth:`failed` hears each failed call's classification. An *outage* of
  one replica (nothing answers, the server or model not ready, overloaded) takes it out;
  while another is up, that failure is *transient* for the call: the stage's one failure
  policy retries it and the retry goes elsewhere. With none up it stays the stage's outage.
  A replica that is out is probed every ``probe_every_s`` and is back once it answers ready
  with the model ready. A set of one server never takes it out: it behaves as before.
- **Joining and leaving.** The DNS names are resolved again every ``resolve_every_s``: new
  addresses join, vanished ones take no new call and leave once idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from pipeline.errors import ConfigError
from pipeline.failure_policy import Failure, FailureKind
from pipeline.triton.replicas import ReplicaSpec

log = logging.getLogger(__name__)

PROBE_EVERY_S = 1.0
RESOLVE_EVERY_S = 30.0


class Member(Protocol):
    """What the set needs of what a replica holds."""

    async def close(self) -> None: ...

    async def ready(self) -> bool:
        """Whether the server answers ready with the model ready on it."""


M = TypeVar("M", bound=Member)


@dataclass
class Replica(Generic[M]):
    endpoint: str
    member: M
    set_up: bool = False
    up: bool = False
    leaving: bool = False  # no longer resolved: never chosen again, closed once idle
    setup_result: object = None  # what setting it up returned (a model's row limit)
    inflight: int = 0
    chosen: int = 0  # when it was last chosen (a counter): ties go to the one chosen longest ago


def rendezvous_weight(key: bytes, endpoint: str) -> bytes:
    """How highly ``endpoint`` ranks for ``key`` (highest random weight hashing): a key's
    replica is the one up with the greatest weight. Public so that a test or an operator
    can say, from the endpoint list alone, which replica a stream is pinned to."""
    return hashlib.blake2b(key + b"\0" + endpoint.encode(), digest_size=8).digest()


def pinned_endpoint(key: bytes, endpoints: Iterable[str]) -> str:
    """The endpoint ``key`` is pinned to while all of ``endpoints`` are up (:meth:`ReplicaSet.by_key`)."""
    return max(endpoints, key=lambda endpoint: rendezvous_weight(key, endpoint))


class NoReplicaUp(Exception):
    """Every replica is out: the stage's outage."""


class ReplicaSet(Generic[M]):
    """The replicas of ``spec``, each holding a member made by ``make`` and set up by ``set_up``."""

    def __init__(
        self,
        spec: ReplicaSpec,
        make: Callable[[str], M],
        set_up: Callable[[M], Awaitable[object]],
        *,
        label: str,
        probe_every_s: float = PROBE_EVERY_S,
        resolve_every_s: float = RESOLVE_EVERY_S,
    ) -> None:
        self.spec, self._make, self._set_up_member = spec, make, set_up
        self.label, self.probe_every_s, self.resolve_every_s = label, probe_every_s, resolve_every_s
        self.replicas: dict[str, Replica[M]] = {}
        self.first: Replica[M] | None = None
        """The first replica set up, whose answers (a model's description) stand for all;
        handed over when it leaves."""
        self._ticks = itertools.count(1)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._upkeep: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> Replica[M]:
        """Set every replica up; returns once one is (the first), raising when none can be."""
        if not self.spec.endpoints and not self.spec.dns_names:
            raise ConfigError("no Triton endpoint configured: set PIPELINE_TRITON_GRPC_URL")
        endpoints = await self.spec.resolve()
        if not endpoints:
            raise NoReplicaUp(f"{self.label}: no Triton replica: {self.spec} resolves to nothing")
        for endpoint in endpoints:
            self._add(endpoint)
        while self.first is None:
            pending = [t for t in self._tasks.values() if not t.done()]
            if not pending:
                failures = [t.exception() for t in self._tasks.values() if not t.cancelled()]
                raise NoReplicaUp(f"{self.label}: no Triton replica could be set up: {failures}")
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if len(self.replicas) > 1 or self.spec.dns_names:
            self._upkeep = asyncio.create_task(self._keep_up(), name=f"triton-replicas-{self.label}")
        return self.first

    def _add(self, endpoint: str) -> None:
        replica = Replica(endpoint, self._make(endpoint))
        self.replicas[endpoint] = replica
        self._tasks[endpoint] = asyncio.create_task(self._start_one(replica), name=f"triton-replica-{endpoint}")

    async def _start_one(self, replica: Replica[M]) -> None:
        try:
            replica.setup_result = await self._set_up_member(replica.member)
        except Exception as exc:
            log.warning(
                "%s: Triton replica %s could not be set up (%s); trying again", self.label, replica.endpoint, exc
            )
            raise
        replica.set_up, replica.up = True, not replica.leaving
        if self.first is None:
            self.first = replica
        if len(self.replicas) > 1:
            log.info(
                "%s: Triton replica %s is up (%d of %d)",
                self.label,
                replica.endpoint,
                self.count_up(),
                len(self.replicas),
            )

    async def close(self) -> None:
        tasks = [t for t in (self._upkeep, *self._tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(r.member.close() for r in self.replicas.values()), return_exceptions=True)

    # ------------------------------------------------------------------ choosing
    def up(self) -> list[Replica[M]]:
        up = [r for r in self.replicas.values() if r.up]
        if not up:
            raise NoReplicaUp(f"{self.label}: none of its {len(self.replicas)} Triton replicas is up")
        return up

    def count_up(self) -> int:
        return sum(1 for r in self.replicas.values() if r.up)

    def least_busy(self) -> Replica[M]:
        """The replica up with the fewest calls in flight; ties: the one chosen longest ago."""
        replica = min(self.up(), key=lambda r: (r.inflight, r.chosen))
        replica.chosen = next(self._ticks)
        return replica

    def by_key(self, key: bytes) -> Replica[M]:
        """The replica up that ranks highest for ``key`` (rendezvous hashing): a key stays on
        its replica while that one is up; a replica leaving moves only its own keys, and one
        joining takes about 1/N of them. One replica up is the answer without hashing (every
        audio frame asks, and most stages have one Triton)."""
        up = self.up()
        if len(up) == 1:
            return up[0]
        return max(up, key=lambda r: rendezvous_weight(key, r.endpoint))

    # ------------------------------------------------------------------ failures
    def failed(self, replica: Replica[M], failure: Failure) -> Failure:
        """A call on ``replica`` failed as ``failure`` says: what it means for the call."""
        if failure.kind is not FailureKind.OUTAGE or len(self.replicas) == 1:
            return failure
        if replica.up:
            replica.up = False
            log.warning("%s: Triton replica %s is out (%s); %d of %d up", self.label, replica.endpoint,
                        failure.reason, self.count_up(), len(self.replicas))  # fmt: skip
        if self.count_up() == 0:
            return failure
        return replace(
            failure,
            kind=FailureKind.TRANSIENT,
            reason=f"replica {replica.endpoint}: {failure.reason}; retried on another",
        )

    # ------------------------------------------------------------------ upkeep
    async def _keep_up(self) -> None:
        """Set up again what failed to, probe what is out, resolve the DNS names now and then."""
        since_resolve = 0.0
        while True:
            await asyncio.sleep(self.probe_every_s)
            for replica in list(self.replicas.values()):
                task = self._tasks.get(replica.endpoint)
                if not replica.set_up and task is not None and task.done():
                    if not task.cancelled():
                        task.exception()  # logged by _start_one; retrieved, so asyncio does not log it again
                    self._tasks[replica.endpoint] = asyncio.create_task(self._start_one(replica))
                elif replica.set_up and not replica.up and not replica.leaving and await replica.member.ready():
                    replica.up = True
                    log.info("%s: Triton replica %s is back (%d of %d up)", self.label, replica.endpoint,
                             self.count_up(), len(self.replicas))  # fmt: skip
            since_resolve += self.probe_every_s
            if self.spec.dns_names and since_resolve >= self.resolve_every_s:
                since_resolve = 0.0
                await self._resolve_again()

    async def _resolve_again(self) -> None:
        endpoints = await self.spec.resolve()
        if not endpoints:
            return  # resolving failed or found nothing: keep what we have
        for endpoint in endpoints:
            if endpoint not in self.replicas:
                self._add(endpoint)
        for endpoint, replica in self.replicas.items():
            replica.leaving = endpoint not in endpoints
            if replica.leaving:
                replica.up = False
        if self.first is not None and self.first.leaving:
            staying = [r for r in self.replicas.values() if r.set_up and not r.leaving]
            if staying:
                self.first = staying[0]
        for endpoint in [e for e, r in self.replicas.items() if r.leaving and not r.inflight and r is not self.first]:
            replica = self.replicas.pop(endpoint)
            task = self._tasks.pop(endpoint, None)
            if task is not None:
                task.cancel()
            with contextlib.suppress(Exception):
                await replica.member.close()
            log.info("%s: Triton replica %s left (no longer resolved)", self.label, endpoint)
