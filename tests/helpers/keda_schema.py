"""KEDA's ScaledObject, as far as ``pipeline deploy k8s`` uses it, written down as a JSON schema.

No KEDA runs here and its CRD is not vendored, so the fields the generator emits are checked
against what KEDA documents, transcribed (2.x docs; the structure matches the CRD's
openAPIV3Schema in kedacore/keda ``config/crd/bases/keda.sh_scaledobjects.yaml``):

- https://keda.sh/docs/2.x/reference/scaledobject-spec/ : ``spec.scaleTargetRef`` with a
  mandatory ``name`` (``apiVersion``, ``kind``, ``envSourceContainerName`` optional);
  ``pollingInterval``, ``cooldownPeriod``, ``initialCooldownPeriod``, ``idleReplicaCount``,
  ``minReplicaCount``, ``maxReplicaCount`` integers; ``advanced.horizontalPodAutoscalerConfig``
  (``name``, ``behavior``: the HPA's scaleUp/scaleDown rules) and
  ``advanced.restoreToOriginalReplicaCount``; ``triggers`` (required): ``type`` and
  ``metadata`` (a map of strings) required, ``name``, ``authenticationRef.name``,
  ``metricType``, ``useCachedMetrics`` optional.
- https://keda.sh/docs/2.x/scalers/apache-kafka/ : the ``kafka`` trigger's parameters.
  ``bootstrapServers`` and ``consumerGroup`` are required; ``topic`` optional; ``lagThreshold``
  an integer target (default 10; the scaler refuses 0 and negatives); ``offsetResetPolicy``
  ``latest`` or ``earliest``. A parameter ``X`` may instead be given as ``XFromEnv``, the name
  of a variable of the scale target's container (its ``envFrom`` ConfigMaps included): KEDA's
  ``parseKafkaMetadata`` (pkg/scalers/kafka_scaler.go) reads ``bootstrapServersFromEnv``,
  ``consumerGroupFromEnv`` and ``topicFromEnv``, resolved by ``resolveEnv``
  (pkg/scaling/resolver/scale_resolvers.go).

Unknown keys are refused where KEDA defines the whole object, so a misspelt parameter
(``lagTreshold``) fails here instead of silently falling back to KEDA's default.
"""

from __future__ import annotations

from typing import Any

_STRING = {"type": "string"}
_REPLICAS = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
_ENV_NAME = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}

KAFKA_PARAMETERS = (
    "bootstrapServers", "consumerGroup", "topic", "lagThreshold", "activationLagThreshold", "offsetResetPolicy",
    "allowIdleConsumers", "scaleToZeroOnInvalidOffset", "excludePersistentLag", "limitToPartitionsWithLag",
    "version", "partitionLimitation", "sasl", "tls", "unsafeSsl",
)
KAFKA_FROM_ENV = ("bootstrapServers", "consumerGroup", "topic")

KAFKA_METADATA: dict[str, Any] = {
    "type": "object",
    "properties": {
        **{name: _STRING for name in KAFKA_PARAMETERS},
        **{f"{name}FromEnv": _ENV_NAME for name in KAFKA_FROM_ENV},
        "lagThreshold": {"type": "string", "pattern": "^[1-9][0-9]*$"},
        "activationLagThreshold": {"type": "string", "pattern": "^[0-9]+$"},
        "offsetResetPolicy": {"enum": ["latest", "earliest"]},
    },
    "additionalProperties": False,
    "allOf": [
        {"anyOf": [{"required": ["bootstrapServers"]}, {"required": ["bootstrapServersFromEnv"]}]},
        {"anyOf": [{"required": ["consumerGroup"]}, {"required": ["consumerGroupFromEnv"]}]},
    ],
}

_HPA_RULES = {
    "type": "object",
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {"type": "array"},
    },
    "additionalProperties": False,
}

TRIGGER: dict[str, Any] = {
    "type": "object",
    "required": ["type", "metadata"],
    "properties": {
        "type": _STRING,
        "name": _STRING,
        "metadata": {"type": "object", "additionalProperties": _STRING},
        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
        "useCachedMetrics": {"type": "boolean"},
        "authenticationRef": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": _STRING, "kind": {"enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]}},
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
    "if": {"properties": {"type": {"const": "kafka"}}},
    "then": {"properties": {"metadata": KAFKA_METADATA}},
}

SCALED_OBJECT: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"], "properties": {"name": _STRING}},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"apiVersion": _STRING, "kind": _STRING, "name": _STRING,
                                   "envSourceContainerName": _STRING},
                    "additionalProperties": False,
                },
                **{name: _REPLICAS for name in ("pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
                                                "idleReplicaCount", "minReplicaCount", "maxReplicaCount")},
                "fallback": {"type": "object"},
                "advanced": {
                    "type": "object",
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "scalingModifiers": {"type": "object"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "properties": {
                                "name": _STRING,
                                "behavior": {
                                    "type": "object",
                                    "properties": {"scaleUp": _HPA_RULES, "scaleDown": _HPA_RULES},
                                    "additionalProperties": False,
                                },
                            },
                            "additionalProperties": False,
                        },
                    },
                    "additionalProperties": False,
                },
                "triggers": {"type": "array", "minItems": 1, "items": TRIGGER},
            },
            "additionalProperties": False,
        },
    },
}
