"""The messaging attribute names of our Kafka spans, spelled out (OpenTelemetry semantic conventions).

Why not ``opentelemetry.semconv._incubating``: messaging conventions are not stable
yet, that module is private and moves between releases, and the package is
pinned only from below; a rename there would silently change the attribute
names dashboards and trace queries rely on. These are the names of semantic
conventions 1.27+ (the ``messaging.*`` registry), the ones the spans have always
carried; ``error.type``, which is stable, still comes from the package.
"""

from __future__ import annotations

MESSAGING_SYSTEM = "messaging.system"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_DESTINATION_PARTITION_ID = "messaging.destination.partition.id"
MESSAGING_KAFKA_OFFSET = "messaging.kafka.offset"
MESSAGING_CONSUMER_GROUP_NAME = "messaging.consumer.group.name"
MESSAGING_MESSAGE_CONVERSATION_ID = "messaging.message.conversation_id"
MESSAGING_BATCH_MESSAGE_COUNT = "messaging.batch.message_count"
