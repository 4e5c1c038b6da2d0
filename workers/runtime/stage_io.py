"""Where a stage reads and writes, and how much it may hold: what the builder decides
for one stage of a topology (:mod:`pipeline.runtime.stages`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.deadletter.claim_check import ClaimCheckStore
from pipeline.kafka.clients import RecordLimits
from pipeline.topology.lanes import Lane


@dataclass(frozen=True)
class StageIO:
    """Where a stage reads and writes, and how much it may hold."""

    stage: str
    group_id: str
    input_topic: str
    output_topic: str
    dead_letter_topic: str
    max_pending: int = 4096
    max_pending_bytes: int = 256 * 1024 * 1024
    """Bytes of consumed, unfinished records; above it consumption pauses (4,096 x 64 MiB
    records must not fit in memory just because the count is under max_pending)."""
    drain_timeout_s: float = 20.0
    """Shutdown: release, flush and commit within this; then unfinished work is abandoned
    (left uncommitted) and the clients close (each close bounded by ``close_timeout_s``)."""
    close_timeout_s: float = 3.0
    stall_after_s: float = 60.0
    """Watchdog: a partition whose oldest unfinished record is older than this is stalled."""
    emit_requests: bool = False
    """True when the output feeds another stage: outputs are encoded as its requests."""
    more_input_topics: tuple[str, ...] = ()
    """Joins read several co-partitioned topics; partition p of each goes to one worker."""
    lanes: tuple[Lane, ...] = ()
    """Priority lanes, highest first, the last one ``input_topic`` (:mod:`workers.runtime.lanes`)."""
    limits: RecordLimits = field(default_factory=RecordLimits)
    """Record sizes the clients handle (from the topology's largest accepted request)."""
    claim_checks: ClaimCheckStore | None = None
    """Where dead letters over ``limits.dead_letter_max_bytes`` keep their payload (None: not kept)."""
    exactly_once: bool = False
    """``delivery: exactly_once``: outputs and input offsets commit in one transaction per input
    partition (:mod:`pipeline.kafka.transactions`)."""
    reply_prefix: str | None = None
    """Set on the stage writing the topology's result topic: results whose ``reply-topic``
    is under this prefix go there instead (:mod:`pipeline.contract.reply`)."""

    @property
    def input_topics(self) -> list[str]:
        lanes = [lane.topic for lane in self.lanes if lane.topic != self.input_topic]
        return [self.input_topic, *self.more_input_topics, *lanes]
