"""The stage runtime's side of the membership fence (:mod:`pipeline.kafka.membership`).

The outbox fences what a stage completes; this fences what the stage *decides*. A worker
whose membership is unconfirmed (maybe a zombie, resumed after its partitions moved)
handles no record and runs no :meth:`~workers.runtime.stream_stage.StreamStage.tick`: an idle close or a
join expiry decided on a clock that jumped across a SIGSTOP would otherwise close, for
keys another worker now owns, streams that are alive there. Outputs no input record owns
(those decisions' results, checkpoints and tombstones) wait for the lease like the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaTimeoutError

from pipeline.kafka.membership import POLL_S, SEND_TIMEOUT_S, MembershipLease, MembershipLost, watch
from pipeline.observability.metrics import PipelineMetrics

log = logging.getLogger(__name__)


class StageFence:
    """One stage's membership lease, its count of revocations, and whether it is restoring."""

    def __init__(self, fail: Callable[[BaseException], None] | None = None) -> None:
        self.lease: MembershipLease | None = None
        self._fail = fail
        """Stops the stage (:meth:`StreamStage.fail`): a call waited for the lease as long as
        an output may (None: the error is raised to the caller instead)."""
        self.revocations = 0
        """Bumped on every revocation: a batch fetched before one is not handled after it,
        even when the partition comes back (its records are fetched again from the commit)."""
        self._restoring = False

    def watch(self, consumer: AIOKafkaConsumer, stage: str, metrics: PipelineMetrics) -> MembershipLease:
        """Feed the lease from ``consumer`` (before it starts); fenced outputs are counted."""
        self.lease = watch(consumer, stage=stage, on_fenced=metrics.fenced_outputs.labels(stage).inc)
        return self.lease

    async def held(self) -> bool:
        """True, after a short pause, while membership is unconfirmed: decide nothing now.

        Bounded like an output's wait (``SEND_TIMEOUT_S``): a lease the coordinator neither
        confirms nor takes away for that long (seen on Apache Kafka restarted after kill -9:
        a stage with nothing to send held for minutes, its health green) raises
        :class:`KafkaTimeoutError`, which stops the stage in one line; its records are
        replayed from the commit by whoever consumes the partitions next."""
        if self.lease is None or self.lease.allows():
            return False
        if (silent := self.lease.unanswered_s()) >= SEND_TIMEOUT_S:
            raise KafkaTimeoutError(f"{self.lease.stage}: group membership neither confirmed nor lost in {silent:.0f}s")
        await asyncio.sleep(POLL_S)
        return True

    @contextlib.contextmanager
    def restoring(self) -> Iterator[None]:
        """Inside ``on_partitions_assigned``, where aiokafka sends no heartbeat."""
        self._restoring = True
        try:
            yield
        finally:
            self._restoring = False

    async def admit_unowned(self, stage: str, count: int) -> None:
        """Wait until ``count`` outputs no input record owns may leave; raise
        :class:`MembershipLost` (counted) when their partitions were handed back meanwhile.

        Not held during restore: those are dead letters of corrupt state records (the same
        bytes from any owner), and no heartbeat could renew the lease before it ends."""
        if self.lease is None or self._restoring:
            return
        revocations = self.revocations
        if not await self.lease.admit(lambda: self.revocations == revocations, SEND_TIMEOUT_S):
            self.lease.fenced(count)
            raise MembershipLost(f"{stage}: {count} output(s) of handed-back partitions dropped")

    async def admit_call(self) -> None:
        """Before a call that changes state the partition's next owner shares (a frame of a
        Triton sequence): wait for the lease; when it cannot be renewed, cancel the calling
        task, as handing the partition back is about to (its next owner drives the stream).

        The wait is bounded like an output's (``SEND_TIMEOUT_S``): a lease that the coordinator
        neither confirms nor takes away for that long (a broker that answers the group's
        requests with errors that prove nothing) stops the stage, whose unfinished records are
        replayed from the commit, instead of leaving the stream's records waiting unseen."""
        if self.lease is None:
            return
        revocations = self.revocations
        try:
            admitted = await self.lease.admit(lambda: self.revocations == revocations, SEND_TIMEOUT_S)
        except KafkaTimeoutError as stuck:
            if self._fail is None:
                raise
            self._fail(stuck)
            raise asyncio.CancelledError from stuck
        if not admitted:
            raise asyncio.CancelledError

    @staticmethod
    async def guard(step: Awaitable[None]) -> None:
        """Run one step of a stage (a record's handling, a tick). One whose outputs the fence
        dropped ends there: its partitions (all of them: aiokafka's rebalances are eager)
        went to their next owner, who redoes the step from the changelog and the commit."""
        try:
            await step
        except MembershipLost as lost:
            log.info("%s", lost)
