"""TopologyCaller's wiring into a Faust app, with real faust objects and no broker.

What needs Kafka and Triton (calls, results, lifecycle in a worker) is in
tests/integration/test_faust_client.py.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import faust
import numpy as np
import pytest

from pipeline.client import ClientClosed
from pipeline.client.faust import TopologyCaller, app_kafka_settings
from pipeline.errors import ConfigError

DENSE = Path(__file__).resolve().parents[2] / "topologies" / "dense.yaml"


def _app(**conf: Any) -> faust.App:
    return faust.App(f"unit-{uuid.uuid4().hex[:6]}", web_enabled=False, **conf)


def test_the_apps_brokers_become_the_bootstrap_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPELINE_KAFKA_SECURITY_PROTOCOL", raising=False)
    settings = app_kafka_settings(_app(broker="kafka://h1:9093;kafka://h2"))
    assert settings.bootstrap_servers == "h1:9093,h2:9092"
    assert settings.security_protocol == "PLAINTEXT"


def test_an_app_with_broker_credentials_needs_the_callers_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPELINE_KAFKA_SECURITY_PROTOCOL", raising=False)
    app = _app(broker="kafka://h1:9093", broker_credentials=faust.SASLCredentials(username="u", password="p"))
    with pytest.raises(ConfigError, match="does not copy"):
        app_kafka_settings(app)
    monkeypatch.setenv("PIPELINE_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    assert app_kafka_settings(app).security_protocol == "SASL_SSL"


def test_the_caller_joins_the_app_and_checks_its_options_at_import() -> None:
    app = _app(broker="kafka://h1:9093")
    caller = TopologyCaller(app, DENSE, timeout=5.0)
    assert caller in app._children  # started before the agents the worker adds at start, stopped after
    assert caller.topology.name == "dense-demo"
    with pytest.raises(TypeError):
        TopologyCaller(app, DENSE, timout=5.0)  # a misspelt option fails where it is written


def test_a_call_before_the_app_started_raises_client_closed() -> None:
    caller = TopologyCaller(_app(broker="kafka://h1:9093"), DENSE)
    with pytest.raises(ClientClosed, match="starts with its Faust app"):
        asyncio.run(caller.infer({"features": np.zeros((1, 16), np.float32)}))
