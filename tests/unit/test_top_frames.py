"""`pipeline top`'s arithmetic, on snapshots made by the real PipelineMetrics (no Kafka).

Snapshots come from :meth:`PipelineMetrics.snapshot` exactly as workers publish
them, so a renamed series or a changed sample shape breaks these tests, not the view.
"""

from __future__ import annotations

import json
import math

import pytest

from pipeline.observability.metrics import PipelineMetrics
from pipeline.tools.top.book import SnapshotBook, StageRow
from pipeline.tools.top.histogram import Buckets, quantile
from pipeline.tools.top.snapshot import Snapshot, parse_snapshot
from pipeline.tools.top.view import header_line, plain_lines

START_S = 1_000.0


def _record(metrics: PipelineMetrics, process: str, at_s: float, topology: str = "t") -> bytes:
    """A metrics-topic value, as publish_snapshots writes it, with the process start pinned."""
    data = metrics.snapshot()
    data["process_start_time_seconds"] = [
        {"name": "process_start_time_seconds", "labels": {"topology": topology}, "value": START_S}
    ]
    payload = {"topology": topology, "process": process, "timestamp_ms": int(at_s * 1000), "metrics": data}
    return json.dumps(payload).encode()


def _snap(metrics: PipelineMetrics, process: str, at_s: float, topology: str = "t") -> Snapshot:
    snapshot = parse_snapshot(_record(metrics, process, at_s, topology))
    assert snapshot is not None
    return snapshot


def _only_row(book: SnapshotBook, now_s: float) -> StageRow:
    frame = book.frame(int(now_s * 1000))
    assert len(frame.rows) == 1, frame.rows
    return frame.rows[0]


def test_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    # 10 observations <= 0.01, 10 more in (0.01, 0.05], none above.
    buckets = Buckets({0.01: 10, 0.05: 20, 0.1: 20, math.inf: 20})
    assert quantile(0.5, buckets) == pytest.approx(0.01)
    assert quantile(0.75, buckets) == pytest.approx(0.03)  # halfway through (0.01, 0.05]
    assert quantile(0.25, buckets) == pytest.approx(0.005)  # first bucket starts at 0
    assert quantile(0.99, Buckets({0.1: 0, math.inf: 5})) == pytest.approx(0.1)  # only +Inf: the largest bound
    assert quantile(0.5, Buckets({0.1: 0, math.inf: 0})) is None
    assert quantile(0.5, Buckets()) is None


def test_buckets_add_and_subtract_bound_by_bound() -> None:
    a = Buckets({0.1: 2, math.inf: 3})
    b = Buckets({0.1: 5, math.inf: 9})
    assert (a + b).counts == {0.1: 7, math.inf: 12}
    assert b.minus(a).counts == {0.1: 3, math.inf: 6}


def test_rate_percentiles_batch_and_triton_come_from_the_window_between_two_snapshots() -> None:
    m = PipelineMetrics("t")
    m.requests.labels("classify").inc(1_000)
    for _ in range(1_000):
        m.end_to_end.labels("classify").observe(0.5)  # old and slow: before the window
    book = SnapshotBook("t", metrics_interval_s=1.0)
    book.add(_snap(m, "h:1", 1_010.0))
    m.requests.labels("classify").inc(200)
    m.results.labels("classify").inc(150)
    for _ in range(200):
        m.end_to_end.labels("classify").observe(0.004)  # in (0.0025, 0.005]
    m.batch_size.labels("classify").observe(8)
    m.batch_size.labels("classify").observe(16)
    m.triton_latency.labels("classify", "dense").observe(0.002)
    m.triton_latency.labels("classify", "dense").observe(0.004)
    m.consumer_group_lag.labels("classify", "t.classify").set(42)
    m.pending_requests.labels("classify").set(7)
    m.dead_letters.labels("classify", "bad-request").inc(3)
    book.add(_snap(m, "h:1", 1_012.0))

    row = _only_row(book, 1_012.5)
    assert row.stage == "classify" and row.processes == 1
    assert row.rate == pytest.approx(100.0)  # 200 requests in 2 s
    assert row.totals.requests == 1_200 and row.totals.results == 150
    assert row.totals.lag == 42 and row.totals.pending == 7
    assert row.totals.dead_letters == {"bad-request": 3}
    assert row.p50_s is not None and 0.0025 < row.p50_s <= 0.005  # the old 0.5 s ones are not in the window
    assert row.p99_s is not None and row.p99_s <= 0.005
    assert row.mean_batch == pytest.approx(12.0)
    assert row.triton_ms == pytest.approx(3.0)


def test_processes_of_one_stage_are_summed_and_their_buckets_merged() -> None:
    book = SnapshotBook("t", metrics_interval_s=1.0)
    fast, slow = PipelineMetrics("t"), PipelineMetrics("t")
    book.add(_snap(fast, "a:1", 1_010.0))
    book.add(_snap(slow, "b:2", 1_010.5))
    fast.requests.labels("classify").inc(300)
    slow.requests.labels("classify").inc(50)
    for _ in range(98):
        fast.end_to_end.labels("classify").observe(0.002)
    for _ in range(2):
        slow.end_to_end.labels("classify").observe(2.0)
    fast.consumer_group_lag.labels("classify", "t.classify").set(10)
    slow.consumer_group_lag.labels("classify", "t.classify").set(5)
    book.add(_snap(fast, "a:1", 1_011.0))  # 300 in 1 s
    book.add(_snap(slow, "b:2", 1_011.5))  # 50 in 1 s

    row = _only_row(book, 1_012.0)
    assert row.processes == 2
    assert row.rate == pytest.approx(350.0)
    assert row.totals.requests == 350 and row.totals.lag == 15
    assert row.p50_s is not None and row.p50_s <= 0.0025
    assert row.p99_s is not None and 1.0 < row.p99_s <= 2.5  # the slow process's tail is in the merge


def test_a_process_seen_once_has_its_window_from_its_start() -> None:
    m = PipelineMetrics("t")
    m.requests.labels("classify").inc(500)
    book = SnapshotBook("t", metrics_interval_s=1.0)
    book.add(_snap(m, "h:1", START_S + 10))
    assert _only_row(book, START_S + 10).rate == pytest.approx(50.0)


def test_counters_going_back_mean_a_restart_under_the_same_key() -> None:
    before, after = PipelineMetrics("t"), PipelineMetrics("t")
    before.requests.labels("classify").inc(10_000)
    after.requests.labels("classify").inc(40)
    book = SnapshotBook("t", metrics_interval_s=1.0)
    book.add(_snap(before, "pod:1", START_S + 100))
    book.add(_snap(after, "pod:1", START_S + 101))
    row = _only_row(book, START_S + 101)
    assert row.rate is not None and row.rate >= 0  # never a negative rate
    assert row.totals.requests == 40


def test_stale_processes_are_named_and_left_out_of_the_rows() -> None:
    live, gone = PipelineMetrics("t"), PipelineMetrics("t")
    live.requests.labels("classify").inc(5)
    gone.requests.labels("classify").inc(1_000)
    gone.consumer_group_lag.labels("classify", "t.classify").set(99)
    book = SnapshotBook("t", metrics_interval_s=2.0)
    book.add(_snap(gone, "old:7", 1_000.0))
    book.add(_snap(live, "new:8", 1_010.0))
    frame = book.frame(1_010_000 + 500)
    assert [p.process for p in frame.stale] == ["old:7"]  # 10.5 s > 3 x 2 s
    (row,) = frame.rows
    assert row.processes == 1 and row.totals.requests == 5 and row.totals.lag == 0
    header = header_line(frame)
    assert "processes 1 live, 1 stale: old:7 (10.5 s ago)" in header
    assert "newest snapshot 0.5 s ago" in header


def test_other_topologies_older_snapshots_and_junk_are_ignored() -> None:
    m = PipelineMetrics("t")
    book = SnapshotBook("t", metrics_interval_s=1.0)
    book.add(_snap(m, "h:1", 1_010.0))
    m.requests.labels("classify").inc(7)
    book.add(_snap(m, "h:1", 1_011.0))
    book.add(_snap(PipelineMetrics("other"), "h:1", 1_012.0, topology="other"))
    book.add(_snap(PipelineMetrics("t"), "h:1", 1_009.0))  # late, older: not a restart
    for junk in (b"", b"not json", b"[]", json.dumps({"topology": "t"}).encode()):
        book.add(parse_snapshot(junk))
    frame = book.frame(1_011_000)
    assert frame.skipped == 4
    (row,) = frame.rows
    assert row.totals.requests == 7 and row.rate == pytest.approx(7.0)
    assert "4 non-snapshot record(s) skipped" in header_line(frame)


def test_plain_frame_is_aligned_text_with_every_column() -> None:
    m = PipelineMetrics("t")
    book = SnapshotBook("t", metrics_interval_s=1.0)
    book.add(_snap(m, "h:1", 1_010.0))
    m.requests.labels("classify").inc(1_234)
    m.dead_letters.labels("classify", "bad-request").inc(2)
    book.add(_snap(m, "h:1", 1_011.0))
    lines = plain_lines(book.frame(1_011_000))
    assert lines[0].startswith("topology t  processes 1 live  newest snapshot 0.0 s ago")
    assert lines[1].split()[:4] == ["stage", "procs", "req/s", "requests"]
    assert lines[2].split()[:4] == ["classify", "1", "1,234.0", "1,234"]
    assert lines[2].endswith("2 (bad-request 2)")
    assert "\x1b[" not in "\n".join(lines)


def test_an_empty_book_says_so() -> None:
    frame = SnapshotBook("t", metrics_interval_s=1.0).frame(0)
    assert frame.rows == () and "no snapshot yet" in header_line(frame)
