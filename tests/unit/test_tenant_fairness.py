"""Tenant fairness, pure logic: token buckets, delay scheduling, metric labels, the fair
share of a batch, the batcher's pick mode, the gate's outcomes, and the topology section."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipeline.contract.errors import ErrorClass
from pipeline.errors import ConfigError
from pipeline.kafka.outbox import OutRecord
from pipeline.observability.metrics import PipelineMetrics
from pipeline.runtime.tenant_settings import tenancy_settings
from pipeline.topology import load_topology
from pipeline.topology.model import StatelessStageConfig
from workers.stateless.batching import DynamicBatcher
from workers.stateless.tenancy.fair_batcher import FairBatcher
from workers.stateless.tenancy.fair_share import fair_pick
from workers.stateless.tenancy.gate import (
    DELAY_COUNT,
    DELAY_UNTIL,
    StageHooks,
    TenancySettings,
    TenantGate,
    stage_batcher,
)
from workers.stateless.tenancy.quotas import OTHER, QuotaSpec, TenantLabels, TenantQuotas

REPO = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- quotas


async def test_a_bucket_admits_its_burst_then_its_rate() -> None:
    quotas = TenantQuotas(QuotaSpec(rate=20, burst=5), {}, max_delay_s=5)
    admitted = [await quotas.admit("a") for _ in range(8)]
    assert admitted == [True] * 5 + [False] * 3
    await asyncio.sleep(0.11)  # 20/s: two tokens back
    assert [await quotas.admit("a") for _ in range(3)] == [True, True, False]


async def test_tenants_have_their_own_buckets_and_overrides() -> None:
    quotas = TenantQuotas(QuotaSpec(rate=1, burst=1), {"big": QuotaSpec(rate=100, burst=3)}, max_delay_s=5)
    assert [await quotas.admit("a") for _ in range(2)] == [True, False]
    assert [await quotas.admit("b") for _ in range(2)] == [True, False]  # a's flood costs b nothing
    assert [await quotas.admit("big") for _ in range(4)] == [True, True, True, False]


async def test_admission_never_waits() -> None:
    quotas = TenantQuotas(QuotaSpec(rate=0.01, burst=1), {}, max_delay_s=5)
    started = time.monotonic()
    assert [await quotas.admit("a") for _ in range(100)] == [True] + [False] * 99
    assert time.monotonic() - started < 0.05


def test_delayed_requests_come_back_at_the_tenants_rate_within_the_cap() -> None:
    quotas = TenantQuotas(QuotaSpec(rate=10, burst=1), {}, max_delay_s=0.35)
    dues = [quotas.come_back_at("a", now=100.0) for _ in range(5)]
    assert dues == pytest.approx([100.1, 100.2, 100.3, 100.35, 100.35])
    assert quotas.come_back_at("b", now=100.0) == pytest.approx(100.1)  # per tenant


def test_labels_keep_configured_and_first_tenants_then_other() -> None:
    labels = TenantLabels(["vip"], limit=3)
    assert [labels(t) for t in ["vip", "a", "b", "c", "a", ""]] == ["vip", "a", "b", OTHER, "a", "none"]


# --------------------------------------------------------------------------- fair share


def test_fair_pick_splits_rows_equally_while_both_wait() -> None:
    waiting = [("flood", 1)] * 100 + [("calm", 1)] * 10
    chosen = fair_pick(waiting, 64)
    tenants = [waiting[i][0] for i in chosen]
    assert len(chosen) == 64
    assert tenants.count("calm") == 10  # all of calm's rows: it needs less than its share
    assert tenants.count("flood") == 54  # the rest of the batch is not left empty
    assert chosen == sorted(chosen)


def test_fair_pick_caps_a_tenant_at_its_share() -> None:
    waiting = [("a", 1)] * 50 + [("b", 1)] * 50 + [("c", 1)] * 50
    tenants = [waiting[i][0] for i in fair_pick(waiting, 30)]
    assert {t: tenants.count(t) for t in "abc"} == {"a": 10, "b": 10, "c": 10}


def test_fair_pick_counts_rows_not_requests_and_keeps_fifo_within_a_tenant() -> None:
    waiting = [("a", 8), ("a", 8), ("a", 8), ("b", 1), ("b", 1), ("a", 8)]
    chosen = fair_pick(waiting, 16)
    assert chosen == [0, 3, 4]  # a's second 8-row request would exceed its share of 8


def test_fair_pick_always_sends_the_oldest_and_fills_what_is_left() -> None:
    assert fair_pick([("a", 10), ("b", 10), ("c", 6)], 10) == [0]
    assert fair_pick([("a", 2), ("b", 6), ("c", 6)], 10) == [0, 1]  # 6 > a share of 4, but fits 8
    assert fair_pick([], 10) == []


# --------------------------------------------------------------------------- batcher pick mode


def test_pick_mode_holds_groups_until_a_call_can_start_then_shares() -> None:
    room = [0]
    batcher: FairBatcher[str] = FairBatcher(
        4, 0.005, pick=lambda items, rows: fair_pick([(i[0], 1) for i in items], rows), capacity=lambda: room[0]
    )
    for i in range(6):
        assert batcher.add("k", f"f{i}", rows=1, now=0) == []  # no call can start: the group grows
    batcher.add("k", "c0", rows=1, now=0)
    assert batcher.next_due() is None  # nothing can go: the stage calls due() when a call ends
    room[0] = 1
    [batch] = batcher.due(now=0)
    assert batch.items == ["f0", "f1", "f2", "c0"] and batch.rows == 4  # calm's row in the first call
    assert len(batcher) == 3
    [rest] = batcher.drain()
    assert rest.items == ["f3", "f4", "f5"]


def test_pick_mode_drains_in_calls_of_max_rows() -> None:
    batcher: FairBatcher[int] = FairBatcher(2, 1.0, pick=lambda items, rows: [0, 1], capacity=lambda: 0)
    for i in range(5):
        batcher.add("k", i, rows=1, now=0)
    assert [b.items for b in batcher.drain()] == [[0, 1], [2, 3], [4]]


def test_only_a_stage_with_fair_batches_gets_the_fair_batcher() -> None:
    """The plain batcher has no pick mode (no fairness check per record without tenants)."""
    @dataclass
    class Batching:
        max_queue_delay_s: float = 0.005
        max_batch_bytes: int | None = None
        max_inflight_batches: int = 2

    assert type(stage_batcher(4, Batching(), [], fair=False)) is DynamicBatcher
    assert type(stage_batcher(4, Batching(), [], fair=True)) is FairBatcher


# --------------------------------------------------------------------------- the gate


@dataclass
class _Record:
    topic: str
    key: bytes | None
    headers: list[tuple[str, bytes]]
    value: bytes = b"v"
    partition: int = 0
    offset: int = 0
    timestamp: int = 1_700_000_000_000


@dataclass
class _Stage:
    completed: list[OutRecord] = field(default_factory=list)
    dead: list[tuple[ErrorClass, str]] = field(default_factory=list)

    def hooks(self) -> StageHooks:
        return StageHooks(
            complete=lambda slot, out: self.completed.append(out),
            dead_letter=lambda record, slot, cls, why: self.dead.append((cls, why)),
            consumer=lambda: None,
            flow_paused=lambda: False,
        )


def _gate(stage: _Stage, **changes: Any) -> tuple[TenantGate, PipelineMetrics]:
    settings = TenancySettings(default=QuotaSpec(rate=0.001, burst=1), delay_topic="in.delay", max_delays=2)
    settings = TenancySettings(**{**settings.__dict__, **changes})
    metrics = PipelineMetrics()
    return TenantGate(settings, "s", metrics, stage.hooks()), metrics


def _served(metrics: PipelineMetrics, tenant: str, outcome: str) -> float:
    return metrics.tenant_requests.labels("s", tenant, outcome)._value.get()  # type: ignore[no-any-return]


async def test_over_quota_moves_to_the_delay_topic_with_time_and_count() -> None:
    stage = _Stage()
    gate, metrics = _gate(stage)
    record = _Record("in", b"k", [("tenant", b"acme")])
    assert await gate.admit(record, None) is True  # type: ignore[arg-type]
    assert await gate.admit(record, None) is False  # type: ignore[arg-type]
    [moved] = stage.completed
    headers = dict(moved.headers)
    assert moved.topic == "in.delay" and moved.value == b"v" and not moved.counts_as_result
    assert headers[DELAY_COUNT] == b"1" and int(headers[DELAY_UNTIL]) > time.time() * 1000
    assert moved.timestamp_ms == record.timestamp  # latency and default deadlines stay the request's
    assert (_served(metrics, "acme", "served"), _served(metrics, "acme", "delayed")) == (1, 1)


async def test_delayed_max_times_is_dead_lettered_quota_exceeded() -> None:
    stage = _Stage()
    gate, metrics = _gate(stage)
    await gate.admit(_Record("in", b"k", [("tenant", b"acme")]), None)  # type: ignore[arg-type]
    again = _Record("in.delay", b"k", [("tenant", b"acme"), (DELAY_UNTIL, b"0"), (DELAY_COUNT, b"2")])
    assert await gate.admit(again, None) is False  # type: ignore[arg-type]
    [(cls, why)] = stage.dead
    assert cls is ErrorClass.QUOTA_EXCEEDED and "after 2 delay(s)" in why
    assert _served(metrics, "acme", "quota-exceeded") == 1


async def test_dead_letter_policy_and_key_prefix_tenants() -> None:
    stage = _Stage()
    gate, _ = _gate(stage, delay_topic=None, source="key_prefix", separator="/")
    assert gate.tenant_of(_Record("in", b"acme/req-1", [])) == "acme"
    assert gate.tenant_of(_Record("in", b"req-1", [])) == ""
    await gate.admit(_Record("in", b"acme/1", []), None)  # type: ignore[arg-type]
    await gate.admit(_Record("in", b"acme/2", []), None)  # type: ignore[arg-type]
    assert await gate.admit(_Record("in", b"other/1", []), None) is True  # type: ignore[arg-type]
    assert [cls for cls, _ in stage.dead] == [ErrorClass.QUOTA_EXCEEDED]
    assert stage.completed == []


async def test_a_delayed_record_is_held_until_due_then_checked_again() -> None:
    stage = _Stage()
    gate, _ = _gate(stage, default=QuotaSpec(rate=1000, burst=1))
    soon = int((time.time() + 0.05) * 1000)
    record = _Record("in.delay", b"k", [("tenant", b"a"), (DELAY_UNTIL, str(soon).encode()), (DELAY_COUNT, b"1")])
    assert await gate.admit(record, "slot") is False  # type: ignore[arg-type]
    assert gate.due() == [] and stage.completed == [] and stage.dead == []
    await asyncio.sleep(0.06)
    [(again, slot)] = gate.due()
    assert again is record and slot == "slot"
    assert await gate.admit(again, slot) is True  # type: ignore[arg-type]


async def test_held_records_go_back_unchanged_on_release() -> None:
    stage = _Stage()
    gate, _ = _gate(stage)
    later = str(int((time.time() + 3) * 1000)).encode()
    headers = [("tenant", b"a"), (DELAY_UNTIL, later), (DELAY_COUNT, b"1")]
    await gate.admit(_Record("in.delay", b"k", headers), None)  # type: ignore[arg-type]
    gate.return_held(None)
    [back] = stage.completed
    assert back.topic == "in.delay" and back.headers == headers
    assert gate.due() == []


# --------------------------------------------------------------------------- the topology section


def test_the_example_topology_loads() -> None:
    topology = load_topology(REPO / "topologies" / "tenants.yaml", environ={})
    [stage] = topology.stages
    assert isinstance(stage, StatelessStageConfig) and stage.tenants is not None
    assert "tenants.requests.delay" in topology.topics()
    settings = tenancy_settings(stage.tenants, topology.input_topic)
    assert settings is not None and settings.delay_topic == "tenants.requests.delay"
    assert settings.overrides["trial"] == QuotaSpec(rate=10, burst=5)


BASE = """\
name: demo
input_topic: requests
result_topic: results
stages:
  - name: classify
    kind: stateless
    model: dense_classifier
    tenants:
      default: {rate: 10, burst: 5}
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE.replace("rate: 10", "rate: 0"), ":9: stages[0].tenants.default.rate: Input should be greater than 0"),
        (BASE.replace("burst: 5", "burst: -1"), ":9: stages[0].tenants.default.burst: Input should be greater than 0"),
        (BASE + "      over_quota: wait\n", ":10: stages[0].tenants.over_quota: Input should be 'delay' or 'dead-letter'"),
        (BASE + "      from: body\n", ":10: stages[0].tenants.from: Input should be 'header' or 'key_prefix'"),
        (
            BASE + "      overrides:\n        - {tenant: a, rate: 1}\n        - {tenant: a, rate: 2}\n",
            ":12: stages[0].tenants.overrides[1].tenant: duplicate tenant 'a' (also overrides[0])",
        ),
        (
            BASE.replace("result_topic: results", "result_topic: requests.delay"),
            ":8: stages[0].tenants.over_quota: the delay topic 'requests.delay' is also another topic",
        ),
        (
            BASE.replace("dead_letter", "x") + "      over_quota: delay\n"
            + "dead_letter_topic: requests.delay\n",
            ":10: stages[0].tenants.over_quota: the delay topic 'requests.delay' is also another topic",
        ),
    ],
    ids=["rate", "burst", "policy", "source", "duplicate-override", "delay-is-result", "delay-is-dead-letters"],
)
def test_tenants_errors_name_file_line_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_topology(path, environ={})
    assert str(caught.value).startswith(f"{path}{expected}")


def test_dead_letter_policy_has_no_delay_topic(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(BASE + "      over_quota: dead-letter\n")
    assert not any(t.endswith(".delay") for t in load_topology(path, environ={}).topics())
