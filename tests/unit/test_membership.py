"""The membership lease and the outbox's fence: a frozen worker sends nothing late.

The lease is pure bookkeeping on the coordinator's answers, driven here by a fake clock
(a SIGSTOP is a jump of the monotonic clock). The outbox tests use stand-in producer and
consumer objects (no broker: what is checked is what the outbox hands them and when);
tests/integration/test_zombie_worker.py freezes real workers on the real broker.
The last tests pin the aiokafka internals pipeline/kafka/membership.py relies on, so an
aiokafka upgrade that changes them fails here, loudly, not silently in production.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer import consumer as consumer_module
from aiokafka.consumer import group_coordinator
from aiokafka.errors import KafkaTimeoutError
from aiokafka.protocol.group import (
    HeartbeatRequest,
    HeartbeatResponse_v1,
    JoinGroupRequest,
    JoinGroupResponse_v5,
    LeaveGroupRequest,
    SyncGroupRequest,
    SyncGroupResponse_v1,
)
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.structs import TopicPartition

from pipeline.kafka.membership import SEND_TIMEOUT_S, MembershipLease, MembershipLost, held_outputs, watch
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outbox, OutRecord
from workers.runtime.fencing import StageFence

HEARTBEAT, JOIN, SYNC, LEAVE = (r.API_KEY for r in (HeartbeatRequest, JoinGroupRequest, SyncGroupRequest, LeaveGroupRequest))
NO_ERROR, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS = 0, 22, 25, 27
TP = TopicPartition("requests", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lease(clock: Clock, *, session: float = 3.0, rebalance: float = 3.0, margin: float = 1.0) -> MembershipLease:
    return MembershipLease(
        stage="s", session_timeout_s=session, rebalance_timeout_s=rebalance, margin_s=margin, clock=clock
    )


def member(clock: Clock, generation: int = 1, **kwargs: float) -> MembershipLease:
    """A lease that has joined ``generation`` and synced now."""
    ml = lease(clock, **kwargs)
    ml.observe(JOIN, NO_ERROR, clock.now, generation)
    ml.observe(SYNC, NO_ERROR, clock.now)
    return ml


# ------------------------------------------------------------------ the lease
def test_fresh_only_from_a_synced_join_for_the_window() -> None:
    clock = Clock()
    ml = lease(clock)
    assert not ml.fresh()  # never a member
    ml.observe(JOIN, NO_ERROR, clock.now, 4)
    assert not ml.fresh() and ml.generation == 4  # joined, assignment not synced yet
    ml.observe(SYNC, NO_ERROR, clock.now)
    assert ml.fresh()
    clock.now += 1.99
    assert ml.fresh()
    clock.now += 0.02
    assert not ml.fresh()  # session 3 s less one heartbeat of margin
    assert ml.renewable()  # a heartbeat may still confirm it


def test_window_is_the_shorter_of_session_and_rebalance_timeouts_less_the_margin() -> None:
    assert lease(Clock(), session=10, rebalance=4, margin=1).window_s == 3
    assert lease(Clock(), session=3, rebalance=30, margin=1).window_s == 2


def test_a_sigstop_past_the_window_fences_until_a_heartbeat_sent_after_it_is_answered() -> None:
    clock = Clock()
    ml = member(clock)
    before_stop = clock.now + 0.5
    clock.now += 8.0  # SIGSTOP for 8 s: the monotonic clock went on
    assert not ml.fresh()
    ml.observe(HEARTBEAT, NO_ERROR, before_stop)  # in flight when stopped: proves nothing about now
    assert not ml.fresh()
    ml.observe(HEARTBEAT, NO_ERROR, clock.now)  # still a member after all (the group had not moved on)
    assert ml.fresh()


def test_unknown_member_loses_the_lease_for_good_until_the_next_generation() -> None:
    clock = Clock()
    ml = member(clock)
    clock.now += 8.0
    ml.observe(HEARTBEAT, UNKNOWN_MEMBER_ID, clock.now)
    assert not ml.fresh() and not ml.renewable()
    ml.observe(HEARTBEAT, NO_ERROR, clock.now)  # a late answer for the old generation revives nothing
    assert not ml.fresh()
    ml.observe(JOIN, NO_ERROR, clock.now, 3)
    ml.observe(SYNC, NO_ERROR, clock.now)
    assert ml.fresh() and ml.generation == 3


@pytest.mark.parametrize("api_key,error", [(HEARTBEAT, ILLEGAL_GENERATION), (SYNC, UNKNOWN_MEMBER_ID), (LEAVE, NO_ERROR)])
def test_other_ways_out_of_the_group_lose_the_lease_at_once(api_key: int, error: int) -> None:
    clock = Clock()
    ml = member(clock)
    ml.observe(api_key, error, clock.now)
    assert not ml.fresh() and not ml.renewable()


def test_a_rebalance_keeps_the_lease_to_its_end_but_cannot_renew_it() -> None:
    clock = Clock()
    ml = member(clock)
    ml.observe(HEARTBEAT, REBALANCE_IN_PROGRESS, clock.now + 0.5)
    clock.now += 1.0
    assert ml.fresh()  # the group cannot move our partitions before the window ends
    clock.now += 1.5
    assert not ml.fresh() and not ml.renewable()  # stale, and only a new generation can confirm it


def test_errors_that_say_nothing_about_membership_change_nothing() -> None:
    clock = Clock()
    ml = member(clock)
    ml.observe(HEARTBEAT, 16, clock.now)  # NOT_COORDINATOR: the coordinator moved
    assert ml.fresh() and ml.renewable()


def test_fencing_start_and_stop_are_logged_once_each(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    ml = member(clock)
    with caplog.at_level(logging.INFO, logger="pipeline.kafka.membership"):
        assert ml.allows()
        clock.now += 8.0
        assert not ml.allows() and not ml.allows()
        ml.observe(HEARTBEAT, NO_ERROR, clock.now)
        assert ml.allows() and ml.allows()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "s: fencing started: membership of generation 1 not confirmed for 8.0s; outputs held",
        "s: fencing stopped: membership of generation 1 confirmed",
    ]


def test_fenced_outputs_are_counted() -> None:
    counted: list[int] = []
    ml = MembershipLease(stage="s", session_timeout_s=3, rebalance_timeout_s=3, margin_s=1, on_fenced=counted.append)
    ml.fenced(0)
    ml.fenced(3)
    assert counted == [3]


async def test_admit_waits_for_renewal_and_gives_up_when_the_outputs_are_no_longer_ours() -> None:
    ml = MembershipLease(stage="s", session_timeout_s=0.3, rebalance_timeout_s=0.3, margin_s=0.1)
    ml.observe(JOIN, NO_ERROR, ml.clock(), 1)
    assert not ml.fresh()  # joined, not synced: held

    async def sync_soon() -> None:
        await asyncio.sleep(0.1)
        ml.observe(SYNC, NO_ERROR, ml.clock())

    renewal = asyncio.create_task(sync_soon())
    assert await ml.admit(lambda: True, timeout_s=5)
    await renewal
    await asyncio.sleep(0.25)  # the lease ran out
    assert not await ml.admit(lambda: False, timeout_s=5)  # handed back meanwhile: drop
    with pytest.raises(KafkaTimeoutError):
        await ml.admit(lambda: True, timeout_s=0.1)  # no coordinator answers at all
    ml.observe(HEARTBEAT, UNKNOWN_MEMBER_ID, ml.clock())
    assert not await ml.admit(lambda: True, timeout_s=5)  # lost: it will be handed back


def test_held_outputs_are_the_ready_run_at_the_head_of_a_line() -> None:
    slots: list[Slot[tuple[str, ...]]] = [Slot(TP, offset) for offset in range(5)]
    slots[0].output, slots[0].emitted = ("sent",), True
    slots[1].output = ("a", "checkpoint")
    slots[2].output = ("b",)
    slots[4].output = ("not reachable",)  # behind an unfinished slot: the order held it, not the fence
    assert held_outputs(slots) == 3


# ------------------------------------------------------------------ the outbox's fence
class Producer:
    """Stand-in for AIOKafkaProducer.send: records what was handed over; deliveries
    are acknowledged at once unless ``hold`` is set."""

    def __init__(self) -> None:
        self.sent: list[OutRecord | Any] = []
        self.hold = False
        self.pending: list[asyncio.Future[None]] = []

    async def send(self, topic: str, *, value: bytes | None, **_: Any) -> asyncio.Future[None]:
        self.sent.append((topic, value))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.hold:
            self.pending.append(fut)
        else:
            fut.set_result(None)
        return fut


class Consumer:
    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, Any]] = []

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.commits.append(offsets)


def record(offset: int) -> Any:
    return type("Rec", (), {"topic": TP.topic, "partition": TP.partition, "offset": offset, "key": b"k", "value": b"v"})


def result(name: str) -> OutRecord:
    return OutRecord(topic="results", key=b"k", value=name.encode(), headers=[])


def checkpoint(name: str) -> OutRecord:
    return OutRecord(topic="state", key=b"k", value=name.encode(), headers=[], after_acks=True, counts_as_result=False)


def fenced_outbox(clock: Clock, counted: list[int]) -> tuple[Outbox, Producer, Consumer, MembershipLease]:
    ml = MembershipLease(
        stage="s", session_timeout_s=3, rebalance_timeout_s=3, margin_s=1, on_fenced=counted.append, clock=clock
    )
    ml.observe(JOIN, NO_ERROR, clock.now, 1)
    ml.observe(SYNC, NO_ERROR, clock.now)
    producer, consumer = Producer(), Consumer()
    return Outbox(producer, consumer, fence=ml, batch_sends=False), producer, consumer, ml  # type: ignore[arg-type]


async def test_a_stale_lease_holds_outputs_and_commits_and_renewal_releases_them() -> None:
    clock, counted = Clock(), []
    outbox, producer, consumer, ml = fenced_outbox(clock, counted)
    slot = outbox.track(record(0))
    outbox.complete(slot, result("r0"))
    await outbox.emit_ready()
    await asyncio.sleep(0)
    assert producer.sent == [("results", b"r0")]
    clock.now += 8.0  # frozen past the window
    second = outbox.track(record(1))
    outbox.complete(second, result("r1"))
    await outbox.emit_ready()
    await outbox.commit()
    assert producer.sent == [("results", b"r0")] and consumer.commits == []  # nothing leaves, nothing committed
    ml.observe(HEARTBEAT, NO_ERROR, clock.now)  # still a member: the held output goes
    await outbox.emit_ready()
    await asyncio.sleep(0)
    await outbox.commit()
    assert producer.sent == [("results", b"r0"), ("results", b"r1")]
    assert [{tp: o.offset for tp, o in c.items()} for c in consumer.commits] == [{TP: 2}]
    assert counted == []


async def test_a_zombie_drops_held_results_and_waiting_checkpoints_when_its_partition_is_handed_back() -> None:
    clock, counted = Clock(), []
    outbox, producer, _consumer, ml = fenced_outbox(clock, counted)
    producer.hold = True  # the result of offset 0 is in flight when the process is frozen
    first = outbox.track(record(0))
    outbox.complete(first, (result("r0"), checkpoint("c0")))
    await outbox.emit_ready()
    held = outbox.track(record(1))
    outbox.complete(held, (result("r1"), checkpoint("c1")))
    clock.now += 8.0  # SIGSTOP past the session; on SIGCONT the result's acknowledgement arrives
    for fut in producer.pending:
        fut.set_result(None)
    await asyncio.sleep(0.1)
    await outbox.emit_ready()
    assert producer.sent == [("results", b"r0")]  # neither c0 nor anything of offset 1 left
    ml.observe(HEARTBEAT, UNKNOWN_MEMBER_ID, clock.now)  # the coordinator: you are out
    assert not await outbox.flush(5.0)  # returns at once: nothing can leave any more
    assert outbox.forget(TP) == 2
    await asyncio.sleep(0.1)
    assert producer.sent == [("results", b"r0")]
    assert sorted(counted) == [1, 2]  # c0 (waiting for the lease), r1 and c1 (held in the line)


async def test_without_a_fence_a_handed_back_slots_checkpoint_is_dropped_too() -> None:
    """A line forgotten on a rebalance while its checkpoint waited for the results' ack:
    the partition's next owner writes the checkpoint, not this worker."""
    producer = Producer()
    outbox = Outbox(producer, Consumer(), batch_sends=False)  # type: ignore[arg-type]
    producer.hold = True
    slot = outbox.track(record(0))
    outbox.complete(slot, (result("r0"), checkpoint("c0")))
    await outbox.emit_ready()
    outbox.forget(TP)
    for fut in producer.pending:
        fut.set_result(None)
    await asyncio.sleep(0.05)
    assert producer.sent == [("results", b"r0")]


async def test_the_stage_fence_raises_membership_lost_for_outputs_of_revoked_partitions() -> None:
    clock, counted = Clock(), []
    fence = StageFence()
    fence.lease = MembershipLease(
        stage="s", session_timeout_s=3, rebalance_timeout_s=3, margin_s=1, on_fenced=counted.append, clock=clock
    )
    fence.lease.observe(JOIN, NO_ERROR, clock.now, 1)
    fence.lease.observe(SYNC, NO_ERROR, clock.now)
    await fence.admit_unowned("s", 2)  # fresh: goes at once
    clock.now += 8.0
    with fence.restoring():
        await fence.admit_unowned("s", 1)  # restore's corrupt-state dead letters are not held
    assert await fence.held()  # the consume loop decides nothing now

    async def revoke_soon() -> None:
        await asyncio.sleep(0.1)
        fence.revocations += 1

    revoking = asyncio.create_task(revoke_soon())
    with pytest.raises(MembershipLost):
        await fence.admit_unowned("s", 2)
    await revoking
    assert counted == [2]

    async def step() -> None:
        raise MembershipLost("s: dropped")

    await StageFence.guard(step())  # the consume loop's guard ends such a step quietly


async def test_a_zombie_makes_no_call_that_changes_shared_state() -> None:
    """A Triton sequence frame: allowed while fresh; held while stale; the calling stream task
    is cancelled once the lease cannot be renewed (its partition's next owner drives it)."""
    clock = Clock()
    fence = StageFence()
    fence.lease = member(clock)
    await fence.admit_call()
    clock.now += 8.0
    call = asyncio.create_task(fence.admit_call())
    await asyncio.sleep(0.1)
    assert not call.done()  # held: a heartbeat may still confirm membership
    fence.lease.observe(HEARTBEAT, UNKNOWN_MEMBER_ID, clock.now)
    await asyncio.sleep(0.1)
    assert call.cancelled()


# ------------------------------------------------------------------ aiokafka internals relied on
async def test_aiokafka_consumer_keeps_the_client_and_timeouts_membership_reads() -> None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers="127.0.0.1:1", group_id="g", session_timeout_ms=3000, heartbeat_interval_ms=1000
    )
    assert consumer._session_timeout_ms == 3000
    assert consumer._heartbeat_interval_ms == 1000
    assert consumer._rebalance_timeout_ms == 3000  # defaults to the session timeout
    assert inspect.iscoroutinefunction(consumer._client.send)
    assert list(inspect.signature(consumer._client.send).parameters) == ["node_id", "request", "group"]


def test_every_group_request_goes_through_the_consumers_client_send() -> None:
    """The coordinator is built on the consumer's client, sends through ``_send_req``, which
    calls ``self._client.send``; heartbeats, joins, syncs and leaves all use ``_send_req``."""
    start = inspect.getsource(consumer_module.AIOKafkaConsumer.start)
    assert "GroupCoordinator(\n                self._client," in start
    assert "self._client.send(" in inspect.getsource(group_coordinator.GroupCoordinator._send_req)
    for method in (
        group_coordinator.GroupCoordinator._do_heartbeat,
        group_coordinator.GroupCoordinator._maybe_leave_group,
        group_coordinator.CoordinatorGroupRebalance.perform_group_join,
        group_coordinator.CoordinatorGroupRebalance._send_sync_group_request,
    ):
        assert "._send_req(" in inspect.getsource(method), method.__qualname__


def test_group_responses_carry_the_fields_membership_reads() -> None:
    assert HeartbeatResponse_v1(throttle_time_ms=0, error_code=UNKNOWN_MEMBER_ID).error_code == UNKNOWN_MEMBER_ID
    assert "error_code" in SyncGroupResponse_v1.SCHEMA.names
    assert {"error_code", "generation_id"} <= set(JoinGroupResponse_v5.SCHEMA.names)


async def test_watch_observes_group_answers_through_the_client_and_passes_the_rest() -> None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers="127.0.0.1:1", group_id="g", session_timeout_ms=3000, heartbeat_interval_ms=1000
    )
    answers: dict[int, Any] = {
        JOIN: JoinGroupResponse_v5(
            throttle_time_ms=0, error_code=0, generation_id=7, group_protocol="roundrobin",
            leader_id="m", member_id="m", members=[],
        ),
        SYNC: SyncGroupResponse_v1(throttle_time_ms=0, error_code=0, member_assignment=b""),
        HEARTBEAT: HeartbeatResponse_v1(throttle_time_ms=0, error_code=UNKNOWN_MEMBER_ID),
    }
    seen: list[Any] = []

    async def send(node_id: int, request: Any, *, group: Any = None) -> Any:
        seen.append(request)
        return answers.get(request.API_KEY, "metadata")

    consumer._client.send = send
    ml = watch(consumer, stage="s", on_fenced=lambda _n: None)
    assert ml.window_s == 2.0
    await consumer._client.send(0, JoinGroupRequest("g", 3000, 3000, "", None, "consumer", []))
    await consumer._client.send(0, SyncGroupRequest("g", 7, "m", None, []), group="coordination")
    assert ml.fresh() and ml.generation == 7
    assert await consumer._client.send(0, MetadataRequest([])) == "metadata"  # not a group request: untouched
    await consumer._client.send(0, HeartbeatRequest("g", 7, "m"))
    assert not ml.fresh() and not ml.renewable()
    assert len(seen) == 4


async def test_a_call_waits_for_the_lease_no_longer_than_an_output_then_the_stage_stops() -> None:
    """Neither confirmed nor lost (the coordinator answers with errors that prove nothing):
    the frame's call is not left waiting unseen; the stage is stopped, the call cancelled."""
    clock, failed = Clock(), []
    fence = StageFence(failed.append)
    fence.lease = member(clock)
    clock.now += 8.0  # stale, still renewable
    call = asyncio.create_task(fence.admit_call())
    await asyncio.sleep(0.1)
    assert not call.done() and failed == []
    clock.now += SEND_TIMEOUT_S
    await asyncio.sleep(0.1)
    assert call.cancelled()
    assert len(failed) == 1 and isinstance(failed[0], KafkaTimeoutError)
    assert "membership not confirmed" in str(failed[0])


async def test_a_stage_with_nothing_to_send_is_held_no_longer_than_an_output_then_stops() -> None:
    """Seen on Apache Kafka restarted after kill -9: the lease went stale, the coordinator
    neither renewed it nor took it away, and a stage with no output waiting was held for
    minutes with green health. The consume loop's wait is bounded like an output's."""
    clock = Clock()
    fence = StageFence()
    fence.lease = member(clock)
    assert not await fence.held()
    clock.now += 60.0  # a resumed zombie: its stop is not the coordinator's silence
    assert await fence.held()
    assert fence.lease.unanswered_s() == 0.0
    clock.now += SEND_TIMEOUT_S - 0.1
    assert await fence.held()
    clock.now += 0.1
    with pytest.raises(KafkaTimeoutError, match="neither confirmed nor lost in 30s"):
        await fence.held()


@pytest.mark.parametrize("answer", [(HEARTBEAT, NO_ERROR), (HEARTBEAT, UNKNOWN_MEMBER_ID), (HEARTBEAT, REBALANCE_IN_PROGRESS)])
async def test_any_answer_that_settles_the_lease_ends_the_silence(answer: tuple[int, int]) -> None:
    """Renewed, lost (the partitions go back), or a rebalance (bounded by the broker's own
    rebalance timeout): none of them is the silence the bound is for."""
    clock = Clock()
    fence = StageFence()
    fence.lease = member(clock)
    clock.now += 8.0
    assert await fence.held()
    clock.now += SEND_TIMEOUT_S - 1
    fence.lease.observe(*answer, clock.now)
    clock.now += 2
    await fence.held()  # does not raise
    assert fence.lease.unanswered_s() == 0.0
