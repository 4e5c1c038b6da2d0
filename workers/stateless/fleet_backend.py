"""One stateless model on several Triton replicas: a channel each, every batch to the least
busy replica that is up (issue 27).

A worker with one channel to a Kubernetes Service keeps feeding the one pod its HTTP/2
connection landed on, however many replicas are added. Here each replica of
:mod:`pipeline.triton.replicas` (a list of endpoints, or a DNS name of all of them) gets its
own :class:`TritonModelBackend`: its own channel, model description and failure classifier.
Which replicas are up, and what a replica's outage means for a batch (transient while
another is up: the stage's one failure policy retries it, and the retry goes elsewhere), is
:class:`pipeline.triton.replica_set.ReplicaSet`'s. A batch goes to the replica with the
fewest batches in flight; ties rotate.

Requests are checked, counted in rows and keyed for batching against the first replica set
up: every replica serves the same model from the same store.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from pipeline.contract.errors import ErrorClass
from pipeline.contract.request import InferenceRequest
from pipeline.failure_policy import Failure, FailureKind
from pipeline.observability.tracing import CallSpan
from pipeline.triton.admin import ModelDescription
from pipeline.triton.replica_set import NoReplicaUp, Replica, ReplicaSet
from pipeline.triton.replicas import ReplicaSpec
from workers.stateless.backend import BatchOutput
from workers.stateless.triton_backend import TritonModelBackend


class ReplicaCallFailed(Exception):
    """A call on one replica failed: carries the replica, so its own classifier judges the cause."""

    def __init__(self, replica: Replica[TritonModelBackend], cause: BaseException) -> None:
        super().__init__(f"Triton replica {replica.endpoint}: {cause}")
        self.replica, self.cause = replica, cause


class FleetBackend:
    """Serve batches of one model on the least busy of several Triton replicas."""

    device: str | None = None

    def __init__(
        self,
        spec: ReplicaSpec,
        make: Callable[[str], TritonModelBackend],
        *,
        name: str,
        call_span: CallSpan,
        probe_every_s: float | None = None,
        resolve_every_s: float | None = None,
    ) -> None:
        self.name, self.call_span = name, call_span
        timing = {k: v for k, v in (("probe_every_s", probe_every_s), ("resolve_every_s", resolve_every_s)) if v}
        self.replicas: ReplicaSet[TritonModelBackend] = ReplicaSet(
            spec, make, lambda backend: backend.setup(), label=name, **timing
        )

    # ------------------------------------------------------------------ lifecycle
    async def setup(self) -> int:
        """Ready as soon as one replica is; its row limit per call is the stage's."""
        limit = (await self.replicas.start()).setup_result
        return limit if isinstance(limit, int) else 0

    async def close(self) -> None:
        await self.replicas.close()

    async def warmup(self) -> None:
        for replica in self.replicas.up():
            await replica.member.warmup()

    @property
    def model(self) -> str:
        return self.name

    @property
    def description(self) -> ModelDescription | None:
        """The model as the first replica set up describes it (padding reads its inputs)."""
        return self._first().description

    # ------------------------------------------------------------------ requests
    def _first(self) -> TritonModelBackend:
        assert self.replicas.first is not None, "setup() first"
        return self.replicas.first.member

    def check(self, request: InferenceRequest) -> object:
        self._first().check(request)
        return None

    def rows(self, request: InferenceRequest) -> int:
        return self._first().rows(request)

    def batch_key(self, request: InferenceRequest) -> Hashable:
        return self._first().batch_key(request)

    async def run(self, requests: Sequence[InferenceRequest], prepared: Sequence[object]) -> BatchOutput:
        replica = self.replicas.least_busy()
        replica.inflight += 1
        try:
            return await replica.member.run(requests, prepared)
        except Exception as exc:
            raise ReplicaCallFailed(replica, exc) from exc
        finally:
            replica.inflight -= 1

    async def classify(self, exc: BaseException) -> Failure:
        if isinstance(exc, NoReplicaUp):
            return Failure(FailureKind.OUTAGE, ErrorClass.MODEL_UNAVAILABLE, str(exc))
        if not isinstance(exc, ReplicaCallFailed):
            return await self._first().classify(exc)
        return self.replicas.failed(exc.replica, await exc.replica.member.classify(exc.cause))
