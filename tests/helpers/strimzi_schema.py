"""Strimzi's KafkaTopic, as far as ``pipeline deploy k8s --strimzi`` uses it, as a JSON schema.

No Strimzi operator runs here; the schema is transcribed from the KafkaTopic CRD's
``openAPIV3Schema`` (strimzi/strimzi-kafka-operator,
``packaging/install/cluster-operator/043-Crd-kafkatopic.yaml``, version ``v1``):
``spec.topicName`` a string, ``spec.partitions`` an integer of at least 1, ``spec.replicas``
an integer from 1 to 32767 (absent: the broker's ``default.replication.factor``),
``spec.config`` an object of topic settings. The operator also requires the
``strimzi.io/cluster`` label naming the Kafka cluster (its docs: "Configuring topics").
Unknown keys are refused, so a misspelt field fails here instead of being ignored.
"""

from __future__ import annotations

from typing import Any

KAFKA_TOPIC: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kafka.strimzi.io/v1"},
        "kind": {"const": "KafkaTopic"},
        "metadata": {
            "type": "object",
            "required": ["name", "labels"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
                "labels": {
                    "type": "object",
                    "required": ["strimzi.io/cluster"],
                    "additionalProperties": {"type": "string"},
                },
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "topicName": {"type": "string"},
                "partitions": {"type": "integer", "minimum": 1},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 32767},
                "config": {"type": "object", "additionalProperties": {"type": ["string", "integer", "boolean"]}},
            },
        },
    },
}
