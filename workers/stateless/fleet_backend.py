"""One stateless model on several Triton replicas: a channel each, every batch to the least
busy replica that is up (issue 27).

A worker with one channel to a Kubernetes Service keeps feeding the one pod its HTTP/2
connection landed on, however many replicas are added. Here each replica
(:mod:`pipeline.triton.replicas`: a list of endpoints, or a DNS name of all of them,
resolved again every ``resolve_every_s``) gets its own :class:`TritonModelBackend`: its own
channel, model description and failure classifier.

**Choosing.** A batch goes to the replica with the fewest batches in flight among those
up; ties go to the one chosen longest ago, so light load rotates over all of them.

**Failing.** The replica's own classifier says what a failed call was. An *outage* of that
replica (nothing answers, the server or the model is not ready, or it is overloaded) takes
it out of the choice; it is probed every ``probe_every_s`` and comes back once it answers
ready with the model ready. While another replica is up, that failure is *transient* for
the batch: the stage's one failure policy retries it, and the retry goes to another
replica. With none left it is the stage's outage, waited out as with one server. Other
failures (the request's fault, a transient "not now") are the replica's classification,
unchanged.

Requests are checked, counted in rows and keyed for batching against the first replica
that was set up: every replica serves the same model from the same store.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from pipeline.contract.errors import ErrorClass
from pipeline.contract.request import InferenceRequest
from pipeline.failure_policy import Failure, FailureKind
from pipeline.observability.tracing import CallSpan
from pipeline.triton.admin import ModelDescription
from pipeline.triton.replicas import ReplicaSpec
from workers.stateless.backend import BatchBackend, BatchOutput
from workers.stateless.triton_backend import TritonModelBackend

log = logging.getLogger(__name__)

PROBE_EVERY_S = 1.0
RESOLVE_EVERY_S = 30.0


class ReplicaBackend(BatchBackend, Protocol):
    """A :class:`BatchBackend` that can also say whether its server and model are ready."""

    async def ready(self) -> bool: ...


@dataclass
class Replica:
    endpoint: str
    backend: ReplicaBackend
    set_up: bool = False
    up: bool = False
    leaving: bool = False  # no longer resolved: never chosen again, closed once idle
    inflight: int = 0
    chosen: int = 0  # when it was last chosen (a counter): ties go to the one chosen longest ago


class ReplicaCallFailed(Exception):
    """A call on one replica failed: carries the replica, so its own classifier judges the cause."""

    def __init__(self, replica: Replica, cause: BaseException) -> None:
        super().__init__(f"Triton replica {replica.endpoint}: {cause}")
        self.replica, self.cause = replica, cause


class NoReplicaUp(Exception):
    """Every replica is out: the stage's outage."""


class FleetBackend:
    """Serve batches of one model on the least busy of several Triton replicas."""

    device: str | None = None

    def __init__(
        self,
        spec: ReplicaSpec,
        make: Callable[[str], ReplicaBackend],
        *,
        name: str,
        call_span: CallSpan,
        probe_every_s: float = PROBE_EVERY_S,
        resolve_every_s: float = RESOLVE_EVERY_S,
    ) -> None:
        self.spec, self._make = spec, make
        self.name, self.call_span = name, call_span
        self.probe_every_s, self.resolve_every_s = probe_every_s, resolve_every_s
        self.replicas: dict[str, Replica] = {}
        self._reference: Replica | None = None
        self._ticks = itertools.count(1)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._maintainer: asyncio.Task[None] | None = None
        self._limit = 0

    # ------------------------------------------------------------------ lifecycle
    async def setup(self) -> int:
        """Set every replica up at once; ready as soon as one is (the others join when they
        are). Returns the row limit per call of the first one set up."""
        endpoints = await self.spec.resolve()
        if not endpoints:
            raise NoReplicaUp(f"no Triton replica: {self.spec} resolves to nothing")
        for endpoint in endpoints:
            self._add(endpoint)
        while self._reference is None:
            pending = [t for t in self._tasks.values() if not t.done()]
            if not pending:
                failures = [t.exception() for t in self._tasks.values() if not t.cancelled()]
                raise NoReplicaUp(f"no Triton replica could be set up: {failures}")
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        self._maintainer = asyncio.create_task(self._maintain(), name=f"triton-fleet-{self.name}")
        return self._limit

    def _add(self, endpoint: str) -> None:
        replica = Replica(endpoint, self._make(endpoint))
        self.replicas[endpoint] = replica
        self._tasks[endpoint] = asyncio.create_task(self._set_up(replica), name=f"triton-replica-{endpoint}")

    async def _set_up(self, replica: Replica) -> None:
        try:
            limit = await replica.backend.setup()
        except Exception as exc:
            log.warning("%s: Triton replica %s could not be set up (%s); trying again", self.name, replica.endpoint, exc)
            raise
        replica.set_up, replica.up = True, not replica.leaving
        if self._reference is None:
            self._reference, self._limit = replica, limit
        elif limit != self._limit:
            log.warning("%s: replica %s allows %d rows per call, the first one %d", self.name, replica.endpoint, limit, self._limit)
        log.info("%s: Triton replica %s is up (%d of %d)", self.name, replica.endpoint, self._count_up(), len(self.replicas))

    async def close(self) -> None:
        tasks = [t for t in (self._maintainer, *self._tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(r.backend.close() for r in self.replicas.values()), return_exceptions=True)

    async def warmup(self) -> None:
        await asyncio.gather(*(r.backend.warmup() for r in self.replicas.values() if r.up))

    @property
    def model(self) -> str:
        return self.name

    @property
    def description(self) -> ModelDescription | None:
        """The model as the first replica set up describes it (padding reads its inputs)."""
        backend = self._reference.backend if self._reference is not None else None
        return backend.description if isinstance(backend, TritonModelBackend) else None

    # ------------------------------------------------------------------ requests
    def _first(self) -> ReplicaBackend:
        assert self._reference is not None, "setup() first"
        return self._reference.backend

    def check(self, request: InferenceRequest) -> object:
        return self._first().check(request)

    def rows(self, request: InferenceRequest) -> int:
        return self._first().rows(request)

    def batch_key(self, request: InferenceRequest) -> Hashable:
        return self._first().batch_key(request)

    async def run(self, requests: Sequence[InferenceRequest], prepared: Sequence[object]) -> BatchOutput:
        replica = self._choose()
        replica.inflight += 1
        try:
            return await replica.backend.run(requests, prepared)
        except Exception as exc:
            raise ReplicaCallFailed(replica, exc) from exc
        finally:
            replica.inflight -= 1

    def _choose(self) -> Replica:
        up = [r for r in self.replicas.values() if r.up]
        if not up:
            raise NoReplicaUp(f"none of the {len(self.replicas)} Triton replicas of {self.name} is up")
        replica = min(up, key=lambda r: (r.inflight, r.chosen))
        replica.chosen = next(self._ticks)
        return replica

    async def classify(self, exc: BaseException) -> Failure:
        if isinstance(exc, NoReplicaUp):
            return Failure(FailureKind.OUTAGE, ErrorClass.MODEL_UNAVAILABLE, str(exc))
        if not isinstance(exc, ReplicaCallFailed):
            return await self._first().classify(exc)
        replica = exc.replica
        failure = await replica.backend.classify(exc.cause)
        if failure.kind is not FailureKind.OUTAGE:
            return failure
        if replica.up:
            replica.up = False
            log.warning("%s: Triton replica %s is out (%s); %d of %d up", self.name, replica.endpoint,
                        failure.reason, self._count_up(), len(self.replicas))  # fmt: skip
        if self._count_up() == 0:
            return failure
        return replace(failure, kind=FailureKind.TRANSIENT, reason=f"replica {replica.endpoint}: {failure.reason}; retried on another")

    def _count_up(self) -> int:
        return sum(1 for r in self.replicas.values() if r.up)

    # ------------------------------------------------------------------ upkeep
    async def _maintain(self) -> None:
        """Probe the replicas that are out; resolve the DNS names again now and then."""
        since_resolve = 0.0
        while True:
            await asyncio.sleep(self.probe_every_s)
            for replica in list(self.replicas.values()):
                task = self._tasks.get(replica.endpoint)
                if not replica.set_up and task is not None and task.done():
                    if not task.cancelled():
                        task.exception()  # logged by _set_up; retrieved, so asyncio does not log it again
                    self._tasks[replica.endpoint] = asyncio.create_task(self._set_up(replica))  # it failed: again
                elif replica.set_up and not replica.up and not replica.leaving and await replica.backend.ready():
                    replica.up = True
                    log.info("%s: Triton replica %s is back (%d of %d up)", self.name, replica.endpoint,
                             self._count_up(), len(self.replicas))  # fmt: skip
            since_resolve += self.probe_every_s
            if self.spec.dns_names and since_resolve >= self.resolve_every_s:
                since_resolve = 0.0
                await self._resolve_again()

    async def _resolve_again(self) -> None:
        """New addresses join (set up in the background); vanished ones take no more batches
        and leave once idle. The replica that answers the checks is handed over first."""
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
        if self._reference is not None and self._reference.leaving:
            staying = [r for r in self.replicas.values() if r.set_up and not r.leaving]
            if staying:
                self._reference = staying[0]
        for endpoint in [e for e, r in self.replicas.items() if r.leaving and not r.inflight and r is not self._reference]:
            replica = self.replicas.pop(endpoint)
            task = self._tasks.pop(endpoint, None)
            if task is not None:
                task.cancel()
            with contextlib.suppress(Exception):
                await replica.backend.close()
            log.info("%s: Triton replica %s left (no longer resolved)", self.name, endpoint)
