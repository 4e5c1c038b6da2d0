"""``pipeline bench`` against a running private copy of the dense topology, on the real stack.

The tool is run as a user runs it (``python -m pipeline bench``) while a real
``pipeline run`` serves the topology; its table, JSON and PNG are checked, and
every result it counted as verified is one the pipeline really answered.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.cli import assert_one_line_error, ok, run_cli
from tests.helpers.topology_process import PipelineProcess, TopologyFiles, pipeline_process, write_topology

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def running_dense(
    tmp_path_factory: pytest.TempPathFactory, cli_env: dict[str, str]
) -> Iterator[tuple[TopologyFiles, PipelineProcess]]:
    """A private dense topology (dense_classifier, 4 partitions) with its `pipeline run` up."""
    folder = tmp_path_factory.mktemp("bench")
    topology = write_topology(folder)
    with pipeline_process(topology, cli_env, folder) as process:
        yield topology, process


def _check_step(step: dict[str, Any], *, direct: bool) -> None:
    measured = step["pipeline"]
    assert measured["requests"] > 0
    assert measured["verified"] == measured["requests"], measured
    assert measured["errors"] == 0 and measured["first_error"] is None, measured
    assert measured["throughput"] > 0
    latency = measured["latency_ms"]
    assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"], latency
    if direct:
        baseline = step["direct_triton"]
        assert baseline is not None
        assert baseline["verified"] == baseline["requests"] > 0, baseline
        assert baseline["throughput"] > 0
        assert 0 < baseline["latency_ms"]["p50"] <= baseline["latency_ms"]["p99"]
    else:
        assert step["direct_triton"] is None


def _check_stages(step: dict[str, Any]) -> None:
    """The stage saw this step's requests: some, never more than bench sent in it; real batches."""
    assert step["stages_note"] is None, step
    (stage,) = step["stages"]  # the dense topology has one stage
    assert stage["stage"] == "classify" and stage["processes"] >= 1, stage
    assert 0 < stage["requests"] <= step["pipeline"]["requests"], (stage, step["pipeline"])
    assert stage["window_s"] > 0 and stage["requests_per_s"] > 0, stage
    assert stage["mean_batch"] >= 1, stage
    assert stage["triton_call_ms"] > 0, stage
    assert 0 < stage["latency_ms"]["p50"] <= stage["latency_ms"]["p99"], stage
    assert stage["dead_letters"] == 0, stage


def test_concurrency_sweep_prints_table_and_writes_json_and_png(
    running_dense: tuple[TopologyFiles, PipelineProcess], cli_env: dict[str, str], tmp_path: Path
) -> None:
    topology, process = running_dense
    results_before = process.metric("pipeline_results_total")
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = ok(
        run_cli(
            cli_env,
            "bench", str(topology.path),
            "--concurrency", "1,4",
            "--duration", "3",
            "--warmup", "1",
            "--json", str(out_json),
            "--plot", str(out_png),
            timeout=240,
        )
    )
    table = result.stdout
    for column in ("step", "sent", "verified", "errors", "results/s", "p50 ms", "p90 ms", "p99 ms", "direct/s"):
        assert column in table, table
    for column in ("stages during each step", "stage", "batch", "triton ms", "dead letters"):
        assert column in table, table
    rows = [line for line in table.splitlines() if "c=1" in line or "c=4" in line]
    assert len(rows) == 4, table  # one in the sweep table, one per stage in the stages' table
    assert all(len(line) <= 200 for line in table.splitlines()), table
    assert "step 2/2 c=4: direct Triton" in result.stderr  # progress, one line per phase off a terminal

    data = json.loads(out_json.read_text())
    assert data["topology"] == topology.name and data["model"] == "dense_classifier"
    assert data["plan"]["mode"] == "concurrency" and data["plan"]["levels"] == [1, 4]
    assert [step["step"] for step in data["steps"]] == ["c=1", "c=4"]
    assert data["errors"] == 0 and data["interrupted"] is False
    assert data["metrics_interval_s"] == 1 and data["stages_unavailable"] is None
    for step in data["steps"]:
        _check_step(step, direct=True)
        _check_stages(step)  # 3 s steps, a snapshot every 1 s: numbers, not n/a
    # The closed loop keeps 4 requests in flight at c=4: more results per second than one at a time.
    assert data["steps"][1]["pipeline"]["throughput"] > data["steps"][0]["pipeline"]["throughput"]
    # What bench counted as answered, the stage counted as results (warm-up included).
    counted = sum(step["pipeline"]["verified"] for step in data["steps"])
    assert process.metric("pipeline_results_total") - results_before >= counted

    png = out_png.read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 10_000


def test_rate_sweep_without_direct_calls(
    running_dense: tuple[TopologyFiles, PipelineProcess], cli_env: dict[str, str], tmp_path: Path
) -> None:
    topology, _ = running_dense
    out_json = tmp_path / "rate.json"
    args = ["--rate", "50,200", "--duration", "2", "--warmup", "0", "--no-direct", "--json", str(out_json)]
    result = ok(run_cli(cli_env, "bench", str(topology.path), *args, timeout=180))
    assert "50/s" in result.stdout and "200/s" in result.stdout
    assert "direct/s" not in result.stdout
    data = json.loads(out_json.read_text())
    for step, rate in zip(data["steps"], (50, 200), strict=True):
        _check_step(step, direct=False)
        # The open loop holds its schedule: about rate x duration requests, sent at about the rate.
        # (Never more; a little fewer when this busy 2-core machine stalls the client.)
        assert rate * 2 * 0.85 <= step["pipeline"]["requests"] <= rate * 2 + 1, step
        assert step["pipeline"]["send_rate"] == pytest.approx(rate, rel=0.15)


def test_step_shorter_than_two_metrics_intervals_and_unreadable_metrics_topic(
    running_dense: tuple[TopologyFiles, PipelineProcess], cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Stage numbers are extra: without them bench still measures, and says why in one line."""
    topology, _ = running_dense
    args = ["--concurrency", "2", "--duration", "1.5", "--warmup", "0", "--no-direct"]
    out_json = tmp_path / "short.json"
    result = ok(run_cli(cli_env, "bench", str(topology.path), *args, "--json", str(out_json), timeout=120))
    assert "n/a: step shorter than 2 metrics intervals (2 x 1 s)" in result.stdout, result.stdout
    (step,) = json.loads(out_json.read_text())["steps"]
    _check_step(step, direct=False)
    assert step["stages"] is None and step["stages_note"].startswith("n/a: step shorter"), step

    # The same running topology, its metrics said to be on a topic nobody publishes to.
    doc = yaml.safe_load(topology.path.read_text())
    doc["metrics_topic"] = f"{topology.name}.no-such-metrics"
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(yaml.safe_dump(doc, sort_keys=False))
    out_json = tmp_path / "unreadable.json"
    result = ok(run_cli(cli_env, "bench", str(elsewhere), *args, "--json", str(out_json), timeout=120))
    unavailable = [line for line in result.stdout.splitlines() if "stage numbers unavailable" in line]
    assert unavailable == [f"stage numbers unavailable: metrics topic {doc['metrics_topic']} does not exist: "
                           "has the topology run yet?"], result.stdout
    data = json.loads(out_json.read_text())
    assert data["stages_unavailable"].startswith("metrics topic") and data["errors"] == 0
    _check_step(data["steps"][0], direct=False)
    assert data["steps"][0]["stages"] is None


def test_topology_not_running_is_one_line(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Nobody consumes the input topic: the warm-up gets no answer and says so in one line."""
    topology = write_topology(tmp_path)
    args = ["--concurrency", "2", "--duration", "1", "--warmup", "1", "--timeout", "1", "--no-direct"]
    result = run_cli(cli_env, "bench", str(topology.path), *args, timeout=120)
    # stderr: the progress lines, then the error in one line (no traceback).
    *progress, last = result.stderr.strip().splitlines()
    assert progress and all(not line.startswith("error:") for line in progress), result.stderr
    error_only = subprocess.CompletedProcess(result.args, result.returncode, result.stdout, last)
    assert_one_line_error(error_only, "is the topology running")
    assert "no answer within 1 s" in last
