"""Deployment manifests generated from a topology, so the topology stays the one source of truth.

``pipeline deploy k8s TOPOLOGY`` writes a kustomize base: one Deployment per unit that
``pipeline run --stage`` accepts (chain stages, graph steps and joins), each with probes on the
health port, a pre-stop pause and a grace period covering the topology's drain, a
PodDisruptionBudget, a metrics Service and ServiceMonitor, and a KEDA ScaledObject scaling it
on its consumer group's lag; Triton as a Deployment reading the S3 model store; the topology
file itself as a generated ConfigMap; on a Strimzi-run Kafka, a KafkaTopic per topic and a
least-privilege KafkaUser per unit, which its workers log in as. Nothing here talks to a cluster.
"""

from pipeline.deploy.kustomize import Bundle, generate, write_bundle
from pipeline.deploy.options import DeployOptions, Resources

__all__ = ["Bundle", "DeployOptions", "Resources", "generate", "write_bundle"]
