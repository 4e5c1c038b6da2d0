"""`pipeline run`'s metadata requests never ask the broker to create a topic (pipeline/kafka/explicit_topics.py)."""

from __future__ import annotations

import aiokafka.client
import pytest
from aiokafka.protocol.metadata import MetadataRequest, MetadataRequest_v4, MetadataRequest_v5

from pipeline.kafka import explicit_topics


def test_aiokafka_allows_creation_and_the_installed_request_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiokafka.client, "MetadataRequest", MetadataRequest)
    assert MetadataRequest(["reply"]).build(MetadataRequest_v5).allow_auto_topic_creation is True
    assert not explicit_topics.installed()
    explicit_topics.install()
    assert explicit_topics.installed()
    for version in (MetadataRequest_v4, MetadataRequest_v5):
        built = aiokafka.client.MetadataRequest(["reply"]).build(version)
        assert (built.topics, built.allow_auto_topic_creation) == (["reply"], False)
    # A caller that asks for creation explicitly still can.
    assert aiokafka.client.MetadataRequest(["t"], True).build(MetadataRequest_v5).allow_auto_topic_creation is True
