"""Issue 28: a branch is behind until proven gone; judged by progress, never by a clock.

Why: the join used to call an upstream group that had not committed for max(window, 30 s)
"stopped" and expire its windows. A backlog on two busy cores and a 19 s rejoin made the
branch stages that slow, and half of 10,000 windows were dead-lettered while the branches
were alive and catching up. These tests drive the rule with fake progress inputs and an
injected clock (milliseconds, no sleeping).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.structs import TopicPartition
from prometheus_client import generate_latest

from pipeline.contract.records import read_dead_letter
from pipeline.errors import ConfigError
from pipeline.kafka.progress import (
    BranchState,
    Liveness,
    Upstream,
    UpstreamProgress,
    branch_positions,
    branch_states,
    live_members,
)
from pipeline.observability.metrics import PipelineMetrics
from pipeline.runtime.stages import chain_upstream
from pipeline.settings import KafkaSettings
from pipeline.tools.top.book import SnapshotBook
from pipeline.tools.top.snapshot import parse_snapshot
from pipeline.tools.top.view import plain_lines
from pipeline.topology import load_topology
from tests.helpers.branch_graph import two_branch_graph
from workers.join.expiry import expiry_rules
from workers.join.stage import JoinSettings, JoinStage, JoinState, JoinStateCodec
from workers.runtime.event_time import now_ms
from workers.runtime.stage_io import StageIO
from workers.runtime.upstream import UpstreamWatch, watched_clock

REPO = Path(__file__).resolve().parents[2]
KAFKA = KafkaSettings(bootstrap_servers="x:1")


class _Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ the states


def _chain() -> list[Upstream]:
    """Branch "score" (its own group at depth 0) fed by "normalise" (depth 1)."""
    return [Upstream("t.score", "t.normalise.out", "score", 0), Upstream("t.normalise", "t.in", "score", 1)]


def test_a_group_that_stopped_committing_stays_behind_however_long_while_it_has_members() -> None:
    clock = _Clock()
    live = Liveness(gone_after_s=180, clock=clock)
    left = {("t.score", TopicPartition("t.normalise.out", 0))}
    for clock.now in (0.0, 30.0, 3600.0):  # a rejoin, a long backlog: no commit at all
        live.observe({"t.score": 1, "t.normalise": 1})
        assert branch_states(_chain(), left, live.gone, [0]) == {("score", 0): BranchState.BEHIND}


def test_a_group_without_live_members_is_gone_only_after_branch_gone_after() -> None:
    clock = _Clock()
    live = Liveness(gone_after_s=180, clock=clock)
    clock.now = 10.0
    live.observe({"t.score": 1})  # last seen with a member
    clock.now = 10.5
    live.observe({"t.score": 0})  # its last member left (a deploy, or for good)
    clock.now = 189.9
    assert not live.gone("t.score"), "a rolling deploy's gap is not gone"
    clock.now = 190.1
    assert live.gone("t.score")
    live.observe({"t.score": 1})
    assert not live.gone("t.score"), "a member is back: it delivers again"


def test_a_group_first_seen_empty_gets_the_full_time_and_an_unknown_one_is_never_gone() -> None:
    clock = _Clock()
    live = Liveness(gone_after_s=5, clock=clock)
    clock.now = 100.0
    live.observe({"t.score": 0})  # never started, or starting right now
    clock.now = 104.0
    assert not live.gone("t.score")
    clock.now = 105.1
    assert live.gone("t.score")
    assert not live.gone("t.never-described"), "no answer about it is no evidence"


def test_the_nearest_group_that_is_not_caught_up_decides() -> None:
    chain, out0, in0 = _chain(), TopicPartition("t.normalise.out", 0), TopicPartition("t.in", 0)

    def gone(*groups: str) -> Any:
        return lambda group: group in groups

    assert branch_states(chain, set(), gone(), [0]) == {("score", 0): BranchState.CAUGHT_UP}
    # The branch's own stage is gone: nothing passes through it, however far behind normalise is.
    assert branch_states(chain, {("t.normalise", in0)}, gone("t.score"), [0])[("score", 0)] is BranchState.GONE
    # The branch's stage is alive with records left: what it holds still comes.
    assert branch_states(chain, {("t.score", out0)}, gone("t.normalise"), [0])[("score", 0)] is BranchState.BEHIND
    # ... and once it has processed them, nothing more can come.
    assert branch_states(chain, set(), gone("t.normalise"), [0])[("score", 0)] is BranchState.GONE
    # Every partition of a group's input counts for every partition of the branch: a client that
    # hashes keys unlike Java's murmur2 (librdkafka's CRC32) sends t.in[0]'s requests to score[1].
    assert branch_states(chain, {("t.normalise", in0)}, gone(), [0, 1]) == {
        ("score", 0): BranchState.BEHIND,
        ("score", 1): BranchState.BEHIND,
    }


def test_a_behind_branchs_position_is_its_oldest_record_left_over_its_live_groups() -> None:
    chain = _chain()
    out0, out1, in1 = TopicPartition("t.normalise.out", 0), TopicPartition("t.normalise.out", 1), TopicPartition("t.in", 1)
    left = {("t.score", out0), ("t.score", out1), ("t.normalise", in1)}
    stamps = {("t.score", out0): 5_000, ("t.score", out1): 7_000, ("t.normalise", in1): 4_000}
    assert branch_positions(chain, left, lambda _g: False, stamps) == {"score": 4_000}
    # Nothing of a group past a gone one passes through it.
    assert branch_positions(chain, left, lambda g: g == "t.normalise", stamps) == {"score": 5_000}
    # A stamp not known (the fetch brought none) holds every window: position 0.
    assert branch_positions(chain, left, lambda _g: False, {**stamps, ("t.score", out1): None}) == {"score": 0}
    assert branch_positions(chain, set(), lambda _g: False, {}) == {}, "nothing left: not behind"


def test_live_members_are_read_from_describe_groups_and_errors_are_no_evidence() -> None:
    member = ("m-1", "client", "/127.0.0.1", b"", b"")
    response = SimpleNamespace(
        groups=[(0, "t.score", "Stable", "consumer", "range", [member]), (0, "t.gone", "Empty", "", "", []), (16, "t.x", "", "", "", [])]
    )
    assert live_members([response]) == {"t.score": 1, "t.gone": 0}


def test_the_graph_walks_each_branch_from_its_own_step_upstream() -> None:
    graph = two_branch_graph(result_join_gone_after_s=5.0, result_join_max_wait_s=None)
    assert graph.chain("calibrate") == [("calibrate", "t.a.out", 0), ("a", "t.prep.out", 1), ("prep", "t.in", 2)]
    assert graph.chain("b") == [("b", "t.prep.out", 0), ("prep", "t.in", 1)]
    join = graph.joins["join-result"]
    assert (join.branch_gone_after_s, join.max_wait_s) == (5.0, None)


# ------------------------------------------------------------------ which rule closes a window


def _rules(marks: dict[str, tuple[int, BranchState, bool]], *, opened: int = 0, now: int = 10_000, max_wait: float | None = 600_000) -> Any:
    return expiry_rules(
        first_ms=1_000, opened_ms=opened, missing=sorted(marks), window_ms=2_000, max_wait_ms=max_wait, now_ms=now,
        judge=lambda branch: marks[branch],
    )


def test_a_behind_branch_holds_the_window_until_what_it_delivered_is_past_its_end() -> None:
    assert _rules({"score": (2_999, BranchState.BEHIND, False)}) is None
    assert _rules({"score": (3_000, BranchState.BEHIND, False)}) == {"score": "event-time"}


def test_each_missing_branch_names_its_rule_and_every_one_must_have_one() -> None:
    assert _rules({"a": (10_000, BranchState.GONE, False), "b": (10_000, BranchState.CAUGHT_UP, True)}) == {
        "a": "gone",
        "b": "caught-up",
    }
    assert _rules({"a": (10_000, BranchState.GONE, False), "b": (0, BranchState.BEHIND, False)}) is None


def test_max_wait_is_a_hard_limit_from_when_the_join_first_held_the_window() -> None:
    behind = {"score": (0, BranchState.BEHIND, False)}
    assert _rules(behind, opened=0, now=599_999) is None
    assert _rules(behind, opened=0, now=600_000) == {"score": "max-wait"}
    assert _rules(behind, opened=0, now=10**9, max_wait=None) is None


# ------------------------------------------------------------------ the join stage


def _join(**settings: Any) -> JoinStage:
    io = StageIO(stage="join-result", group_id="g", input_topic="c", output_topic="out", dead_letter_topic="dl")
    upstream = tuple(
        Upstream(f"t.{b}", "t.normalise.out", b, 0) for b in ("classify", "score")
    ) + tuple(Upstream("t.normalise", "t.in", b, 1) for b in ("classify", "score"))
    node = JoinSettings(
        name="result", branches=("classify", "score"), input_topics=("t.classify.out", "t.score.out"), window_ms=2000,
        upstream=upstream, **settings,
    )
    stage = JoinStage(io, node, state_topic="j.state", kafka=KAFKA, metrics=PipelineMetrics())
    stage.clock.fetched_at = None  # no consumer here: every partition answers
    return stage


def _states(stage: JoinStage, **by_branch: BranchState) -> None:
    stage.progress._states = {(branch, 0): state for branch, state in by_branch.items()}


def _open(stage: JoinStage, *, age_ms: int) -> Any:
    stamp = now_ms() - age_ms
    state = JoinState(first_ms=stamp, branches={"classify": b"C"}, branch_headers={"classify": []}, digests={"classify": "d"})
    stage.states.put(b"cid", state, 0)
    entry = stage.states.entry(b"cid")
    assert entry is not None
    return entry


def test_a_slow_rejoin_during_a_backlog_expires_nothing() -> None:
    stage = _join()
    entry = _open(stage, age_ms=3_600_000)  # an hour-old backlog: far past the window by the wall clock
    _states(stage, classify=BranchState.CAUGHT_UP, score=BranchState.BEHIND)
    assert stage._rules(entry, {}) is None, "score is rejoining: behind, not late"
    _states(stage, classify=BranchState.CAUGHT_UP, score=BranchState.CAUGHT_UP)
    assert stage._rules(entry, {}) == {"score": "caught-up"}, "score caught up without it: it never comes"


def test_a_gone_branch_expires_its_windows_and_the_dead_letter_names_the_rule() -> None:
    stage = _join(branch_gone_after_s=8.0)
    entry = _open(stage, age_ms=3_000)  # past its end: what score wrote before it went is read
    _states(stage, classify=BranchState.CAUGHT_UP, score=BranchState.GONE)
    rules = stage._rules(entry, {})
    assert rules == {"score": "gone"}
    letters = [r for r in stage._expire(entry, rules) if r.dead_letter]
    reason = read_dead_letter(letters[0].headers).reason
    assert reason.startswith("join window of 2000 ms expired; missing score (have classify)")
    assert "rule: score gone (its group had no live member for 8 s)" in reason
    assert stage.metrics.join_expiries.labels("join-result", "gone")._value.get() == 1


def test_max_wait_closes_a_window_a_stuck_branch_holds() -> None:
    stage = _join(max_wait_s=60.0)
    entry = _open(stage, age_ms=100)
    _states(stage, classify=BranchState.CAUGHT_UP, score=BranchState.BEHIND)
    entry.state.opened_ms = now_ms() - 61_000
    rules = stage._rules(entry, {})
    assert rules == {"score": "max-wait"}
    letters = [r for r in stage._expire(entry, rules) if r.dead_letter]
    assert "rule: score max-wait (open 60 s)" in read_dead_letter(letters[0].headers).reason


def test_when_the_join_first_held_a_window_survives_its_restore() -> None:
    codec = JoinStateCodec()
    state = JoinState(first_ms=5, opened_ms=1234)
    assert codec.from_dict(codec.to_dict(state), 1).opened_ms == 1234
    old = {k: v for k, v in codec.to_dict(state).items() if k != "opened_ms"}
    assert abs(codec.from_dict(old, 1).opened_ms - now_ms()) < 1000, "older states count from their restore"


def test_the_gauge_shows_each_branch_as_behind_caught_up_or_gone() -> None:
    metrics = PipelineMetrics()
    upstream = [Upstream("t.classify", "x", "classify"), Upstream("t.score", "x", "score")]
    progress = UpstreamProgress(KAFKA, upstream, ["c"])
    watch = UpstreamWatch(progress, stage="join-result", metrics=metrics)
    watch.publish()
    progress._states = {("classify", 0): BranchState.CAUGHT_UP, ("classify", 1): BranchState.BEHIND, ("score", 0): BranchState.GONE}
    watch.publish()
    text = generate_latest(metrics.registry).decode()
    assert 'pipeline_upstream_state{branch="classify",stage="join-result",state="behind"} 1.0' in text
    assert 'pipeline_upstream_state{branch="classify",stage="join-result",state="caught-up"} 0.0' in text
    assert 'pipeline_upstream_state{branch="score",stage="join-result",state="gone"} 1.0' in text


# ------------------------------------------------------------------ sequence stages


def test_a_sequence_stage_ages_its_streams_only_once_the_stage_before_it_is_caught_up_or_gone() -> None:
    progress = UpstreamProgress(KAFKA, [Upstream("audio.dali", "audio.in")], ["audio.dali.out"])
    watch, clock = watched_clock(progress, lambda _tp: 11, stage="vad", metrics=PipelineMetrics(), grace_ms=0, fetched_at=lambda _tp: now_ms())
    tp = TopicPartition("audio.dali.out", 0)
    clock.assigned([tp])
    last = now_ms() - 3_600_000
    clock.observe(SimpleNamespace(topic=tp.topic, partition=0, offset=10, timestamp=last))  # read to its end
    assert clock.since_s(last, [tp]) == 0.0, "no poll yet: behind"
    progress._states = {("", 0): BranchState.BEHIND}
    assert clock.since_s(last, [tp]) == 0.0, "DALI still holds this stream's next chunks"
    for state in (BranchState.CAUGHT_UP, BranchState.GONE):
        progress._states = {("", 0): state}
        assert clock.since_s(last, [tp]) > 3_500, state
    assert watch.progress is progress


def test_a_chain_stage_is_fed_by_the_stages_before_it_nearest_first() -> None:
    topology = load_topology(REPO / "topologies" / "audio.yaml", environ={})
    [dali, vad] = [s.name for s in topology.stages]
    [up] = chain_upstream(topology, vad)
    assert (up.group_id, up.topic, up.depth) == (topology.group_id(dali), topology.stage_topics()[0].input, 0)
    assert chain_upstream(topology, dali) == ()


# ------------------------------------------------------------------ the topology


def test_durations_carry_their_unit_and_errors_name_the_line(tmp_path: Path) -> None:
    def load(join: str) -> str:
        path = tmp_path / "t.yaml"
        path.write_text(
            "name: t\ninput_topic: t.in\nresult_topic: t.out\ndead_letter_topic: t.dl\nstages:\n  - {name: a, kind: stateless, model: m, input_map: {x: raw}, output_map: {y: s}}\n"
            "  - {name: b, kind: stateless, model: m, input_map: {x: raw}, output_map: {y: u}}\n"
            f"inputs: [raw]\noutputs: [s, u]\nresult_join:\n{join}"
        )
        try:
            topology = load_topology(path, environ={})
        except ConfigError as error:
            return str(error)
        node = topology.graph().joins["join-result"]
        return f"{node.branch_gone_after_s:g} {node.max_wait_s}"

    assert load("  branch_gone_after: 90s\n  max_wait: 1h\n") == "90 3600.0"
    assert load("  max_wait: null\n") == "180 None"
    assert ":11: result_join.branch_gone_after" in load("  branch_gone_after: 3\n")
    assert "is not a duration" in load("  branch_gone_after: 3 minutes\n")
    assert ":12: result_join.max_wait: max_wait (1 s) is shorter than window_ms" in load("  window_ms: 2000.0\n  max_wait: 1s\n")


def test_unit_tests_here_are_fast() -> None:
    started = time.monotonic()
    test_a_group_that_stopped_committing_stays_behind_however_long_while_it_has_members()
    assert time.monotonic() - started < 0.5


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here may reach a broker: the admin client is never started."""
    monkeypatch.setattr(UpstreamProgress, "start", None)


def test_pipeline_top_shows_a_joins_branches_worst_state_over_its_processes() -> None:
    book = SnapshotBook("t", metrics_interval_s=1.0)
    for process, score in (("h:1", BranchState.CAUGHT_UP), ("h:2", BranchState.BEHIND)):
        metrics = PipelineMetrics("t")
        progress = UpstreamProgress(KAFKA, [Upstream("t.classify", "x", "classify"), Upstream("t.score", "x", "score")], [])
        progress._states = {("classify", 0): BranchState.CAUGHT_UP, ("score", 0): score}
        UpstreamWatch(progress, stage="join-result", metrics=metrics).publish()
        payload = {"topology": "t", "process": process, "timestamp_ms": 1_000_000, "metrics": metrics.snapshot()}
        book.add(parse_snapshot(json.dumps(payload).encode()))
    [row] = [line for line in plain_lines(book.frame(1_000_500)) if line.startswith("join-result")]
    assert row.startswith("join-result [classify caught-up, score behind]")


def test_an_expiry_logs_the_offsets_it_was_decided_on_once_per_branch_partition(caplog: pytest.LogCaptureFixture) -> None:
    """How the backlog failure of 2026-11-27 was found ('start None'): each sweep that closes
    windows says, per missing branch partition, what the clock and the upstream poll saw."""
    from workers.join.stage import explain_expiry

    stage = _join()
    explained: set[tuple[str, int]] = set()
    with caplog.at_level(logging.INFO, logger="workers.join.stage"):
        for _ in range(3):  # three windows of one partition in one sweep
            explain_expiry(stage, {"score": "caught-up"}, 0, explained)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "score expired on" in lines[0] and "last read None, start None" in lines[0], lines
    assert "upstream: no poll yet" in lines[0]


def test_the_oldest_record_left_is_a_sliding_minimum_over_offsets_not_the_first_stamp() -> None:
    """A partition out of timestamp order (a request redone after newer ones): the oldest
    stamp from any start offset on, as the start moves forward and records are added."""
    from pipeline.kafka.partition_reads import _Left

    left = _Left(base=10, read_to=10)
    left.add([(10, 500), (11, 900), (12, 400), (13, 950), (14, 700)], after=15)
    assert left.minima[0] == (12, 400) and left.read_to == 15
    left.add([(12, 1)], after=13)  # already read: ignored
    assert left.minima[0] == (12, 400)
    left.start_at(13)  # the group committed past the oldest one
    assert left.minima[0] == (14, 700)
    left.add([(15, 650)], after=16)
    assert left.minima[0] == (15, 650)
    left.start_at(16)
    assert not left.minima and left.read_to == 16
