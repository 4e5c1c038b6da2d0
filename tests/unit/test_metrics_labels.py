"""Every exposed series carries the topology; the health/metrics port is stable unless asked.

The scrape itself is tested against a real Prometheus in
``tests/integration/test_prometheus_scrape.py``; these are the rules in isolation.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.deploy.options import DeployOptions
from pipeline.observability.metrics import PipelineMetrics
from pipeline.runtime.health import DEFAULT_PORT
from pipeline.runtime.runner import health_port
from pipeline.topology.loader import load_topology
from tests.helpers.topology_process import write_topology


def _exposed(metrics: PipelineMetrics) -> list[dict[str, str]]:
    text = generate_latest(metrics.registry).decode()
    return [sample.labels for family in text_string_to_metric_families(text) for sample in family.samples]


def test_every_series_carries_the_topology_process_collectors_included() -> None:
    metrics = PipelineMetrics(topology="orders")
    metrics.requests.labels("classify").inc()
    metrics.dead_letters.labels("classify", "bad-header").inc()
    exposed = _exposed(metrics)
    assert {labels.get("topology") for labels in exposed} == {"orders"}
    names = {family.name for family in metrics.registry.collect()}
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds", "python_info"} <= names
    assert {"pipeline_consumer_group_lag", "pipeline_inflight_bytes", "pipeline_stage_ready"} <= names


def test_the_snapshot_keeps_working_and_an_empty_topology_adds_no_label() -> None:
    metrics = PipelineMetrics()
    metrics.requests.labels("classify").inc(3)
    samples = metrics.snapshot()["pipeline_requests"]
    assert samples == [{"name": "pipeline_requests_total", "labels": {"stage": "classify"}, "value": 3.0}]
    assert all("topology" not in labels for labels in _exposed(metrics))


def test_the_port_is_stable_unless_asked(tmp_path: Path) -> None:
    assert DEFAULT_PORT == 9400
    unset = load_topology(write_topology(tmp_path).path)
    free = load_topology(write_topology(tmp_path, extra={"http_port": 0}).path)
    assert health_port(unset) == DEFAULT_PORT
    assert health_port(free) == 0, "0 in the topology: any free port"
    assert health_port(unset, 9500) == 9500 and health_port(free, 9500) == 9500, "--http-port wins"
    assert health_port(unset, 0) == 0
    assert DeployOptions().http_port == DEFAULT_PORT, "Kubernetes probes and the metrics Service name the same port"
