"""The join stage: merge parallel branches' messages by correlation ID within a window.

Branch topics are co-partitioned (same partition count, key = correlation ID),
and the consumer uses the range assignor, so every message of one correlation
ID reaches the same worker. Per correlation ID the worker keeps the messages
that have arrived; the state is written to a compacted Kafka topic with every
arrival and restored on assignment (like a sequence stage's), so a worker
killed mid-join loses nothing; it is deleted (tombstone) some time after the
join completed, having served to recognise late duplicates.

Windows run in event time: from the first branch record's timestamp (the
request's: messages between stages keep it) until every *missing* branch's
partition has been read up to the window's end. A branch partition with nothing
left to read counts as "now" only when the stages upstream of it have committed
their inputs to the end too, or are gone: no live member in their group for
``branch_gone_after``. A branch whose stages are behind is judged by their position,
the event time of the oldest record they have left to finish; a window open longer than ``max_wait`` closes anyway
(:mod:`pipeline.kafka.progress`, :mod:`workers.join.expiry`). Time since a commit
is no evidence: a join does not expire because this worker, or the stage of one
branch, is behind (a backlog, a rejoin, a slower branch), only because a branch
cannot deliver. The dead letter names the rule that closed the window. Outputs
that no input record owns (expiries, deletion of retired markers) are handed to
the producer together and awaited once per sweep.

Modes (``JoinNode.mode``):
- ``inner``: emit when every branch has arrived; when the window closes first,
  dead-letter what arrived ("join window expired", naming the missing branches);
- ``outer``: emit when every branch has arrived, or, when the window closes,
  what arrived, marked partial (``join-status: partial`` header and the
  ``join_status`` / ``join_missing`` parameters);
- ``any``: the first branch to arrive is emitted; later ones are dropped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka.structs import TopicPartition

from pipeline.contract.errors import BadRequest, ErrorClass
from pipeline.contract.records import result_headers
from pipeline.contract.request import InferenceRequest, decode_request, forward_request
from pipeline.contract.response import encode_response
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs, OutRecord
from pipeline.kafka.progress import DEFAULT_GONE_AFTER_S, BranchState, Upstream, UpstreamProgress
from pipeline.kafka.records import ConsumedRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.observability.record_trace import record_trace
from pipeline.settings import KafkaSettings
from pipeline.state import StateEntry
from pipeline.state.codec import pack_bytes, payload_digest, unpack_bytes
from workers.join.expiry import Judged, Rule, expiry_reason, expiry_rules
from workers.runtime.dead_letters import dead_letter_record
from workers.runtime.event_time import now_ms, reading_starts
from workers.runtime.stage_io import StageIO
from workers.runtime.stateful import StatefulStage
from workers.runtime.upstream import watched_clock

log = logging.getLogger(__name__)

JOIN_STATUS = "join-status"
DEFAULT_MAX_WAIT_S = 600.0
"""The hard limit on an open window: a branch whose stage is alive but stuck (members
listed, nothing processed) would otherwise hold its windows until ``max_open_joins``."""


@dataclass
class JoinState:
    """What has arrived for one correlation ID."""

    first_ms: int
    branches: dict[str, bytes] = field(default_factory=dict)  # branch -> message value
    headers: list[tuple[str, bytes]] = field(default_factory=list)  # of the first arrival
    done: bool = False
    branch_headers: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)
    """Each branch record's own headers (its dead letter keeps them byte for byte)."""
    digests: dict[str, str] = field(default_factory=dict)
    """Digest of each branch value that arrived: kept after the join is done, so a late
    replay (dropped, counted) is told from a reused correlation ID (dead-lettered)."""
    opened_ms: int = field(default_factory=now_ms)
    """When the join first held it (wall clock): ``max_wait`` counts from here."""
    positions: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    """Where each branch record was read (topic, partition, offset): an expired window's
    dead letters name them, as every dead letter of a consumed record does."""


class JoinStateCodec:
    """:class:`pipeline.state.StateCodec` for join states (kind ``join``)."""

    kind = "join"

    def to_dict(self, state: JoinState) -> dict[str, Any]:
        return {
            "first_ms": state.first_ms,
            "done": state.done,
            "branches": {b: pack_bytes(v) for b, v in state.branches.items()},
            "headers": [[k, pack_bytes(v)] for k, v in state.headers],
            "branch_headers": {b: [[k, pack_bytes(v)] for k, v in hs] for b, hs in state.branch_headers.items()},
            "digests": state.digests,
            "opened_ms": state.opened_ms,
            "positions": {b: list(p) for b, p in state.positions.items()},
        }

    def from_dict(self, data: dict[str, Any], version: int) -> JoinState:
        # Version 0 (before the envelope) had the same fields plus "partition".
        return JoinState(
            first_ms=int(data["first_ms"]),
            done=bool(data["done"]),
            branches={str(b): unpack_bytes(v) for b, v in data["branches"].items()},
            headers=[(str(k), unpack_bytes(v)) for k, v in data["headers"]],
            branch_headers={
                str(b): [(str(k), unpack_bytes(v)) for k, v in hs] for b, hs in data.get("branch_headers", {}).items()
            },
            digests={str(b): str(d) for b, d in data.get("digests", {}).items()},
            opened_ms=int(data.get("opened_ms", now_ms())),  # older states: from their restore
            positions={str(b): (str(t), int(p), int(o)) for b, (t, p, o) in data.get("positions", {}).items()},
        )


@dataclass(frozen=True)
class JoinSettings:
    """Plain settings of a join stage (built from the compiled graph by the stage registry)."""

    name: str
    branches: tuple[str, ...]
    input_topics: tuple[str, ...]
    mode: str = "inner"  # inner | outer | any
    window_ms: float = 5000.0
    retention_s: float = 60.0
    """How long a completed join is remembered, so late duplicates are recognised."""
    max_open: int | None = None
    """Joins one worker holds; beyond it the idlest are closed as if their window ended."""
    to_result: bool = False
    keep: tuple[str, ...] | None = None
    upstream: tuple[Upstream, ...] = ()
    """The groups (and their inputs) of every stage upstream of each branch."""
    branch_gone_after_s: float = DEFAULT_GONE_AFTER_S
    """No live member in a branch's group this long: the branch is gone."""
    max_wait_s: float | None = DEFAULT_MAX_WAIT_S
    """The hard limit on an open window (None: none)."""


class JoinStage(StatefulStage):
    """Fan-in of a graph topology (see the module docstring)."""

    def __init__(
        self, io: StageIO, settings: JoinSettings, *, state_topic: str, kafka: KafkaSettings, metrics: PipelineMetrics
    ) -> None:
        super().__init__(io, kafka, metrics)
        self.node = settings
        self.retention_s = max(settings.retention_s, settings.window_ms / 1000)
        self._branch_of = dict(zip(settings.input_topics, settings.branches, strict=True))
        self.states = self.keyed_state(
            state_topic, JoinStateCodec(), ttl_s=self.retention_s, max_keys=settings.max_open
        )
        self._topic_of = dict(zip(settings.branches, settings.input_topics, strict=True))
        # A branch is behind until its stages are caught up or gone: never judged by a clock.
        self.progress = UpstreamProgress(
            kafka, settings.upstream, settings.input_topics, gone_after_s=settings.branch_gone_after_s
        )
        self.upstream, self.clock = watched_clock(  # the one rule joins and sequence stages share
            self.progress,
            self.highwater,
            stage=io.stage,
            metrics=metrics,
            grace_ms=settings.window_ms,
            fetched_at=self.fetched_at,
            branch_of=lambda tp: self._branch_of[tp.topic],
        )
        self._last_sweep = 0.0

    async def setup(self) -> None:
        await super().setup()
        await self.upstream.start()

    async def teardown(self) -> None:
        await self.upstream.stop()
        await super().teardown()

    # ------------------------------------------------------------------ state
    async def restore(self, partitions: list[TopicPartition]) -> None:
        self.clock.assigned(partitions, await reading_starts(self._consumer, partitions))
        # Several input topics share partition numbers: the store restores each number once.
        report = await self.restore_states(partitions)
        log.info("%s: restored %d pending joins for partitions %s", self.io.stage, report.restored, report.partitions)

    async def forget(self, partitions: list[TopicPartition]) -> None:
        numbers = {tp.partition for tp in partitions}
        self.states.forget(numbers)
        self.clock.forget(numbers)

    # ------------------------------------------------------------------ arrivals
    async def handle(self, record: ConsumedRecord, slot: Slot[Outputs]) -> None:
        branch = self._branch_of[record.topic]
        key = record.key or b""
        if not key:
            self.dead_letter(record, slot, ErrorClass.MISSING_CORRELATION_ID, "a join needs the correlation ID as key")
            return
        stamp = self.clock.timestamp(record)  # observed already (passing)
        state = self.states.get(key)
        if state is None:
            await self.produce_unowned_of([(e.partition, out) for e in self.states.make_room(key) for out in self._evict(e)])
            # The window runs in event time, from the first branch's record timestamp.
            state = JoinState(first_ms=stamp, headers=list(record.headers or ()))
        value = record.value or b""
        if branch in state.digests or state.done:
            self._repeated(record, slot, state, branch, value)
            return
        state.branches[branch] = value
        state.branch_headers[branch] = list(record.headers or ())
        state.digests[branch] = payload_digest(value)
        state.positions[branch] = (record.topic, record.partition, record.offset)
        complete = len(state.branches) == len(self.node.branches)
        if self.node.mode == "any" or complete:
            if (trace := record_trace(slot)) is not None:  # the output continues this branch's trace
                trace.link(hs for b, hs in state.branch_headers.items() if b != branch)
            status = None if complete else "first"  # any-join: this branch won
            try:
                merged = self._merged(key, state, status=status)
            except BadRequest as bad:
                self.dead_letter(record, slot, bad.error_class, bad.reason)
                self._retire(key, state, record.partition)
                return
            checkpoint = self._retire(key, state, record.partition)
            self.outbox.complete(slot, (merged, checkpoint))
        else:
            self.outbox.complete(slot, (self.states.put(key, state, record.partition),))

    def _repeated(self, record: ConsumedRecord, slot: Slot[Outputs], state: JoinState, branch: str, value: bytes) -> None:
        """A branch record for a join that already has it, or is done. The same bytes again
        are a replay (dropped, counted); other bytes mean the correlation ID was reused."""
        known = state.digests.get(branch)
        if known == payload_digest(value):
            self.metrics.records_dropped.labels(self.io.stage, "join-duplicate").inc()
            self.outbox.complete(slot, ())
        elif known is None and self.node.mode == "any":
            self.metrics.records_dropped.labels(self.io.stage, "join-any-lost-race").inc()
            self.outbox.complete(slot, ())  # any-join: another branch already won
        elif known is None:
            # The join ended (window closed) before this branch arrived.
            self.dead_letter(record, slot, ErrorClass.DEADLINE_EXCEEDED, f"branch {branch} arrived after its join ended")
        else:
            reason = f"correlation id already joined with a different {branch} message"
            self.dead_letter(record, slot, ErrorClass.CONFLICTING_CORRELATION_ID, reason)

    def _retire(self, key: bytes, state: JoinState, partition: int) -> OutRecord:
        """The join is done: keep a small marker (no payloads) so late arrivals are dropped;
        it is deleted when its retention runs out. Returns the marker's checkpoint."""
        state.done = True
        state.branches = {}
        state.branch_headers = {}
        state.positions = {}
        return self.states.put(key, state, partition, ttl_s=self.retention_s)

    def _merged(self, key: bytes, state: JoinState, *, status: str | None = None) -> OutRecord:
        """One message with the union of the branches' tensors (branch order decides ties).

        ``status`` marks an incomplete join: "partial" (outer, window closed) or "first"
        (any); the parameters then name the branches that are missing.
        """
        requests: list[InferenceRequest] = []
        for branch in self.node.branches:
            if branch in state.branches:
                requests.append(decode_request(state.branches[branch], state.headers))
        first = requests[0]
        tensors, datatypes = tensor_union(requests)
        parameters = dict(first.parameters)
        extra_headers: list[tuple[str, bytes]] = []
        if status is not None:
            parameters["join_status"] = status
            parameters["join_missing"] = ",".join(b for b in self.node.branches if b not in state.branches)
            extra_headers.append((JOIN_STATUS, status.encode()))
        if self.node.to_result:
            if self.node.keep is not None:
                absent = [t for t in self.node.keep if t not in tensors]
                tensors = {t: tensors[t] for t in self.node.keep if t in tensors}
                if absent and status is None:
                    raise BadRequest(ErrorClass.UNKNOWN_OUTPUT, f"result tensors {absent} were not produced")
            value, content_type = encode_response(
                first, tensors, model_name=self.node.name, model_version="", parameters=parameters
            )
        else:
            value, content_type = forward_request(first, tensors, datatypes, parameters=parameters)
        headers = result_headers(
            state.headers,
            correlation_id=first.correlation_id,
            stage=self.io.stage,
            model_name=self.node.name,
            model_version="",
            content_type=content_type,
        ) + extra_headers
        # A next step keeps the request's time and the branches' partition number: one writer per partition.
        timestamp, partition = (None, None) if self.node.to_result else (state.first_ms, _partition_of(state))
        return OutRecord(topic=self.io.output_topic, key=key, value=value, headers=headers, timestamp_ms=timestamp, partition=partition)

    # ------------------------------------------------------------------ windows
    def next_tick_s(self) -> float:
        return 0.05

    def _judge(self, branch: str, partition: int) -> tuple[int, BranchState, bool]:
        """What a missing branch's partition tells (:data:`workers.join.expiry.Judge`): only
        missing branches are asked, so reading one branch ahead of another expires nothing."""
        tp = TopicPartition(self._topic_of[branch], partition)
        state = self.progress.state(branch, partition) if self.node.upstream else BranchState.CAUGHT_UP
        return self.clock.watermark([tp]), state, self.clock.caught_up(tp)

    def _rules(self, entry: StateEntry[JoinState], judged: dict[tuple[str, int], Judged]) -> dict[str, Rule] | None:
        def judge(branch: str) -> Judged:
            if (branch, entry.partition) not in judged:
                judged[(branch, entry.partition)] = self._judge(branch, entry.partition)
            return judged[(branch, entry.partition)]

        state = entry.state
        return expiry_rules(
            first_ms=state.first_ms,
            opened_ms=state.opened_ms,
            missing=[b for b in self.node.branches if b not in state.branches],
            window_ms=self.node.window_ms,
            max_wait_ms=None if self.node.max_wait_s is None else self.node.max_wait_s * 1000,
            now_ms=now_ms(),
            judge=judge,
        )

    async def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < 0.2:
            return
        self._last_sweep = now
        self.clock.watch(self._owned)
        if self.node.upstream and any(not entry.state.done for entry in self.states):
            self.upstream.poll(self._consumer, self._owned)
        judged: dict[tuple[str, int], Judged] = {}  # one look per branch partition and sweep
        out: list[tuple[int, OutRecord]] = []  # (input partition, output)
        explained: set[tuple[str, int]] = set()
        for entry in self.states:
            if entry.state.done:
                continue
            rules = self._rules(entry, judged)
            if rules is not None:
                log.info("%s: join %r expired: %s", self.io.stage, entry.key, rules)
                explain_expiry(self, rules, entry.partition, explained)
                out += [(entry.partition, o) for o in self._expire(entry, rules)]
        for entry in self.states.due():
            if entry.state.done:
                out += [(entry.partition, o) for o in self._evict(entry)]  # retention over: the marker is deleted
            else:
                self.states.touch(entry.key)  # open: its window closes it (event time), not the wall clock
        if out:
            await self.produce_unowned_of(out)  # all enqueued first: one round trip per partition, not one per join
        self.metrics.state_keys.labels(self.io.stage).set(len(self.states))

    def _evict(self, entry: StateEntry[JoinState]) -> list[OutRecord]:
        """End a join now and delete it: what arrived is expired as if its window closed."""
        out = [] if entry.state.done else self._expire(entry)
        tombstone = self.states.delete(entry.key)
        return out + ([tombstone] if tombstone is not None else [])

    def _expire(self, entry: StateEntry[JoinState], rules: dict[str, Rule] | None = None) -> list[OutRecord]:
        """The window closed before every branch arrived (``rules``: why, per missing branch;
        None: evicted by ``max_open_joins``): outer emits what it has, inner dead-letters."""
        key, state = entry.key, entry.state
        missing = [b for b in self.node.branches if b not in state.branches]
        for rule in sorted(set((rules or {"": "evicted"}).values())):
            self.metrics.join_expiries.labels(self.io.stage, rule).inc()
        if self.node.mode == "outer":
            out = [self._merged(key, state, status="partial")]
        else:  # inner: every branch record that arrived is dead-lettered, none vanishes
            reason = expiry_reason(
                rules,
                window_ms=self.node.window_ms,
                missing=missing,
                have=list(state.branches),
                gone_after_s=self.node.branch_gone_after_s,
                max_wait_s=self.node.max_wait_s,
            )
            out = [
                dead_letter_record(
                    stage=self.io.stage,
                    topic=self.io.dead_letter_topic,
                    key=key,
                    value=value,
                    headers=state.branch_headers.get(branch, state.headers),
                    error_class=ErrorClass.DEADLINE_EXCEEDED,
                    reason=reason,
                    request_timestamp_ms=state.first_ms,
                    source=state.positions.get(branch),
                )
                for branch, value in state.branches.items()
            ]
        return [*out, self._retire(key, state, entry.partition)]


def explain_expiry(stage: JoinStage, rules: dict[str, Rule], partition: int, explained: set[tuple[str, int]]) -> None:
    """Once per sweep and missing branch partition: the offsets the expiry was decided on."""
    for branch in rules:
        if (branch, partition) not in explained:
            explained.add((branch, partition))
            tp = TopicPartition(stage._topic_of[branch], partition)
            evidence = stage.progress.evidence(partition)
            log.info("%s: %s expired on %s; upstream: %s", stage.io.stage, branch, stage.clock.explain(tp), evidence)


def tensor_union(requests: list[InferenceRequest]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every tensor the branches' messages carry, with its datatype; where two carry one
    name, the first in branch order wins (so the topology's branch order decides ties)."""
    tensors: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for request in requests:
        for name, array in request.inputs.items():
            if name not in tensors:
                tensors[name], datatypes[name] = array, request.datatypes[name]
    return tensors, datatypes


def _partition_of(state: JoinState) -> int | None:
    """The partition number the join's branches were read from (co-partitioned: one for all)."""
    return next((partition for _, partition, _ in state.positions.values()), None)
