"""Strimzi's KafkaTopic and KafkaUser, as far as ``pipeline deploy k8s --strimzi`` uses them, as JSON schemas.

No Strimzi operator runs here; the schema is transcribed from the KafkaTopic CRD's
``openAPIV3Schema`` (strimzi/strimzi-kafka-operator,
``packaging/install/cluster-operator/043-Crd-kafkatopic.yaml``, version ``v1``):
``spec.topicName`` a string, ``spec.partitions`` an integer of at least 1, ``spec.replicas``
an integer from 1 to 32767 (absent: the broker's ``default.replication.factor``),
``spec.config`` an object of topic settings. The operator also requires the
``strimzi.io/cluster`` label naming the Kafka cluster (its docs: "Configuring topics").
Unknown keys are refused, so a misspelt field fails here instead of being ignored.

:data:`KAFKA_USER` is transcribed from the KafkaUser CRD (``044-Crd-kafkauser.yaml`` in the
same folder; ``packaging/install/user-operator/04-Crd-kafkauser.yaml`` is the same), version ``v1``,
whose ACL fields are those of ``v1beta2`` (Strimzi 0.49 to 0.51 serve both; 1.0 removed
``v1beta2``) less its deprecated single ``operation``, with ``operations`` now required:
``spec.authentication.type`` one of ``tls``, ``tls-external``, ``scram-sha-512``;
``spec.authorization.type`` ``simple`` with ``acls`` (both required), each rule a
``resource`` (``type`` required: ``topic``, ``group``, ``cluster``, ``transactionalId``;
``name``; ``patternType`` ``literal`` or ``prefix``), its ``operations`` (``Read``, ``Write``,
``Create``, ``Delete``, ``Alter``, ``Describe``, ``ClusterAction``, ``AlterConfigs``,
``DescribeConfigs``, ``IdempotentWrite``, ``All``), an optional ``host`` and rule ``type``
(``allow``, the default, or ``deny``). ``quotas`` and ``template``, which the generator does
not write, are kept as plain objects, and the user's ``password`` (a ``secretKeyRef``) is
transcribed whole: valid KafkaUsers pass. The ``strimzi.io/cluster`` label is required, as
for topics (the User Operator ignores a user without it).
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


OPERATIONS = [
    "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "AlterConfigs", "DescribeConfigs",
    "IdempotentWrite", "All",
]

ACL_RULE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["resource", "operations"],
    "properties": {
        "type": {"enum": ["allow", "deny"]},
        "resource": {
            "type": "object",
            "additionalProperties": False,
            "required": ["type"],
            "properties": {
                "type": {"enum": ["topic", "group", "cluster", "transactionalId"]},
                "name": {"type": "string"},
                "patternType": {"enum": ["literal", "prefix"]},
            },
        },
        "host": {"type": "string"},
        "operations": {"type": "array", "items": {"enum": OPERATIONS}},
    },
}

KAFKA_USER: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kafka.strimzi.io/v1"},
        "kind": {"const": "KafkaUser"},
        "metadata": KAFKA_TOPIC["properties"]["metadata"],
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "userName": {"type": "string"},
                "authentication": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["type"],
                    "properties": {
                        "type": {"enum": ["tls", "tls-external", "scram-sha-512"]},
                        "password": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["valueFrom"],
                            "properties": {
                                "valueFrom": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "secretKeyRef": {
                                            "type": "object",
                                            "additionalProperties": False,
                                            "properties": {
                                                "key": {"type": "string"},
                                                "name": {"type": "string"},
                                                "optional": {"type": "boolean"},
                                            },
                                        }
                                    },
                                }
                            },
                        },
                    },
                },
                "authorization": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["acls", "type"],
                    "properties": {
                        "type": {"enum": ["simple"]},
                        "acls": {"type": "array", "items": ACL_RULE},
                    },
                },
                "quotas": {"type": "object"},
                "template": {"type": "object"},
            },
        },
    },
}
