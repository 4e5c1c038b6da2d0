"""A worker never asks the broker to create a topic by naming it.

Apache Kafka creates a topic that a metadata request names when the request allows it and
the broker's ``auto.create.topics.enable`` is on, which is its default. aiokafka allows it in
every metadata request (``MetadataRequest`` v4+ with ``allow_auto_topic_creation`` left
unset means true) and has no setting to turn it off; the Java consumer's
``allow.auto.create.topics`` is that setting.

A worker must not rely on it, and must not do it:

- its own topics are created explicitly at start, with the topology's partition count,
  replication factor and limits (:func:`pipeline.kafka.clients.ensure_topics`), never as
  the broker's one-partition default;
- a reply topic belongs to its client, which deletes it on close. A result stage whose
  producer still lists the topic in its metadata would create it again with its next
  metadata request (a late result, or the periodic refresh), and the late results would
  land on a topic nobody reads instead of the result topic
  (:mod:`pipeline.kafka.replies`: ``unknown-topic``). On Tansu a topic comes back on a
  produce to it whatever the request says; with least-privilege ACLs the worker has no
  Create permission and the broker refuses it (docs/security.md).

:func:`install` makes every aiokafka client of the process send metadata requests that do
not allow creation; `pipeline run` calls it before its stages start. Other processes
(`pipeline produce`, the client library, tests) keep aiokafka's default.
"""

from __future__ import annotations

import aiokafka.client as _client
from aiokafka.protocol.metadata import MetadataRequest


class ExplicitTopicsMetadataRequest(MetadataRequest):  # type: ignore[misc]  # aiokafka is untyped here
    """A metadata request that names topics without asking for them to be created (unless
    its caller asks explicitly)."""

    def __init__(self, topics: list[str] | None = None, allow_auto_topic_creation: bool | None = None) -> None:
        super().__init__(topics, False if allow_auto_topic_creation is None else allow_auto_topic_creation)


def install() -> None:
    """Every aiokafka client of this process: metadata requests never create a topic."""
    _client.MetadataRequest = ExplicitTopicsMetadataRequest


def installed() -> bool:
    return _client.MetadataRequest is ExplicitTopicsMetadataRequest
