"""What a deployment adds to the topology: images, where the services are, sizes, scaling.

The topology says *what* runs (stages, topics, partitions, drain timeout); these options say
*where and how big*. Defaults follow ``docker-compose.yaml`` (Kafka at ``kafka:9092``, MinIO at
``http://minio:9000``, bucket ``models``), so the generated base works beside that layout and
every value can be overridden on the command line or in a kustomize overlay.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

from pipeline.errors import ConfigError
from pipeline.runtime.health import DEFAULT_PORT
from pipeline.settings import S3Settings

DEFAULT_IMAGE = f"streaming-inference-pipeline:{version('streaming-inference-pipeline')}"
"""The image ``Dockerfile`` builds, tagged with this package's version."""

TRITON_BASE_IMAGE = "nvcr.io/nvidia/tritonserver:24.08-py3"
"""NGC's Triton 2.49, the base of ``docker/triton.Dockerfile``: it serves ONNX Runtime, TensorRT
and PyTorch models, but the sample models are Python-backend models importing onnxruntime,
which it lacks."""

TRITON_IMAGE = f"pipeline-triton:{version('streaming-inference-pipeline')}"
"""The image ``docker/triton.Dockerfile`` builds (``docker compose build triton`` tags it so):
the base plus onnxruntime, so the generated Triton loads the shipped sample models as they are.
Pass ``--triton-image`` for the stock image (models of its own backends) or one of your own."""

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource NVIDIA's device plugin advertises."""

GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
"""The taint NVIDIA's GPU operator puts on GPU nodes, tolerated by a GPU Triton by default."""

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_TAINT_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME_PART}")
_TAINT_VALUE = re.compile(rf"({_NAME_PART})?")
"""A taint's key is a qualified name (``example.com/name``), its value a label value: the
API server's rules, checked here so a typo is one line now rather than a refused apply later."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_CPU = re.compile(r"(?:\d+(?:\.\d+)?|\.\d+)m?")
_MEMORY = re.compile(r"(?:\d+(?:\.\d+)?|\.\d+)(?:[kMGTPE]i?|Ki|[eE]\d+)?")
"""Kubernetes quantities as a person writes them for CPU (``500m``, ``1.5``) and memory
(``2Gi``, ``512M``, ``1e9``): the API server refuses anything else, but only at apply time,
far from the typo; ``pipeline deploy`` refuses it with one line instead."""


@dataclass(frozen=True)
class Resources:
    """Requests and limits of one container (Kubernetes quantities, e.g. ``500m``, ``2Gi``).

    No CPU limit by default: a throttled worker misses its consumer-group heartbeats and
    batches stall; memory is limited so a leak ends in a restart, not a node under pressure.
    """

    cpu_request: str = "500m"
    memory_request: str = "1Gi"
    memory_limit: str | None = "2Gi"
    cpu_limit: str | None = None
    gpus: int = 0

    def __post_init__(self) -> None:
        for what, value, pattern, example in (
            ("CPU request", self.cpu_request, _CPU, "500m or 2"),
            ("CPU limit", self.cpu_limit, _CPU, "500m or 2"),
            ("memory request", self.memory_request, _MEMORY, "512Mi or 2Gi"),
            ("memory limit", self.memory_limit, _MEMORY, "512Mi or 2Gi"),
        ):
            if value is not None and not pattern.fullmatch(value):
                raise ConfigError(f"{what} {value!r} is not a Kubernetes quantity (e.g. {example})")

    def manifest(self) -> dict[str, Any]:
        """The container's ``resources`` field."""
        limits: dict[str, Any] = {}
        if self.cpu_limit is not None:
            limits["cpu"] = self.cpu_limit
        if self.memory_limit is not None:
            limits["memory"] = self.memory_limit
        if self.gpus:
            limits[GPU_RESOURCE] = self.gpus  # extended resources: the request defaults to the limit
        resources: dict[str, Any] = {"requests": {"cpu": self.cpu_request, "memory": self.memory_request}}
        if limits:
            resources["limits"] = limits
        return resources


@dataclass(frozen=True)
class DeployOptions:
    """Everything ``pipeline deploy k8s`` takes besides the topology file."""

    image: str = DEFAULT_IMAGE
    namespace: str | None = None
    """Set on every object by kustomize; None = the namespace ``kubectl`` is pointed at."""
    kafka_bootstrap: str | None = None
    """None = the topology's ``kafka.bootstrap_servers`` when it sets one, else ``kafka:9092``."""
    s3_endpoint: str = "http://minio:9000"
    s3_bucket: str = "models"
    s3_prefix: str = ""
    s3_region: str = "us-east-1"
    secret: str = "pipeline-credentials"
    """Secret whose keys become the workers' environment (S3 keys, SASL credentials)."""
    triton_secret: str = "triton-credentials"
    """Secret of Triton's own S3 identity (read-only on the model bucket, docs/security.md)."""
    triton_image: str = TRITON_IMAGE
    triton_url: str | None = None
    """An existing Triton (``host:port``): no Triton objects are generated."""
    triton_replicas: int = 1
    triton_max_replicas: int | None = None
    """Autoscale Triton from ``triton_replicas`` up to this many pods (a KEDA ScaledObject on
    Triton's own queue time per request, from Prometheus); None: a fixed ``triton_replicas``."""
    triton_queue_target_us: int = 50_000
    """The queue time per request (µs, ``nv_inference_queue_duration_us`` over
    ``nv_inference_request_success``) Triton's autoscaling holds Triton to."""
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    """Where KEDA queries Triton's metrics (the Prometheus that scrapes its ServiceMonitor)."""
    triton_resources: Resources = field(
        default_factory=lambda: Resources(cpu_request="1", memory_request="2Gi", memory_limit="4Gi")
    )
    triton_tolerations: tuple[dict[str, str], ...] = (GPU_TOLERATION,)
    """Tolerations of a GPU Triton (with ``gpus`` > 0): by default the taint NVIDIA's GPU
    operator puts on GPU nodes; ``--triton-toleration`` (:func:`toleration`) replaces it."""
    triton_node_selector: tuple[tuple[str, str], ...] = ()
    """Node labels a GPU Triton must run on (e.g. ``nvidia.com/gpu.present=true``)."""
    stage_resources: Resources = field(default_factory=Resources)
    http_port: int = DEFAULT_PORT
    """Health and metrics port of every worker (``--http-port``): the workers' stable default."""
    min_replicas: int = 1
    max_replicas: int | None = None
    """None = the partition count, which is also the cap: more consumers than partitions idle."""
    lag_threshold: int = 500
    """KEDA's target lag per replica, in records, summed over the stage's input partitions."""
    keda: bool = True
    keda_auth: str | None = None
    """A KEDA TriggerAuthentication for a Kafka with SASL or TLS (created by the operator)."""
    strimzi_cluster: str | None = None
    """A Strimzi-run Kafka cluster's name: every topic of the topology becomes a ``KafkaTopic``
    of that cluster (``pipeline/deploy/strimzi.py``); None: the workers create the topics."""
    strimzi_users: bool = False
    """With ``strimzi_cluster``: a ``KafkaUser`` per run unit (SCRAM-SHA-512, ACLs on its own
    topics and group only), and each unit's workers log in as it (the password from the
    Secret the User Operator writes). False: the workers' Kafka credentials, if any, come
    from ``secret``."""
    strimzi_clients: tuple[str, ...] = ()
    """With ``strimzi_cluster``: a ``KafkaUser`` per request-reply client named here, with a
    client's ACLs only (:func:`pipeline.deploy.access.client_rules`: write the requests, own
    the reply topic ``<result_topic>.reply.<name>``); the same rules `pipeline deploy acls
    --client` creates."""
    strimzi_tls: bool = True
    """With ``strimzi_users``: the listener the users log in at has TLS (``SASL_SSL``, the
    cluster CA mounted from ``<cluster>-cluster-ca-cert``); False: ``SASL_PLAINTEXT``."""
    static_membership: bool = False
    """Stage workers as StatefulSets whose pods join their groups as static members (KIP-345),
    named after the pod (``PIPELINE_KAFKA_GROUP_INSTANCE_ID``): a restarted container or a
    rolled-out pod gets its partitions back without a rebalance; a pod removed by a scale-down
    hands them on only after the session timeout (docs/deployment.md). False: Deployments,
    dynamic members that leave their groups on SIGTERM."""
    service_monitor: bool = True
    prestop_s: int = 5
    """Pause before SIGTERM, so the pod leaves its Services' endpoints before it stops."""

    @property
    def triton_fleet(self) -> bool:
        """Whether Triton may run more than one pod (the workers then reach every pod)."""
        return max(self.triton_replicas, self.triton_max_replicas or 0) > 1

    def s3(self) -> S3Settings:
        """The model store these options name, built from them alone: ``model_construct`` reads
        no environment variable, so keys in the generating shell never reach a manifest."""
        return S3Settings.model_construct(
            endpoint=self.s3_endpoint, bucket=self.s3_bucket, prefix=self.s3_prefix, region=self.s3_region
        )

    def __post_init__(self) -> None:
        checks = [
            (self.min_replicas >= 0, f"--min-replicas must be 0 or more, not {self.min_replicas}"),
            (self.max_replicas is None or self.max_replicas >= 1, "--max-replicas must be 1 or more"),
            (self.max_replicas is None or self.max_replicas >= self.min_replicas,
             f"--max-replicas ({self.max_replicas}) is below --min-replicas ({self.min_replicas})"),
            (self.lag_threshold >= 1, f"--lag-threshold must be 1 or more, not {self.lag_threshold}"),
            (1 <= self.http_port <= 65535, f"--http-port must be a port number, not {self.http_port}"),
            (self.prestop_s >= 0, f"--prestop-seconds must be 0 or more, not {self.prestop_s}"),
            (self.triton_replicas >= 1, "--triton-replicas must be 1 or more"),
            (self.triton_max_replicas is None or self.triton_max_replicas >= self.triton_replicas,
             f"--triton-max-replicas ({self.triton_max_replicas}) is below --triton-replicas ({self.triton_replicas})"),
            (self.triton_queue_target_us >= 1, "--triton-queue-target-us must be 1 or more"),
            (min(self.stage_resources.gpus, self.triton_resources.gpus) >= 0, "GPU counts must be 0 or more"),
            (self.strimzi_cluster is not None or not self.strimzi_users, "--strimzi-users needs --strimzi CLUSTER"),
            (self.strimzi_cluster is not None or not self.strimzi_clients, "--strimzi-client needs --strimzi CLUSTER"),
            *((_DNS_LABEL.fullmatch(name) is not None,
               f"--strimzi-client {name!r}: a KafkaUser's name (lower-case letters, digits, '-')")
              for name in self.strimzi_clients),
            # `--strimzi --strimzi-users` takes the flag as the cluster's name: say so, not write it.
            (self.strimzi_cluster is None or _DNS_LABEL.fullmatch(self.strimzi_cluster) is not None,
             f"--strimzi {self.strimzi_cluster!r}: a Strimzi cluster's name (lower-case letters, digits, '-')"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)


def toleration(text: str) -> dict[str, str]:
    """A toleration of the taint ``text`` names as ``kubectl taint`` writes it:
    ``KEY=VALUE:EFFECT`` (operator ``Equal``) or ``KEY:EFFECT`` (``Exists``: any value)."""
    taint, _, effect = text.rpartition(":")
    key, equals, value = taint.partition("=")
    if (
        effect not in TAINT_EFFECTS
        or not _TAINT_KEY.fullmatch(key)
        or (equals and not _TAINT_VALUE.fullmatch(value))
    ):
        raise ConfigError(
            f"--triton-toleration {text!r}: expected KEY[=VALUE]:EFFECT with EFFECT one of "
            f"{', '.join(TAINT_EFFECTS)} (e.g. {GPU_RESOURCE}:NoSchedule)"
        )
    if equals:
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}
