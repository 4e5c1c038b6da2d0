"""Priority lanes: the scheduling rule, its interplay with backpressure, and the configuration."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import pytest
from aiokafka.structs import TopicPartition

from pipeline.errors import ConfigError
from pipeline.observability.metrics import PipelineMetrics
from pipeline.tools.target import Target
from pipeline.topology.lanes import Lane, find_lane
from pipeline.topology.loader import load_topology, parse_topology
from workers.runtime.flow_control import FlowControl
from workers.runtime.lanes import LaneRule, LaneScheduler, lane_priority

HIGH, MID, LOW = "in.lane.high", "in.lane.mid", "in"
LANES = (Lane("high", HIGH, 1), Lane("mid", MID), Lane("default", LOW))


def tps(topic: str, n: int = 2) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(n)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class StubConsumer:
    """The few consumer calls the scheduler and flow control make, over plain dicts."""

    def __init__(self, partitions: Iterable[TopicPartition]) -> None:
        self.assigned = set(partitions)
        self.positions = dict.fromkeys(self.assigned, 0)
        self.highs: dict[TopicPartition, int | None] = dict.fromkeys(self.assigned, None)
        self._paused: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.highs[tp]

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def pause(self, *partitions: TopicPartition) -> None:
        self._paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._paused.difference_update(partitions)


def scheduler(clock: Clock) -> LaneScheduler:
    rule = LaneRule([lane.topic for lane in LANES], clock=clock)
    return LaneScheduler("classify", LANES, PipelineMetrics(), rule)


def apply(s: LaneScheduler, consumer: StubConsumer, backpressure: bool = False) -> None:
    asyncio.run(s.apply(consumer, consumer.assignment(), backpressure))  # type: ignore[arg-type]


ALL = [*tps(HIGH), *tps(MID), *tps(LOW)]


def test_lower_lanes_pause_while_a_higher_lane_has_records_and_resume_when_drained() -> None:
    clock, consumer = Clock(), StubConsumer(ALL)
    s = scheduler(clock)
    for tp in ALL:
        consumer.highs[tp] = 0  # every partition fetched once, all empty
    apply(s, consumer)
    assert consumer.paused() == set()
    consumer.highs[TopicPartition(HIGH, 1)] = 5  # records on one partition of the top lane
    apply(s, consumer)
    assert consumer.paused() == {*tps(MID), *tps(LOW)}  # every partition of both lower lanes
    consumer.positions[TopicPartition(HIGH, 1)] = 5  # read to its end
    apply(s, consumer)
    assert consumer.paused() == set()


def test_a_middle_lane_holds_only_the_lanes_below_it() -> None:
    clock, consumer = Clock(), StubConsumer(ALL)
    s = scheduler(clock)
    for tp in ALL:
        consumer.highs[tp] = 10
    consumer.positions.update(dict.fromkeys(tps(HIGH), 10))  # top lane drained
    apply(s, consumer)
    assert consumer.paused() == set(tps(LOW))


def test_a_partition_never_fetched_counts_as_empty() -> None:
    """No high watermark yet (no fetch response): nothing is known, nothing is held."""
    consumer = StubConsumer(ALL)
    s = scheduler(Clock())
    apply(s, consumer)
    assert consumer.paused() == set()


def test_a_stale_high_watermark_never_holds_the_lower_lanes_forever() -> None:
    """Tansu-like off-by-one: the high lane reports one record more than it will ever give.
    The lower lanes are held only until the (position, high watermark) has been still for
    ``stale_after_s``; then they run, and a real new record holds them again."""
    clock, consumer = Clock(), StubConsumer(ALL)
    s = scheduler(clock)
    for tp in ALL:
        consumer.highs[tp] = 0
    consumer.highs[TopicPartition(HIGH, 0)] = 8
    consumer.positions[TopicPartition(HIGH, 0)] = 7  # drained, but position < high forever
    apply(s, consumer)
    assert consumer.paused() == {*tps(MID), *tps(LOW)}
    clock.now += s.rule.stale_after_s / 2
    apply(s, consumer)
    assert consumer.paused() == {*tps(MID), *tps(LOW)}
    clock.now += s.rule.stale_after_s
    apply(s, consumer)
    assert consumer.paused() == set(), "a drained lane that looks non-empty must not hold the others"
    clock.now += 60
    apply(s, consumer)
    assert consumer.paused() == set()
    consumer.highs[TopicPartition(HIGH, 0)] = 9  # a new record does arrive
    apply(s, consumer)
    assert consumer.paused() == {*tps(MID), *tps(LOW)}


def test_backpressure_wins_and_its_pause_is_never_undone_by_lanes() -> None:
    """Flow control pauses everything; lanes leave that alone, and after flow control
    resumes everything the lower lanes are held again in the same turn (before a fetch)."""
    clock, consumer = Clock(), StubConsumer(ALL)
    s = scheduler(clock)
    flow = FlowControl("classify", PipelineMetrics(), max_pending=100, max_pending_bytes=10**9)
    for tp in ALL:
        consumer.highs[tp] = 0
    consumer.highs[TopicPartition(HIGH, 0)] = 3

    def turn(pending: int) -> None:
        flow.update(consumer, pending, 0)  # type: ignore[arg-type]
        apply(s, consumer, flow.paused)

    turn(10)
    assert consumer.paused() == {*tps(MID), *tps(LOW)}
    turn(100)  # backpressure: all paused
    assert consumer.paused() == set(ALL)
    consumer.positions[TopicPartition(HIGH, 0)] = 3  # meanwhile the held lanes' reason is gone
    turn(90)  # still above half: flow keeps everything paused, lanes must not resume a thing
    assert consumer.paused() == set(ALL)
    consumer.highs[TopicPartition(HIGH, 1)] = 4  # and the high lane has records again
    clock.now += 10 * s.rule.stale_after_s  # a long backpressure pause is not staleness
    turn(10)  # flow resumes all; lanes hold the lower ones again at once
    assert consumer.paused() == {*tps(MID), *tps(LOW)}


def test_revoked_partitions_are_neither_paused_nor_resumed() -> None:
    clock, consumer = Clock(), StubConsumer(ALL)
    s = scheduler(clock)
    for tp in ALL:
        consumer.highs[tp] = 0
    consumer.highs[TopicPartition(HIGH, 0)] = 2
    apply(s, consumer)
    consumer.assigned -= set(tps(LOW))
    consumer.resume(*tps(LOW))  # aiokafka forgets a revoked partition's state
    consumer.positions[TopicPartition(HIGH, 0)] = 2
    apply(s, consumer)
    assert consumer.paused() == set()
    assert s.held == set()


def test_requests_are_counted_by_lane_and_held_lanes_are_exported() -> None:
    metrics = PipelineMetrics()
    clock, consumer = Clock(), StubConsumer(ALL)
    s = LaneScheduler("classify", LANES, metrics, LaneRule([lane.topic for lane in LANES], clock=clock))
    for tp in [TopicPartition(HIGH, 0), TopicPartition(LOW, 1), TopicPartition(LOW, 0)]:
        s.consumed(tp)
    for tp in ALL:
        consumer.highs[tp] = 0
    consumer.highs[TopicPartition(MID, 0)] = 1
    apply(s, consumer)
    value = metrics.registry.get_sample_value
    assert value("pipeline_lane_requests_total", {"stage": "classify", "lane": "high"}) == 1
    assert value("pipeline_lane_requests_total", {"stage": "classify", "lane": "default"}) == 2
    assert value("pipeline_lane_held", {"stage": "classify", "lane": "default"}) == 1
    assert value("pipeline_lane_held", {"stage": "classify", "lane": "mid"}) == 0


def test_lane_priority_is_the_lanes_own_else_none() -> None:
    assert lane_priority(LANES, HIGH) == 1
    assert lane_priority(LANES, MID) is None
    assert lane_priority(LANES, "elsewhere") is None


# --------------------------------------------------------------------------- configuration

BASE = """\
name: t
input_topic: in
result_topic: out
{lanes}
stages:
  - name: first
    kind: {kind}
{extra}"""
STATELESS = "    model: m\n"
SEQUENCE = "    model: vad\n    input_tensor: audio\n"


def topology(lanes: str, kind: str = "stateless", extra: str = STATELESS) -> str:
    return BASE.format(lanes=lanes, kind=kind, extra=extra)


def error(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_topology(text, "t.yaml")
    return str(caught.value)


def test_lanes_resolve_highest_first_with_derived_topics_created_with_the_others() -> None:
    t = parse_topology(topology("lanes:\n  - {name: high, priority: 1}\n  - {name: mid, topic: mid.requests}"), "t.yaml")
    assert t.resolved_lanes() == (Lane("high", "in.lane.high", 1), Lane("mid", "mid.requests"), Lane("default", "in"))
    assert t.topics()[:3] == ["in", "in.lane.high", "mid.requests"]
    assert parse_topology(topology(""), "t.yaml").resolved_lanes() == ()


def test_duplicate_lane_names_are_refused_at_their_line() -> None:
    assert error(topology("lanes:\n  - {name: high}\n  - {name: high}")) == (
        "t.yaml:6: lanes[1].name: duplicate lane name 'high' (also lanes[0])"
    )


def test_a_lane_topic_colliding_with_another_topic_is_refused() -> None:
    assert error(topology("lanes:\n  - name: high\n    topic: out")) == (
        "t.yaml:6: lanes[0].topic: lane topic 'out' is also the topology's output of stage 'first'"
    )
    assert "lanes[1].topic: lane topic 'in.lane.a' is also the topology's topic of lanes[0]" in error(
        topology("lanes:\n  - {name: a}\n  - {name: b, topic: in.lane.a}")
    )
    assert "is also the topology's input_topic" in error(topology("lanes:\n  - {name: a, topic: in}"))


def test_the_default_lane_name_is_reserved() -> None:
    assert "lanes[0].name: lane name 'default' is the input_topic's own lane" in error(
        topology("lanes:\n  - {name: default}")
    )


def test_lanes_are_refused_before_a_sequence_stage() -> None:
    message = error(topology("lanes:\n  - {name: high}", kind="sequence", extra=SEQUENCE))
    assert message.startswith("t.yaml:4: lanes: lanes need a stateless or dali first stage; stage 'first' is a sequence stage")
    assert "no order between them" in message


def test_unknown_lane_names_the_lanes_there_are() -> None:
    lanes = (Lane("high", "in.lane.high"), Lane("default", "in"))
    with pytest.raises(ConfigError, match=r"^no lane 'nosuch' in this topology \(lanes: high, default\)$"):
        find_lane(lanes, "nosuch")
    with pytest.raises(ConfigError, match=r"lanes: only 'default': it declares no lanes"):
        find_lane((), "high")
    assert find_lane(lanes, None) is None
    assert find_lane((), "default") is None
    assert find_lane(lanes, "default") == Lane("default", "in")


def test_produce_target_picks_the_lane_topic(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(topology("lanes:\n  - {name: high}"))
    target = Target(load_topology(path), model="m")
    assert target.input_topic(None, "high") == "in.lane.high"
    assert target.input_topic(None, None) == "in"
    with pytest.raises(ConfigError, match="give one"):
        target.input_topic("x", "high")


def test_the_example_topology_declares_a_high_lane() -> None:
    t = load_topology(Path(__file__).resolve().parents[2] / "topologies" / "lanes.yaml")
    assert [lane.name for lane in t.resolved_lanes()] == ["high", "default"]
    assert t.resolved_lanes()[0].priority == 1


def test_a_lanes_priority_reaches_triton_unless_the_request_names_its_own() -> None:
    from typing import Any

    from aiokafka.structs import ConsumerRecord

    from pipeline.contract.request import decode_request, encode_request
    from pipeline.settings import KafkaSettings
    from workers.runtime.stage_io import StageIO
    from workers.stateless.features import ApplyDefaults
    from workers.stateless.stage import BatchingSettings, BatchingStage

    io = StageIO("classify", "g", LOW, "out", "dl", lanes=LANES)
    backend: Any = object()  # never called: only the defaults are applied here
    stage = BatchingStage(io, backend, BatchingSettings(default_priority=5), kafka=KafkaSettings(), metrics=PipelineMetrics())
    assert io.input_topics == [LOW, HIGH, MID]

    def priority(topic: str, own: int | None = None) -> int | None:
        record = encode_request({"features": [[0.0] * 16]}, correlation_id="c", priority=own)
        consumed = ConsumerRecord(topic, 0, 0, 0, 0, b"c", record.value, None, 1, len(record.value), record.headers)
        request = decode_request(record.value, list(record.headers))
        defaults = next(step for step in stage.features.requests if isinstance(step, ApplyDefaults))
        return defaults.applied(request, consumed).priority

    assert priority(HIGH) == 1  # the lane's
    assert priority(MID) == 5  # a lane without its own: the stage's
    assert priority(LOW) == 5
    assert priority(HIGH, own=3) == 3  # the request's own wins


def test_the_first_stages_autoscaling_reads_every_lane() -> None:
    from pipeline.deploy.units import run_units

    t = load_topology(Path(__file__).resolve().parents[2] / "topologies" / "lanes.yaml")
    assert run_units(t)[0].input_topics == ("lanes.requests", "lanes.requests.lane.high")
