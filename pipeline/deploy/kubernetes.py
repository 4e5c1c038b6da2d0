"""The objects of one run unit: Deployment (or StatefulSet), metrics Service, ServiceMonitor, PodDisruptionBudget.

Each pod runs ``pipeline run /config/topology.yaml --stage NAME`` on the topology file mounted
from its ConfigMap, so what runs is what the topology says. Probes use the health server of
:mod:`pipeline.runtime.health` on a fixed port, listening on all addresses
(``PIPELINE_HEALTH_HOST=0.0.0.0``; its default, loopback, is unreachable for the kubelet).
SIGTERM drains (:mod:`pipeline.runtime.runner`): the grace period covers the pre-stop pause,
the topology's ``drain_timeout_s`` and the closing steps after it. With ``--strimzi-users``
the workers of a unit log in to Kafka as the unit's own KafkaUser (:mod:`pipeline.deploy.strimzi`).
"""

from __future__ import annotations

import math

from pipeline.deploy.objects import (
    METRICS_PORT_NAME,
    WORKER,
    DeployContext,
    Manifest,
    container_security,
    deployment,
    disruption_budget,
    http_probe,
    network_policy,
    pod_spec,
    prestop_pause,
    service,
    service_monitor,
    stateful_set,
)
from pipeline.deploy.strimzi import user_login
from pipeline.deploy.units import RunUnit, resource_name

TOPOLOGY_DIR = "/config"
TOPOLOGY_FILE = "topology.yaml"
HEALTH_PORT_NAME = "health"
WORKER_ENV = {"PIPELINE_HEALTH_HOST": "0.0.0.0"}
"""Set on every worker container: ``pipeline run --health-host``'s variable, all addresses,
since probes come from the kubelet, outside the pod's loopback."""

INSTANCE_ID_ENV: Manifest = {
    "name": "PIPELINE_KAFKA_GROUP_INSTANCE_ID",
    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
}
"""With ``static_membership``: each pod's static member name in its stage's group is its own
name, stable in a StatefulSet (the downward API fills it in)."""

WORKER_UID = 10001
"""The ``pipeline`` user of the image (``useradd --uid 10001`` in ``Dockerfile``)."""

SHUTDOWN_MARGIN_S = 10
"""After the drain: the metrics producer's and health server's closes (2 s each, in
:mod:`pipeline.runtime.runner`) and the interpreter's exit, with room to spare."""


def grace_period_s(ctx: DeployContext) -> int:
    """How long Kubernetes waits after deciding to stop a worker before SIGKILL."""
    return ctx.options.prestop_s + math.ceil(ctx.topology.drain_timeout_s) + SHUTDOWN_MARGIN_S


def unit_objects(ctx: DeployContext, unit: RunUnit) -> list[Manifest]:
    """Deployment, Service, PodDisruptionBudget and (optionally) ServiceMonitor of ``unit``."""
    name = resource_name(ctx.topology.name, unit.name)
    labels, selector = ctx.labels(WORKER, name), ctx.selector(WORKER, name)
    # With KEDA the replica count is the autoscaler's; without, a fixed minimum.
    replicas = None if ctx.options.keda else max(ctx.options.min_replicas, 1)
    pod = _pod(ctx, unit)
    workload = (
        stateful_set(name, labels, selector, pod, replicas, service_name=name)
        if ctx.options.static_membership
        else deployment(name, labels, selector, pod, replicas)
    )
    objects = [
        workload,
        service(name, labels, selector, [_metrics_port(ctx)], headless=True),
        disruption_budget(name, labels, selector),
    ]
    if ctx.options.service_monitor:
        objects.append(service_monitor(name, labels, selector))
    return objects


def worker_network_policy(ctx: DeployContext) -> Manifest:
    """Workers take no traffic but scrapes of their health and metrics port."""
    name = resource_name(ctx.topology.name, "workers")
    return network_policy(
        name,
        ctx.labels(WORKER, name),
        ctx.role_selector(WORKER),
        [{"ports": [{"protocol": "TCP", "port": ctx.options.http_port}]}],
    )


def run_arguments(ctx: DeployContext, unit: RunUnit) -> list[str]:
    """``pipeline`` arguments that run ``unit`` on the mounted topology."""
    return [
        "run", f"{TOPOLOGY_DIR}/{TOPOLOGY_FILE}", "--stage", unit.name, "--http-port", str(ctx.options.http_port),
    ]


def _metrics_port(ctx: DeployContext) -> Manifest:
    return {"name": METRICS_PORT_NAME, "port": ctx.options.http_port, "targetPort": HEALTH_PORT_NAME}


def _pod(ctx: DeployContext, unit: RunUnit) -> Manifest:
    options = ctx.options
    container: Manifest = {
        "name": "pipeline",
        "image": options.image,
        "command": ["pipeline"],
        "args": run_arguments(ctx, unit),
        "ports": [{"name": HEALTH_PORT_NAME, "containerPort": options.http_port, "protocol": "TCP"}],
        "env": [{"name": name, "value": value} for name, value in WORKER_ENV.items()]
        + ([INSTANCE_ID_ENV] if options.static_membership else []),
        # Endpoints from the ConfigMap, credentials from the Secret (which wins on a shared key).
        "envFrom": [{"configMapRef": {"name": ctx.endpoints_config}}, {"secretRef": {"name": options.secret}}],
        "resources": options.stage_resources.manifest(),
        # The health server answers once topics exist (a slow broker delays it): startup first.
        "startupProbe": http_probe("/livez", HEALTH_PORT_NAME, period_s=5, failures=60, timeout_s=5),
        "livenessProbe": http_probe("/livez", HEALTH_PORT_NAME, period_s=10, failures=3, timeout_s=5),
        "readinessProbe": http_probe("/readyz", HEALTH_PORT_NAME, period_s=5, failures=2, timeout_s=5),
        "lifecycle": prestop_pause(options.prestop_s),
        "securityContext": container_security(read_only_root=True),
        "volumeMounts": [
            {"name": "topology", "mountPath": TOPOLOGY_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},  # a pod-private emptyDir: the root is read-only
        ],
    }
    volumes = [{"name": "topology", "configMap": {"name": ctx.topology_config}}, {"name": "tmp", "emptyDir": {}}]
    if options.strimzi_users:
        # The unit's own KafkaUser: its SCRAM password by reference, the cluster CA mounted.
        login = user_login(ctx, unit.name)
        container["env"] += login.env
        container["volumeMounts"] += login.volume_mounts
        volumes += login.volumes
    return pod_spec(container, uid=WORKER_UID, grace_s=grace_period_s(ctx), volumes=volumes)
