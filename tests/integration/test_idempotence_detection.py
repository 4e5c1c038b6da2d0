"""Producers are idempotent wherever the broker serves InitProducerId, found out at start.

Tansu (``tansu_bootstrap``: the session's, or one of its own when the suite runs on Apache
Kafka) refuses it: the answer is no, said once in the log, and kept for
the process; the setting decides without asking. (Apache Kafka's yes is in
tests/integration/test_apache_kafka.py when its broker is installed.)
"""

from __future__ import annotations

import logging

import pytest

from pipeline.kafka import clients
from pipeline.settings import KafkaSettings

pytestmark = [pytest.mark.kafka]


async def test_the_embedded_broker_gets_plain_producers_and_the_log_says_so_once(
    tansu_bootstrap: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PIPELINE_KAFKA_IDEMPOTENCE", raising=False)
    monkeypatch.setattr(clients, "_IDEMPOTENCE", {})
    settings = KafkaSettings(bootstrap_servers=tansu_bootstrap)
    with caplog.at_level(logging.WARNING, logger="pipeline.kafka.clients"):
        assert await clients.detect_idempotence(settings) is False
        assert await clients.detect_idempotence(settings) is False  # asked once per process
    said = [r.getMessage() for r in caplog.records if "idempotent" in r.getMessage()]
    assert len(said) == 1 and f"Kafka at {tansu_bootstrap} does not serve idempotent producers" in said[0], said
    assert clients._idempotence(settings) is False  # what make_producer gives enable_idempotence
    monkeypatch.setenv("PIPELINE_KAFKA_IDEMPOTENCE", "true")  # the setting decides, without asking
    assert await clients.detect_idempotence(settings) is True
    assert clients._idempotence(settings) is True
