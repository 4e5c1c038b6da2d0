"""Triton Inference Server as a Deployment loading its model repository from the S3 store.

With ``--triton-replicas`` above 1, a headless Service beside the normal one lists the ready
pods, and the workers' ``PIPELINE_TRITON_GRPC_URL`` names it (``dns:///``): stateless stages
spread their batches over the pods, sequence stages pin each stream to one (issue 27).

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


def replicas_name(ctx: k8s.DeployContext) -> str:
    """The headless Service whose name resolves to every ready Triton pod."""
    return resource_name(ctx.topology.name, TRITON, "replicas")


def triton_grpc_url(ctx: k8s.DeployContext) -> str:
    """Where the workers reach the generated Triton: its Service's gRPC port, or with several
    replicas every ready pod through the headless Service (``dns:///``, resolved again every
    30 s): one long-lived HTTP/2 channel to the Service would stick to one pod, so the
    workers keep a channel per pod (pipeline/triton/replicas.py)."""
    if ctx.options.triton_fleet:
        return f"dns:///{replicas_name(ctx)}:{GRPC_PORT}"
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
        k8s.service(name, labels, selector, ports),  # other clients: one address
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
    if ctx.options.triton_fleet:
        grpc = [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"}]
        objects.append(k8s.service(replicas_name(ctx), labels, selector, grpc, headless=True, ready_only=True))
    if ctx.options.triton_max_replicas is not None:
        objects.append(triton_scaled_object(ctx, name, labels))
    if ctx.options.service_monitor:
        objects.append(k8s.service_monitor(name, labels, selector))
    return objects


QUEUE_TIME_PER_REQUEST_US = (
    'sum(rate(nv_inference_queue_duration_us{{service="{service}"}}[2m])) '
    '/ clamp_min(sum(rate(nv_inference_request_success{{service="{service}"}}[2m])), 1)'
)
"""Triton's mean queue time per request over its pods (µs): what one more pod shortens, where
its request rate alone would say nothing about whether the pods keep up."""


def triton_scaled_object(ctx: k8s.DeployContext, name: str, labels: dict[str, str]) -> k8s.Manifest:
    """KEDA scales Triton's Deployment (through an HPA it creates) on its queue time per
    request, read from Prometheus (the ServiceMonitor's scrape labels each series with the
    Service). Scale-down waits five minutes: a pod leaving moves the sequences pinned to it."""
    options = ctx.options
    query = QUEUE_TIME_PER_REQUEST_US.format(service=name)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": k8s.metadata(name, labels),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicaCount": options.triton_replicas,
            "maxReplicaCount": options.triton_max_replicas,
            "pollingInterval": 15,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "Value",
                    "metadata": {
                        "serverAddress": options.prometheus_url,
                        "query": query,
                        "threshold": str(options.triton_queue_target_us),
                    },
                }
            ],
        },
    }


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
