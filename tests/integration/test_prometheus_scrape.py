"""A real Prometheus scrapes a running topology and Triton; the series and the dashboard read back.

One module-wide run serves both tests: `pipeline run` on a private topology, the
session's Triton, and a Prometheus server (Debian package) scraping both every
second with ``deploy/prometheus/alerts.yaml`` loaded. Traffic: good requests
(batches, latencies, Triton's queue and compute times) and a few bad ones (so a
dead-letter series exists).

- The scrape test reads the series an operator uses back through Prometheus's
  HTTP API: the ``topology`` label on every series, lag per partition and per
  group, process collectors, pending and in-flight bytes, readiness, the oldest
  unfinished record, Triton's own ``nv_inference_*``.
- The dashboard test runs every panel query of ``deploy/grafana/dashboards/pipeline.json``
  against that Prometheus (no Grafana server installs here) and requires data from each.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pipeline.contract.records import Record
from pipeline.contract.request import encode_request
from pipeline.settings import TritonSettings
from tests.helpers.dense_reference import random_features
from tests.helpers.kafka_io import produce
from tests.helpers.prometheus_server import PrometheusServer, Series, prometheus_server, values
from tests.helpers.topology_process import (
    TopologyFiles,
    collect_outputs,
    pipeline_process,
    write_topology,
)

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "pipeline.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yaml"
GOOD, BAD = 400, 3
_TRITON_SERIES = 'nv_inference_request_success{job="triton", model="dense_classifier"}'
RATE_INTERVAL = "5m"  # $__rate_interval: longer than the whole run, so every rate sees the traffic


@dataclass
class Scraped:
    topology: TopologyFiles
    prometheus: PrometheusServer


def _target(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc


def _traffic() -> tuple[list[Record], list[Record]]:
    """Two waves: the first creates every series (a few good requests and the bad ones), the
    second moves them after Prometheus has seen them, so that every ``rate()`` has an increase
    (Prometheus does not count a series' first sample as one)."""
    features = random_features(GOOD, 11)
    good = [encode_request({"features": features[i : i + 1]}, correlation_id=f"ok-{i}") for i in range(GOOD)]
    json_headers = [("content-type", b"application/json")]
    bad = [
        Record(key=f"bad-{i}".encode(), value=b"{not json", headers=[*json_headers, ("correlation-id", f"bad-{i}".encode())])
        for i in range(BAD)
    ]
    return [*good[:20], *bad], good[20:]


@pytest.fixture(scope="module")
def scraped(
    kafka_bootstrap: str,
    cli_env: dict[str, str],
    triton_settings: TritonSettings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Scraped]:
    folder = tmp_path_factory.mktemp("prometheus-scrape")
    assert triton_settings.metrics_url, "Triton's metrics URL is unknown: set PIPELINE_TRITON_METRICS_URL"
    topology = write_topology(folder, partitions=4, stage={"batching": {"max_queue_delay_ms": 20.0, "max_batch_size": 16}})
    with pipeline_process(topology, cli_env, folder) as worker:
        jobs = {"pipeline": [f"127.0.0.1:{worker.http_port}"], "triton": [_target(triton_settings.metrics_url)]}
        with prometheus_server(folder / "prometheus", jobs, rule_files=[ALERTS]) as prometheus:
            first, second = _traffic()
            asyncio.run(produce(kafka_bootstrap, topology.input_topic, first))
            collect_outputs(kafka_bootstrap, topology, lambda records: len(records) >= len(first), timeout=60)
            for created in (f'pipeline_batch_size_count{{topology="{topology.name}"}}', _TRITON_SERIES):
                prometheus.wait_for(created)
            time.sleep(2)  # two more scrapes of the first wave's values
            asyncio.run(produce(kafka_bootstrap, topology.input_topic, second))
            collect_outputs(kafka_bootstrap, topology, lambda records: len(records) >= GOOD + BAD, timeout=60)
            results = f'pipeline_results_total{{topology="{topology.name}"}}'
            scraped_all = prometheus.wait_for(results, until=lambda r: values(r) == [GOOD])
            assert values(scraped_all) == [GOOD], f"{scraped_all}\n{worker.log()}"
            yield Scraped(topology, prometheus)


def _one(prometheus: PrometheusServer, expr: str) -> float:
    result = prometheus.wait_for(expr, timeout=10)
    assert len(result) == 1, f"{expr}: {result}"
    return values(result)[0]


def test_prometheus_scrapes_the_series_an_operator_uses(scraped: Scraped) -> None:
    prometheus, name = scraped.prometheus, scraped.topology.name
    sel = f'topology="{name}", stage="classify"'
    assert _one(prometheus, f"pipeline_requests_total{{{sel}}}") == GOOD + BAD
    assert _one(prometheus, f'sum(pipeline_dead_letters_total{{{sel}, error_class="malformed-request"}})') == BAD
    assert _one(prometheus, f"pipeline_batch_size_count{{{sel}}}") < GOOD, "requests were batched"

    # Every series the worker exposes carries the topology (Prometheus's own up/scrape_* aside).
    unlabelled = prometheus.query('{job="pipeline", topology="", __name__!~"up|scrape_.*"}')
    assert unlabelled == [], [s["metric"] for s in unlabelled[:5]]

    # Lag: one series per input partition, and the group's sum (all consumed: 0).
    lag = prometheus.wait_for(f"pipeline_consumer_lag{{{sel}}}", until=lambda r: len(r) == 4)
    assert sorted(s["metric"]["partition"] for s in lag) == ["0", "1", "2", "3"]
    assert {s["metric"]["topic"] for s in lag} == {scraped.topology.input_topic}
    assert _one(prometheus, f'pipeline_consumer_group_lag{{{sel}, group="{name}.classify"}}') == 0

    # Process collectors, bytes held, readiness and the watchdog's age.
    assert _one(prometheus, f'process_resident_memory_bytes{{topology="{name}"}}') > 10 * 2**20
    assert _one(prometheus, f'process_open_fds{{topology="{name}"}}') > 0
    assert _one(prometheus, f'process_cpu_seconds_total{{topology="{name}"}}') > 0
    # Bytes held are a gauge the consume loop sets once per turn: the last acknowledgements can
    # land after the sample Prometheus scraped last (ci33 read 32,120 once), so wait for a
    # scrape after them. A leak would never reach 0.
    for held in ("pending", "inflight"):
        series = prometheus.wait_for(f"pipeline_{held}_bytes{{{sel}}}", until=lambda r: values(r) == [0.0])
        assert values(series) == [0.0], held
    assert _one(prometheus, f"pipeline_stage_ready{{{sel}}}") == 1
    ages = prometheus.wait_for(f"pipeline_oldest_unfinished_record_age_seconds{{{sel}}}", until=lambda r: len(r) == 4)
    assert values(ages) == [0.0] * 4, "nothing left unfinished"

    # Triton's own series, from its metrics port.
    assert _one(prometheus, f"sum({_TRITON_SERIES})") > 0
    assert _one(prometheus, 'sum(nv_inference_compute_infer_duration_us{job="triton", model="dense_classifier"})') > 0

    # The alert rules load into the real server, and none fires on a healthy run.
    rules = [rule for group in prometheus.api("/api/v1/rules")["groups"] for rule in group["rules"]]
    written = sum(len(group["rules"]) for group in yaml.safe_load(ALERTS.read_text())["groups"])
    assert len(rules) == written == 8 and {rule["health"] for rule in rules} == {"ok"}, rules
    firing = [a["labels"]["alertname"] for a in prometheus.api("/api/v1/alerts")["alerts"] if a["state"] == "firing"]
    assert firing == []


def _panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def _finite(result: Series) -> bool:
    return any(math.isfinite(v) for v in values(result))


def test_every_dashboard_panel_returns_data(scraped: Scraped) -> None:
    queries = _panel_queries()
    assert len(queries) >= 14
    empty = []
    for title, expr in queries:
        concrete = expr.replace("$topology", scraped.topology.name).replace("$__rate_interval", RATE_INTERVAL)
        assert "$" not in concrete, f"{title}: unknown dashboard variable in {expr}"
        if not _finite(scraped.prometheus.wait_for(concrete, timeout=10, until=_finite)):
            empty.append(f"{title}: {expr}")
    assert empty == [], "panels without data:\n" + "\n".join(empty)
