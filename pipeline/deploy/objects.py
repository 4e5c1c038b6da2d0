"""The Kubernetes building blocks every generated workload shares, as plain dicts.

Dicts rather than client-library models: the output is YAML for kustomize, the objects are
validated against the Kubernetes schemas by the tests (``kubernetes-validate``), and no
cluster client is needed to generate them. Labels follow the recommended
``app.kubernetes.io/*`` set; selectors use the name and instance only, so adding labels later
never orphans a ReplicaSet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.deploy.options import DeployOptions
from pipeline.deploy.units import resource_name
from pipeline.topology.model import Topology

Manifest = dict[str, Any]

NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
PART_OF = "app.kubernetes.io/part-of"
MANAGED_BY = "app.kubernetes.io/managed-by"
GENERATOR = "pipeline-deploy"

METRICS_PORT_NAME = "metrics"

WORKER = "pipeline-stage"
"""``app.kubernetes.io/name`` of every stage worker."""


@dataclass(frozen=True)
class DeployContext:
    """What every builder needs: the topology, the options and the names of the shared objects."""

    topology: Topology
    options: DeployOptions

    @property
    def endpoints_config(self) -> str:
        """ConfigMap of the ``PIPELINE_*`` endpoint variables (kustomize adds a content hash)."""
        return resource_name(self.topology.name, "endpoints")

    @property
    def topology_config(self) -> str:
        """ConfigMap holding the topology file, mounted into every worker."""
        return resource_name(self.topology.name, "topology")

    def common_labels(self) -> dict[str, str]:
        """On every object this topology's deployment generates."""
        return {PART_OF: self.topology.name, MANAGED_BY: GENERATOR}

    def labels(self, role: str, instance: str) -> dict[str, str]:
        return {**self.selector(role, instance), **self.common_labels()}

    def role_selector(self, role: str) -> dict[str, str]:
        """Every pod of ``role`` in this topology (network policies)."""
        return {NAME: role, PART_OF: self.topology.name}

    @staticmethod
    def selector(role: str, instance: str) -> dict[str, str]:
        return {NAME: role, INSTANCE: instance}


def metadata(name: str, labels: dict[str, str]) -> Manifest:
    return {"name": name, "labels": labels}


def http_probe(path: str, port: str, *, period_s: int, failures: int, timeout_s: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failures,
    }


def prestop_pause(seconds: int) -> Manifest:
    """A pause before SIGTERM: the endpoints controller drops the pod from its Services first.

    ``sleep`` from the image rather than the newer ``preStop.sleep`` action, which clusters
    before Kubernetes 1.30 reject.
    """
    return {"preStop": {"exec": {"command": ["sleep", str(seconds)]}}}


def pod_spec(container: Manifest, *, uid: int, grace_s: int, volumes: list[Manifest]) -> Manifest:
    """A pod of one ``container`` running as ``uid``, with no Kubernetes API token (neither the
    workers nor Triton call the API). Non-root by number: a named ``USER`` cannot be verified
    as non-root by the kubelet."""
    return {
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": grace_s,
        "securityContext": {"runAsNonRoot": True, "runAsUser": uid, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": volumes,
    }


def container_security(*, read_only_root: bool) -> Manifest:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "capabilities": {"drop": ["ALL"]},
    }


def deployment(name: str, labels: dict[str, str], selector: dict[str, str], pod: Manifest,
               replicas: int | None, *, surge: bool = True) -> Manifest:
    """A Deployment of ``pod``; ``replicas`` None leaves the count to an autoscaler, so a later
    ``kubectl apply`` does not reset what KEDA chose. ``surge=False`` rolls out by replacing a
    pod before starting its successor: a pod holding a GPU cannot surge on a pool whose GPUs
    are all taken (the new pod would stay Pending and the rollout stall)."""
    rolling = {"maxSurge": 1, "maxUnavailable": 0} if surge else {"maxSurge": 0, "maxUnavailable": 1}
    spec: Manifest = {
        "selector": {"matchLabels": selector},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling},
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }
    if replicas is not None:
        spec = {"replicas": replicas, **spec}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(name, labels), "spec": spec}


def workload_kind(options: DeployOptions) -> str:
    """The kind of a stage's workers: a StatefulSet for static members, else a Deployment."""
    return "StatefulSet" if options.static_membership else "Deployment"


def stateful_set(name: str, labels: dict[str, str], selector: dict[str, str], pod: Manifest,
                 replicas: int | None, *, service_name: str) -> Manifest:
    """A StatefulSet of ``pod``: each pod keeps its name (``<name>-<ordinal>``) across restarts
    and rollouts, which is what a static consumer-group member needs (its instance id is the
    pod's name). Pods start and stop side by side (``Parallel``), as a Deployment's would; a
    rollout replaces them one at a time under the same names. ``replicas`` as in :func:`deployment`."""
    spec: Manifest = {
        "serviceName": service_name,
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": selector},
        "updateStrategy": {"type": "RollingUpdate"},
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }
    if replicas is not None:
        spec = {"replicas": replicas, **spec}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata(name, labels), "spec": spec}


def service(name: str, labels: dict[str, str], selector: dict[str, str], ports: list[Manifest], *,
            headless: bool = False, ready_only: bool = False) -> Manifest:
    """A Service; ``headless``: its name resolves to the pods' own addresses, unready ones too
    unless ``ready_only`` (a client that picks among them wants only those that serve)."""
    spec: Manifest = {"selector": selector, "ports": ports}
    if headless:
        # Prometheus scrapes every pod; unready ones too, since a stalled worker's metrics
        # (the oldest unfinished record's age) are exactly what explains the stall.
        spec.update(clusterIP="None", publishNotReadyAddresses=not ready_only)
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(name, labels), "spec": spec}


def service_monitor(name: str, labels: dict[str, str], selector: dict[str, str]) -> Manifest:
    """Prometheus Operator's scrape of the Service's ``metrics`` port (monitoring.coreos.com/v1)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(name, labels),
        "spec": {
            "selector": {"matchLabels": selector},
            "endpoints": [{"port": METRICS_PORT_NAME, "path": "/metrics", "interval": "30s"}],
        },
    }


def disruption_budget(name: str, labels: dict[str, str], selector: dict[str, str]) -> Manifest:
    """One pod of the Deployment down at a time in a node drain: one rebalance at a time.

    Unready pods may always be evicted: during a Triton outage every worker is unready, and a
    budget counting them would block every node drain for the outage's length.
    """
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(name, labels),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def network_policy(name: str, labels: dict[str, str], pods: dict[str, str], ingress: list[Manifest]) -> Manifest:
    """Ingress to ``pods`` only as listed (traffic from the pod's own node, probes, stays allowed)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(name, labels),
        "spec": {"podSelector": {"matchLabels": pods}, "policyTypes": ["Ingress"], "ingress": ingress},
    }
