"""Observability that imports anywhere: the dashboard picks its datasource, ``OTEL_PROPAGATORS``
is honoured, JSON log lines carry the current span's ids.

Why: a dashboard bound to a datasource uid only this repository's Grafana has
shows "datasource not found" everywhere else; a hard-coded W3C propagator breaks
traces in a B3 mesh; logs without trace ids cannot be joined to traces.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from pipeline.observability.logging import LogSettings, configure_logging

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / "pipeline.json"


def _datasources(node: Any) -> list[Any]:
    found = []
    if isinstance(node, dict):
        if "datasource" in node and node.get("type") != "datasource":
            found.append(node["datasource"])
        for value in node.values():
            found += _datasources(value)
    elif isinstance(node, list):
        for value in node:
            found += _datasources(value)
    return found


def test_dashboard_has_no_hard_coded_datasource_uid() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert [i["pluginId"] for i in dashboard["__inputs"]] == ["prometheus"]
    uses = _datasources(dashboard)
    assert uses, "no panel names a datasource"
    for use in uses:
        uid = use.get("uid") if isinstance(use, dict) else use
        assert uid in ("${datasource}", "$datasource"), f"hard-coded datasource {use!r}"


def test_every_panel_has_one_unit() -> None:
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        config = panel["fieldConfig"]
        units = {config["defaults"]["unit"]}
        for override in config.get("overrides", []):
            units |= {p["value"] for p in override["properties"] if p["id"] == "unit"}
        assert len(units) == 1, (panel["title"], units)


def _inject(propagators: str | None) -> dict[str, str]:
    """The headers our propagator writes for a sampled span with baggage, in a fresh process
    (OpenTelemetry reads OTEL_PROPAGATORS when first imported)."""
    code = (
        "import json\n"
        "from opentelemetry import baggage, trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from pipeline.observability.tracing import PROPAGATOR\n"
        "span = TracerProvider().get_tracer('t').start_span('s')\n"
        "ctx = baggage.set_baggage('tenant', 'a', context=trace.set_span_in_context(span))\n"
        "carrier = {}\n"
        "PROPAGATOR.inject(carrier, context=ctx)\n"
        "print(json.dumps(carrier))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OTEL_PROPAGATORS"}
    if propagators is not None:
        env["OTEL_PROPAGATORS"] = propagators
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    return dict(json.loads(done.stdout))


def test_otel_propagators_is_honoured() -> None:
    assert set(_inject(None)) == {"traceparent", "baggage"}  # the default: tracecontext,baggage
    assert set(_inject("tracecontext,baggage")) == {"traceparent", "baggage"}
    assert set(_inject("baggage")) == {"baggage"}
    assert set(_inject("tracecontext")) == {"traceparent"}


def test_messaging_attribute_names_are_not_from_the_private_module() -> None:
    source = (Path(__file__).resolve().parents[2] / "pipeline" / "observability" / "record_trace.py").read_text()
    assert "_incubating" not in source


def test_json_log_line_inside_a_span_carries_its_ids() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging(LogSettings("info", "json"), stream=stream)
        log = logging.getLogger("pipeline.test")
        tracer = TracerProvider().get_tracer("test")
        with tracer.start_as_current_span("work") as span:
            log.info("inside")
        log.info("outside")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    context = span.get_span_context()
    assert inside["message"] == "inside"
    assert inside["trace_id"] == f"{context.trace_id:032x}" and inside["span_id"] == f"{context.span_id:016x}"
    assert "trace_id" not in outside and "span_id" not in outside
