"""The membership lease: a worker sends outputs only while it knows it is still in its group.

The zombie problem. A worker stopped (SIGSTOP, a VM pause, a swap storm) longer than its
session timeout is removed from its consumer group and its partitions go to another
worker. When it resumes, its event loop runs on at once: finished work is produced,
results and *state checkpoints* for keys another worker now owns, and offsets are
committed, all before its heartbeat learns that it is out. A late result is an exact
duplicate at worst, but a late checkpoint written after the new owner's wins in the
compacted changelog and rolls the key's state back on the next restore; and a late frame
sent to a Triton sequence would advance the state Triton keeps for whichever worker now
drives that stream, were their sequence ids the same (they are salted per worker,
``workers/sequence/model.py``, because a frame admitted just before the stop still leaves).

Kafka's own fence is the transactional producer; the embedded broker (Tansu) has no
``InitProducerId``, and the design must not depend on it. So the fence is a lease:

- **Confirmed by the coordinator.** A heartbeat or SyncGroup the coordinator answered
  with no error, at the time it was *sent* (the broker saw it later, so its session
  timer for this member restarted no earlier), proves that the member is in the group
  and that the group was not rebalancing without it. The group cannot move this
  member's partitions before ``min(session timeout, rebalance timeout)`` has passed
  since: the session must expire, or a rebalance started after that answer must time
  out. The lease lasts that long, less a margin of one heartbeat interval.
- **Measured on the monotonic clock,** which keeps running while the process is
  stopped: a resumed zombie sees its lease expired before it does anything else, and
  holds every output (:class:`LineFence` in the outbox, ``workers/runtime/fencing.py`` for what
  the stage decides and calls) until the coordinator has answered again. Either it is still a
  member (a short pause: it goes on, nothing was lost or duplicated) or it is told
  ``UNKNOWN_MEMBER_ID`` / ``ILLEGAL_GENERATION``: the lease is *lost*, aiokafka revokes
  the partitions, the outbox drops their withheld outputs and their new owner redoes
  them from the last commit.
- **No renewal during a rebalance.** ``REBALANCE_IN_PROGRESS`` keeps the member alive
  but proves nothing about the next generation; once a stale lease cannot be renewed
  before the partitions are handed back, waiting for it is pointless
  (:meth:`MembershipLease.renewable`).

aiokafka 0.14 has no public hook for heartbeat results: the heartbeat routine keeps its
last success in a local variable and :meth:`GroupCoordinator._do_heartbeat` answers
True for ``REBALANCE_IN_PROGRESS`` too. The one place where every group request and its
answer can be seen, the initial join included, is the client's ``send`` (all the
coordinator's requests go through ``consumer._client.send``), so :func:`watch` wraps
that, here and nowhere else. ``tests/unit/test_membership.py`` fails loudly if the
internals it relies on change.

Residual window, stated plainly: a record handed to the producer while the lease was
fresh and still in its buffer when the process was stopped is sent on resume. The
window is the producer's linger (milliseconds), not the seconds an event loop runs
after SIGCONT; only a transactional producer on real Kafka closes it completely.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import (
    IllegalGenerationError,
    KafkaTimeoutError,
    NoError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from aiokafka.protocol.group import HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest

from pipeline.kafka.clients import SEND_TIMEOUT_MS
from pipeline.kafka.ordering import Slot

log = logging.getLogger(__name__)

_HEARTBEAT = HeartbeatRequest.API_KEY
_JOIN = JoinGroupRequest.API_KEY
_SYNC = SyncGroupRequest.API_KEY
_LEAVE = LeaveGroupRequest.API_KEY
_GROUP_APIS = frozenset({_HEARTBEAT, _JOIN, _SYNC, _LEAVE})
#: The coordinator's ways of saying "you are not a member of that generation".
_NOT_A_MEMBER = frozenset({IllegalGenerationError.errno, UnknownMemberIdError.errno, 82})  # 82: FENCED_INSTANCE_ID
#: How often a holder looks at the lease again (it changes only on coordinator answers).
POLL_S = 0.05
#: Outputs wait for the lease at most as long as a send may take to be delivered.
SEND_TIMEOUT_S = SEND_TIMEOUT_MS / 1000


class MembershipLost(Exception):
    """Outputs were dropped by the fence because their partitions were handed back: the
    decision that made them is void (the partitions' owner makes it again)."""


class MembershipLease:
    """Whether this member may send outputs now: pure bookkeeping on coordinator answers
    (:meth:`observe`), on an injectable monotonic clock."""

    def __init__(
        self,
        *,
        stage: str,
        session_timeout_s: float,
        rebalance_timeout_s: float,
        margin_s: float,
        on_fenced: Callable[[int], None] = lambda _count: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stage = stage
        self.window_s = max(0.0, min(session_timeout_s, rebalance_timeout_s) - margin_s)
        self.clock = clock
        self.generation = -1
        self._confirmed_at = -math.inf
        self._member = False
        self._rebalancing = False
        self._open = False  # what the last allows() said
        self._fencing = False  # an expiry or a loss was logged: log its end too
        self._stale_since: float | None = None  # first seen stale though renewable (after a resume, not before)
        self._on_fenced = on_fenced

    # ------------------------------------------------------------------ coordinator answers
    def observe(self, api_key: int, error_code: int | None, sent_at: float, generation: int | None = None) -> None:
        """The coordinator answered a group request sent at ``sent_at`` (monotonic)."""
        if api_key == _LEAVE:
            self._lose(None)  # we left (shutdown, or max.poll.interval): nothing to warn about
        elif error_code in _NOT_A_MEMBER:
            self._lose(f"coordinator answered error {error_code}")
        elif error_code == RebalanceInProgressError.errno:
            self._rebalancing = True
        elif error_code != NoError.errno:
            return  # coordinator moved, timeouts, ...: proves nothing either way
        elif api_key == _JOIN:
            self.generation = generation if generation is not None else self.generation
            self._member, self._rebalancing = True, False
            self._confirmed_at = -math.inf  # not ours to use until the assignment is synced
        elif self._member:  # heartbeat or sync, no error
            self._confirmed_at = max(self._confirmed_at, sent_at)
        self._stale_since = None  # the coordinator settled it (renewed, lost, rebalancing): not silent

    def _lose(self, why: str | None) -> None:
        if self._member and why is not None:
            log.warning("%s: group membership (generation %d) lost: %s; outputs held", self.stage, self.generation, why)
            self._fencing = True
        self._member = False
        self._confirmed_at = -math.inf

    # ------------------------------------------------------------------ questions
    def fresh(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        return self._member and now < self._confirmed_at + self.window_s

    def renewable(self) -> bool:
        """A stale lease may still be confirmed for the same generation (no rebalance is
        under way, membership not lost): holding outputs for it is worth it."""
        return self._member and not self._rebalancing

    def allows(self) -> bool:
        """:meth:`fresh`, logging one line when fencing starts (the lease expired, or was
        lost) and one when it stops; not the short gap of every rebalance's rejoin."""
        now = self.clock()
        fresh = self.fresh(now)
        if fresh or not (self.renewable() and self._confirmed_at > -math.inf):
            self._stale_since = None
        elif self._stale_since is None:
            self._stale_since = now
        if fresh != self._open:
            self._open = fresh
            if fresh and self._fencing:
                self._fencing = False
                log.info("%s: fencing stopped: membership of generation %d confirmed", self.stage, self.generation)
            elif not fresh and self._member and self._confirmed_at > -math.inf:
                self._fencing = True
                log.warning(
                    "%s: fencing started: membership of generation %d not confirmed for %.1fs; outputs held",
                    self.stage, self.generation, now - self._confirmed_at,
                )
        return fresh

    def unanswered_s(self) -> float:
        """How long this lease has been seen stale while the coordinator neither renewed
        it nor took it away (0 while fresh, lost, or in a rebalance). Counted from the
        first :meth:`allows` that saw it stale, so a resumed zombie starts at 0: its stop
        is not the coordinator's silence."""
        return 0.0 if self._stale_since is None else self.clock() - self._stale_since

    def fenced(self, count: int) -> None:
        """``count`` held outputs were dropped: their partitions moved while they waited."""
        if count:
            self._on_fenced(count)
            log.info("%s: %d output(s) dropped by the membership fence (the partition's new owner redoes them)",
                     self.stage, count)

    async def admit(self, still_ours: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until outputs may be sent: True. False when they must be dropped instead
        (``still_ours()`` turned false, or the lease can no longer be renewed for them).
        Raises :class:`KafkaTimeoutError` after ``timeout_s`` (like a send that cannot be
        delivered: the stage stops and its records are replayed)."""
        deadline = self.clock() + timeout_s
        while not self.allows():
            if not still_ours() or not self.renewable():
                return False
            if self.clock() >= deadline:
                raise KafkaTimeoutError(f"{self.stage}: group membership not confirmed in {timeout_s:.0f}s")
            await asyncio.sleep(POLL_S)
        return still_ours()


class LineFence:
    """The outbox's view of an optional lease: whether outputs may leave now, and which
    waiting outputs belong to slots whose partition was handed back meanwhile."""

    def __init__(self, lease: MembershipLease | None) -> None:
        self.lease = lease
        self._gone: weakref.WeakSet[Slot[Any]] = weakref.WeakSet()

    def closed(self) -> bool:
        return self.lease is not None and not self.lease.allows()

    def hopeless(self) -> bool:
        """Closed, and cannot open again before the lines held now are handed back."""
        return self.lease is not None and self.closed() and not self.lease.renewable()

    def handed_back(self, unfinished: list[Slot[Any]]) -> int:
        """A partition's unfinished slots were dropped; returns how many."""
        self._gone.update(unfinished)
        self._count(held_outputs(unfinished))
        return len(unfinished)

    async def admitted(self, slot: Slot[Any], outputs: int) -> bool:
        """``outputs`` of ``slot`` may leave (after waiting for the lease); False: they are
        dropped, for the slot's partition was (or will be, before the lease can be
        renewed) handed back."""
        def ours() -> bool:
            return slot not in self._gone

        ok = ours() if self.lease is None else await self.lease.admit(ours, SEND_TIMEOUT_S)
        if not ok:
            self._count(outputs)
        return ok

    def _count(self, outputs: int) -> None:
        if self.lease is not None and self.closed():
            self.lease.fenced(outputs)


def held_outputs(line: Iterable[Slot[Any]]) -> int:
    """Outputs of a partition line's slots (in order) that were ready to leave but not
    sent: the fence, not the order, held them. What a dropped line counts as fenced."""
    count = 0
    for slot in line:
        if slot.emitted:
            continue
        if slot.output is None:
            break
        count += len(slot.output)
    return count


Send = Callable[..., Awaitable[Any]]


def watch(consumer: AIOKafkaConsumer, *, stage: str, on_fenced: Callable[[int], None]) -> MembershipLease:
    """A lease fed by ``consumer``'s group requests; call before ``consumer.start()`` so the
    first join is seen. Reads aiokafka internals (see the module docstring)."""
    heartbeat_s = consumer._heartbeat_interval_ms / 1000
    lease = MembershipLease(
        stage=stage,
        session_timeout_s=consumer._session_timeout_ms / 1000,
        rebalance_timeout_s=consumer._rebalance_timeout_ms / 1000,
        margin_s=heartbeat_s,
        on_fenced=on_fenced,
    )
    client = consumer._client
    send: Send = client.send

    async def observed(node_id: int, request: Any, **kwargs: Any) -> Any:
        api_key: int = getattr(request, "API_KEY", -1)
        if api_key not in _GROUP_APIS:
            return await send(node_id, request, **kwargs)
        sent_at = lease.clock()
        response = await send(node_id, request, **kwargs)
        lease.observe(api_key, getattr(response, "error_code", None), sent_at, getattr(response, "generation_id", None))
        return response

    client.send = observed
    return lease
