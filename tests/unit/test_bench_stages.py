"""``pipeline bench``'s stage numbers: per step, the difference of each process's snapshots inside it.

Snapshots come from the real :class:`PipelineMetrics` as workers publish them (no
Kafka), so the bench and ``pipeline top`` read the same series the same way.
"""

from __future__ import annotations

import json

import pytest

from pipeline.observability.metrics import PipelineMetrics
from pipeline.tools.bench.stages import SnapshotLog
from pipeline.tools.top.snapshot import Snapshot, parse_snapshot


def _snap(metrics: PipelineMetrics, process: str, at_s: float, start_s: float = 1_000.0, topology: str = "t") -> Snapshot:
    data = metrics.snapshot()
    data["process_start_time_seconds"] = [
        {"name": "process_start_time_seconds", "labels": {"topology": topology}, "value": start_s}
    ]
    payload = {"topology": topology, "process": process, "timestamp_ms": int(at_s * 1000), "metrics": data}
    snapshot = parse_snapshot(json.dumps(payload).encode())
    assert snapshot is not None
    return snapshot


def _load(m: PipelineMetrics, requests: int, batch: int, triton_s: float, latency_s: float) -> None:
    m.requests.labels("classify").inc(requests)
    m.results.labels("classify").inc(requests)
    for _ in range(requests // batch):
        m.batch_size.labels("classify").observe(batch)
        m.triton_latency.labels("classify", "dense").observe(triton_s)
    for _ in range(requests):
        m.end_to_end.labels("classify").observe(latency_s)


def test_a_step_counts_only_what_happened_between_its_first_and_last_snapshot_inside_it() -> None:
    m = PipelineMetrics("t")
    log = SnapshotLog("t", metrics_interval_s=1.0)
    _load(m, 500, batch=1, triton_s=0.5, latency_s=2.0)  # warm-up: before the step
    log.add(_snap(m, "h:1", 1_009.5))  # before the step: not its start
    _load(m, 40, batch=1, triton_s=0.5, latency_s=2.0)
    log.add(_snap(m, "h:1", 1_010.2))  # the step's first snapshot
    _load(m, 100, batch=4, triton_s=0.002, latency_s=0.004)
    log.add(_snap(m, "h:1", 1_011.2))
    _load(m, 100, batch=4, triton_s=0.004, latency_s=0.004)
    m.dead_letters.labels("classify", "bad-request").inc(2)
    log.add(_snap(m, "h:1", 1_012.2))  # the step's last snapshot
    _load(m, 999, batch=1, triton_s=1.0, latency_s=9.0)
    log.add(_snap(m, "h:1", 1_013.2))  # after the step (the next one's load)

    stages = log.step(1_010_000, 1_012_900)
    assert stages.note is None
    (row,) = stages.rows
    assert row.stage == "classify" and row.processes == 1
    assert row.delta.requests == 200 and row.window_s == pytest.approx(2.0)
    assert row.rate == pytest.approx(100.0)
    assert row.mean_batch == pytest.approx(4.0)
    assert row.triton_ms == pytest.approx(3.0)
    assert row.p50_s is not None and 0.0025 < row.p50_s <= 0.005
    assert row.p99_s is not None and row.p99_s <= 0.005
    assert row.delta.dead_letters == {"bad-request": 2}
    (as_json,) = stages.to_dict() or []
    assert as_json["requests"] == 200 and as_json["dead_letters"] == 2
    assert as_json["mean_batch"] == 4.0 and as_json["triton_call_ms"] == 3.0
    assert as_json["latency_ms"]["p99"] <= 5.0


def test_processes_are_merged_and_other_topologies_and_junk_ignored() -> None:
    a, b, other = PipelineMetrics("t"), PipelineMetrics("t"), PipelineMetrics("u")
    log = SnapshotLog("t", metrics_interval_s=1.0)
    for m, process in ((a, "a:1"), (b, "b:2")):
        log.add(_snap(m, process, 1_010.1))
    log.add(_snap(other, "c:3", 1_010.1, topology="u"))
    log.add(None)
    _load(a, 30, batch=2, triton_s=0.001, latency_s=0.01)
    _load(b, 10, batch=2, triton_s=0.003, latency_s=0.01)
    _load(other, 1_000, batch=1, triton_s=1.0, latency_s=1.0)
    for m, process in ((a, "a:1"), (b, "b:2")):
        log.add(_snap(m, process, 1_012.1))
    log.add(_snap(other, "c:3", 1_012.1, topology="u"))

    (row,) = log.step(1_010_000, 1_012_500).rows
    assert row.processes == 2 and row.delta.requests == 40
    assert row.rate == pytest.approx(20.0)
    assert row.triton_ms == pytest.approx((15 * 1 + 5 * 3) / 20)
    assert log.skipped == 1


def test_a_step_shorter_than_two_intervals_is_not_available() -> None:
    m = PipelineMetrics("t")
    log = SnapshotLog("t", metrics_interval_s=5.0)
    log.add(_snap(m, "h:1", 1_010.0))
    _load(m, 10, batch=1, triton_s=0.001, latency_s=0.01)
    log.add(_snap(m, "h:1", 1_015.0))
    stages = log.step(1_010_000, 1_019_000)  # 9 s < 2 x 5 s
    assert stages.rows == () and stages.to_dict() is None
    assert stages.note == "n/a: step shorter than 2 metrics intervals (2 x 5 s)"


def test_no_two_snapshots_or_a_restart_inside_the_step_is_not_available() -> None:
    m = PipelineMetrics("t")
    log = SnapshotLog("t", metrics_interval_s=1.0)
    log.add(_snap(m, "h:1", 1_010.5))
    assert log.step(1_010_000, 1_013_000).note == "n/a: no process has two snapshots of one run inside the step"
    _load(m, 10, batch=1, triton_s=0.001, latency_s=0.01)
    log.add(_snap(PipelineMetrics("t"), "h:1", 1_012.5, start_s=1_012.0))  # same key, restarted: counters reset
    assert log.step(1_010_000, 1_013_000).note == "n/a: no process has two snapshots of one run inside the step"
