"""Tenant fairness end to end: `pipeline run` on the dense_classifier topology (as in
topologies/dense.yaml, with a ``tenants`` section) against the real broker and Triton.

One tenant floods at 10x its quota while another sends at its quota, on the same input
topic and partitions. The calm tenant's latency (its request's CreateTime on the input
topic to its result's CreateTime) stays within a bound, and every request of both gets
exactly one outcome, counted by correlation id: a result, or (flood only) a
``quota-exceeded`` dead letter. Both over-quota policies run.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka.structs import ConsumerRecord, RecordMetadata

from pipeline.contract.records import Record, read_dead_letter
from pipeline.contract.request import encode_request
from tests.helpers.dense_reference import random_features
from tests.helpers.figures import FaultFigures, report
from tests.helpers.kafka_io import header, produce
from tests.helpers.topology_process import collect_outputs, pipeline_process, write_topology

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow, pytest.mark.exclusive]  # measures time: alone

Rec = ConsumerRecord[bytes, bytes]

QUOTA = 50.0  # requests/s of each tenant
BURST = 20
SECONDS = 6.0
CALM_N = int(QUOTA * SECONDS)  # at its quota
FLOOD_N = int(10 * QUOTA * SECONDS)  # 10x its quota
CALM_P99_BOUND_MS = 250.0
"""Calm tenant's p99 and max send-to-result latency. Measured on the 2-core machine with
the flood running and other jobs beside it (2026-11-24, three runs each, the figures this
test prints): policy dead-letter p50 24-25 ms, p99 35-42 ms, max 43-57 ms; policy delay (the
delay topic's traffic too) p50 25-39 ms, p99 65-98 ms, max 100-124 ms. The bound is twice
the worst max."""


def _requests(tenant: str, n: int, seed: int) -> list[Record]:
    features = random_features(n, seed)
    records = []
    for i in range(n):
        r = encode_request({"features": features[i : i + 1]}, correlation_id=f"{tenant}-{i}")
        records.append(Record(r.key, r.value, [*r.headers, ("tenant", tenant.encode())]))
    return records


def _tenants(over_quota: str) -> dict[str, Any]:
    return {
        "tenants": {
            "from": "header",
            "default": {"rate": QUOTA, "burst": BURST},
            "overrides": [{"tenant": "calm", "rate": QUOTA, "burst": BURST}],
            "over_quota": over_quota,
            "max_delays": 3,
            "max_delay_ms": 2000,
        }
    }


def _sent_ms(tenant: str, acks: list[RecordMetadata]) -> dict[str, int]:
    """Each request's CreateTime, by correlation id, from its producer's acknowledgement:
    what the broker stored, without reading the input topic back. In stop 25's CI a read-back
    on the embedded Tansu came back without ``calm-0``, which the stage had answered; the
    timestamps are the same either way, since the broker keeps a record's CreateTime."""
    return {f"{tenant}-{i}": ack.timestamp or 0 for i, ack in enumerate(acks)}


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


@pytest.mark.parametrize("over_quota", ["delay", "dead-letter"])
def test_a_flood_at_ten_times_its_quota_does_not_hurt_a_calm_tenant_and_nothing_is_lost(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path, over_quota: str
) -> None:
    topology = write_topology(tmp_path, partitions=4, stage=_tenants(over_quota))
    calm, flood = _requests("calm", CALM_N, 1), _requests("flood", FLOOD_N, 2)
    everything = {f"calm-{i}" for i in range(CALM_N)} | {f"flood-{i}" for i in range(FLOOD_N)}
    with pipeline_process(topology, cli_env, tmp_path) as process:

        async def send_both() -> dict[str, int]:
            calm_acks, flood_acks = await asyncio.gather(
                produce(kafka_bootstrap, topology.input_topic, calm, rate=QUOTA),
                produce(kafka_bootstrap, topology.input_topic, flood, rate=10 * QUOTA),
            )
            return _sent_ms("calm", calm_acks) | _sent_ms("flood", flood_acks)

        sent_ms = asyncio.run(send_both())
        outputs = collect_outputs(
            kafka_bootstrap,
            topology,
            done=lambda records: {header(r, "correlation-id") for r in records} >= everything,
            timeout=120,
        )
        served = {t: process.metric("pipeline_tenant_requests_total", tenant=t, outcome="served") for t in ("calm", "flood")}
        delayed = {t: process.metric("pipeline_tenant_requests_total", tenant=t, outcome="delayed") for t in ("calm", "flood")}
        exceeded = process.metric("pipeline_tenant_requests_total", tenant="flood", outcome="quota-exceeded")
        assert process.terminate() == 0

    results = outputs.on(topology.result_topic)
    dead = outputs.on(topology.dead_letter_topic)
    outcomes = Counter(header(r, "correlation-id") for r in results + dead)
    # Exactly one outcome per request, by correlation id: nothing lost, nothing twice.
    assert set(outcomes) == everything, f"lost: {len(everything - set(outcomes))}"
    assert [cid for cid, n in outcomes.items() if n > 1] == []
    assert {read_dead_letter(r.headers).error_class for r in dead} <= {"quota-exceeded"}
    assert all(header(r, "correlation-id").startswith("flood-") for r in dead)
    flood_results = sum(1 for r in results if header(r, "correlation-id").startswith("flood-"))
    assert flood_results + len(dead) == FLOOD_N
    # The limiter held the flood to about its quota: burst + rate x the time it was served.
    served_window_s = (max(r.timestamp for r in results) - min(sent_ms.values())) / 1000
    assert flood_results <= BURST + QUOTA * served_window_s * 1.1 + 5
    assert flood_results >= QUOTA * SECONDS * 0.5  # and did serve it, at its quota
    # Metrics agree with what the topics hold.
    assert served["flood"] == flood_results and exceeded == len(dead)
    assert served["calm"] == CALM_N and delayed["calm"] == 0
    assert (delayed["flood"] > 0) == (over_quota == "delay")
    came_back = [r for r in results if header(r, "quota-delay-count")]  # served after a delay
    assert (len(came_back) > 0) == (over_quota == "delay")
    assert all(header(r, "correlation-id").startswith("flood-") for r in came_back)
    # The calm tenant's latency, send to result.
    calm_ms = [
        r.timestamp - sent_ms[header(r, "correlation-id")] for r in results if header(r, "correlation-id").startswith("calm-")
    ]
    assert len(calm_ms) == CALM_N
    p50, p99, worst = _percentile(calm_ms, 50), _percentile(calm_ms, 99), max(calm_ms)
    report(
        FaultFigures(
            scenario=f"tenant flood at 10x quota, over_quota={over_quota}",
            topology="dense",
            sent=CALM_N + FLOOD_N,
            results=len(results),
            duplicates=0,
            exact_duplicates=True,
            dead_letters=len(dead),
            lost=len(everything - set(outcomes)),
            note=(
                f"calm latency p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {worst:.0f} ms (bound {CALM_P99_BOUND_MS:.0f}); "
                f"flood: {flood_results} served over {served_window_s:.1f} s, {delayed['flood']:.0f} delays, "
                f"{len(dead)} quota-exceeded"
            ),
        )
    )
    assert p99 <= CALM_P99_BOUND_MS and worst <= CALM_P99_BOUND_MS, (p50, p99, worst)


def _calm_latencies(kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path, fair: bool) -> tuple[list[float], int]:
    """A backlog of 4,000 one-row requests of one tenant at once, a calm tenant's 100 at
    50/s beside it, into one call of 8 rows in flight: the calm tenant's send-to-result
    latencies, and how many outcomes arrived in all."""
    stage = {
        "batching": {"max_batch_size": 8, "max_queue_delay_ms": 2.0, "max_inflight_batches": 1, "max_pending_requests": 8192},
        "tenants": {"default": {"rate": 100_000.0, "burst": 100_000}, "fair_share": fair},
    }
    topology = write_topology(tmp_path, partitions=2, stage=stage)
    backlog, calm = _requests("backlog", 4000, 3), _requests("calm", 100, 4)
    with pipeline_process(topology, cli_env, tmp_path) as process:

        async def send_both() -> dict[str, int]:
            backlog_acks, calm_acks = await asyncio.gather(
                produce(kafka_bootstrap, topology.input_topic, backlog),
                produce(kafka_bootstrap, topology.input_topic, calm, rate=50),
            )
            return _sent_ms("backlog", backlog_acks) | _sent_ms("calm", calm_acks)

        sent_ms = asyncio.run(send_both())
        outputs = collect_outputs(kafka_bootstrap, topology, done=lambda rs: len(rs) >= 4100, timeout=120)
        assert process.terminate() == 0
    latencies = [
        float(r.timestamp - sent_ms[cid])
        for r in outputs.on(topology.result_topic)
        if (cid := header(r, "correlation-id") or "").startswith("calm-")
    ]
    answered = Counter(header(r, "correlation-id") for r in outputs.records)
    assert max(answered.values()) == 1 and outputs.on(topology.dead_letter_topic) == []  # once, all results
    return latencies, len(answered)


def test_fair_batches_answer_every_request_once_under_a_backlog_and_what_they_change(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """``fair_share`` under a backlog of 4,000 requests waiting in the batcher: every request
    of both tenants answered exactly once, in both modes. The figures show what fair batches
    do to the calm tenant's latency: nothing good while its records share partitions with
    the backlog, since a result leaves only after the earlier records of its partition
    (measured 2026-11-24, two runs: fair p50 2,878-3,044 ms, p99 4,346-4,441 ms; arrival
    order p50 2,327-2,332 ms, p99 3,020-3,111 ms: picking over 4,000 waiting requests costs
    CPU per call)."""
    fair, fair_outcomes = _calm_latencies(kafka_bootstrap, cli_env, tmp_path, fair=True)
    unfair, unfair_outcomes = _calm_latencies(kafka_bootstrap, cli_env, tmp_path, fair=False)
    assert fair_outcomes == unfair_outcomes == 4100 and len(fair) == len(unfair) == 100
    figures = {
        name: (_percentile(values, 50), _percentile(values, 99), max(values))
        for name, values in (("fair", fair), ("arrival order", unfair))
    }
    report(
        FaultFigures(
            scenario="fair share: backlog of 4,000 rows of one tenant, 8-row calls, one in flight",
            topology="dense",
            sent=2 * 4100,
            results=fair_outcomes + unfair_outcomes,
            duplicates=0,
            exact_duplicates=True,
            dead_letters=0,
            lost=0,
            note="; ".join(
                f"calm tenant, {name}: p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {worst:.0f} ms"
                for name, (p50, p99, worst) in figures.items()
            ),
        )
    )
