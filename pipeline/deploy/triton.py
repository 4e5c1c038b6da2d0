"""Triton Inference Server as a Deployment loading its model repository from the S3 store.

As in ``docker-compose.yaml``: explicit model control with every model loaded at start, strict
readiness, S3 keys of Triton's own read-only identity from its Secret. Whoever reaches Triton's
API can load code (docs/security.md), so its Service exposes gRPC (workers) and metrics only,
and a NetworkPolicy admits gRPC from this topology's workers alone.
"""

from __future__ import annotations

from pipeline.deploy import objects as k8s
from pipeline.deploy.units import resource_name

TRITON = "triton"
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002

TRITON_UID = 1000
"""``triton-server``, the unprivileged user NGC's Triton images create."""

EXIT_TIMEOUT_S = 30
"""Triton's ``--exit-timeout-secs``: how long it lets in-flight requests finish on SIGTERM."""

SHM_SIZE = "1Gi"
"""Python-backend models exchange tensors through /dev/shm (``shm_size`` in docker-compose)."""


def triton_name(ctx: k8s.DeployContext) -> str:
    return resource_name(ctx.topology.name, TRITON)


def triton_grpc_url(ctx: k8s.DeployContext) -> str:
    """Where the workers reach the generated Triton: its Service's gRPC port."""
    return f"{triton_name(ctx)}:{GRPC_PORT}"


def model_repository(ctx: k8s.DeployContext) -> str:
    """``--model-repository``: the same ``s3://`` URL the embedded stack gives Triton."""
    return ctx.options.s3().triton_repository_url()


def triton_objects(ctx: k8s.DeployContext) -> list[k8s.Manifest]:
    """Deployment, Service, NetworkPolicy and (optionally) ServiceMonitor of Triton."""
    name = triton_name(ctx)
    labels, selector = ctx.labels(TRITON, name), ctx.selector(TRITON, name)
    ports = [
        {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"},
        {"name": k8s.METRICS_PORT_NAME, "port": METRICS_PORT, "targetPort": k8s.METRICS_PORT_NAME},
    ]
    objects = [
        k8s.deployment(
            name, labels, selector, _pod(ctx), ctx.options.triton_replicas,
            surge=ctx.options.triton_resources.gpus == 0,
        ),
        k8s.service(name, labels, selector, ports),
        k8s.network_policy(
            name,
            labels,
            selector,
            [
                {"from": [{"podSelector": {"matchLabels": ctx.role_selector(k8s.WORKER)}}],
                 "ports": [{"protocol": "TCP", "port": GRPC_PORT}]},
                {"ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
            ],
        ),
    ]
    if ctx.options.service_monitor:
        objects.append(k8s.service_monitor(name, labels, selector))
    return objects


def _pod(ctx: k8s.DeployContext) -> k8s.Manifest:
    options = ctx.options
    container: k8s.Manifest = {
        "name": TRITON,
        "image": options.triton_image,
        "command": ["tritonserver"],
        "args": [
            f"--model-repository={model_repository(ctx)}",
            "--model-control-mode=explicit",
            "--load-model=*",
            "--strict-readiness=true",
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
            f"--http-port={HTTP_PORT}",
            f"--grpc-port={GRPC_PORT}",
            f"--metrics-port={METRICS_PORT}",
        ],
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": k8s.METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        # AWS_DEFAULT_REGION from the ConfigMap; the S3 keys from Triton's own Secret.
        "envFrom": [{"configMapRef": {"name": ctx.endpoints_config}}, {"secretRef": {"name": options.triton_secret}}],
        "resources": options.triton_resources.manifest(),
        # Models load from S3 before the server listens: up to ten minutes for that.
        "startupProbe": k8s.http_probe("/v2/health/live", "http", period_s=10, failures=60, timeout_s=5),
        "livenessProbe": k8s.http_probe("/v2/health/live", "http", period_s=10, failures=3, timeout_s=5),
        "readinessProbe": k8s.http_probe("/v2/health/ready", "http", period_s=5, failures=2, timeout_s=5),
        "lifecycle": k8s.prestop_pause(options.prestop_s),
        # Writable root: the Python backend writes outside /tmp at model load
        # (triton-inference-server/server#3744, a read-only root fails there).
        "securityContext": k8s.container_security(read_only_root=False),
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
    }
    volumes = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}]
    pod = k8s.pod_spec(container, uid=TRITON_UID, grace_s=options.prestop_s + EXIT_TIMEOUT_S + 10, volumes=volumes)
    if options.triton_resources.gpus:
        # GPU nodes are usually tainted (NVIDIA's device plugin documents nvidia.com/gpu:NoSchedule)
        # and labelled; without these the pod never schedules there.
        pod["tolerations"] = [dict(t) for t in options.triton_tolerations]
        if options.triton_node_selector:
            pod["nodeSelector"] = dict(options.triton_node_selector)
    return pod
