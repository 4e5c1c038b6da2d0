"""`pipeline deploy k8s`: the kustomize base renders, validates and runs what the topology says.

Real tools, no cluster: ``kubectl kustomize`` (client 1.32, kustomize 5.5) renders each base as
``kubectl apply -k`` would; ``kubernetes-validate`` checks the core objects against the
Kubernetes 1.32 schemas, strictly (unknown fields are errors); the ScaledObjects are checked
against KEDA's documented fields (``tests/helpers/keda_schema.py``). What the pods would run is
checked against the runtime itself: the units and consumer groups are those
:func:`pipeline.runtime.stages.build_stages` builds for ``pipeline run --stage``, and the
container arguments are parsed by the real ``pipeline run`` command.
"""

from __future__ import annotations

import math
import re
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml

from pipeline.cli import app
from pipeline.deploy import Bundle, DeployOptions, Resources, generate, write_bundle
from pipeline.deploy.options import TRITON_BASE_IMAGE, TRITON_IMAGE, toleration
from pipeline.errors import ConfigError
from pipeline.observability.metrics import PipelineMetrics
from pipeline.runtime.stages import build_stages
from pipeline.settings import Endpoints, KafkaSettings, S3Settings, TritonSettings
from pipeline.topology.loader import parse_topology
from pipeline.topology.model import Topology
from tests.helpers.keda_schema import SCALED_OBJECT
from tests.helpers.strimzi_schema import KAFKA_TOPIC, KAFKA_USER
from tests.unit.test_no_secret_literals import findings

REPO = Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.32"  # the kubectl client scripts/install.sh installs
CORE_KINDS = {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}
WORKER = {"app.kubernetes.io/name": "pipeline-stage"}


def kustomize(folder: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize folder``, parsed."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not installed (scripts/install.sh installs it)"
    done = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@dataclass
class Rendered:
    """One generated base, written, rendered by kustomize, and what the runtime would run."""

    bundle: Bundle
    folder: Path
    objects: list[dict[str, Any]]
    units: list[tuple[str, str, tuple[str, ...]]]  # (--stage name, group id, input topics) per build_stages

    @property
    def topology(self) -> Topology:
        return self.bundle.topology

    def of(self, kind: str, **labels: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind
                and labels.items() <= o["metadata"].get("labels", {}).items()]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        return found

    def config_map(self, prefix: str) -> dict[str, Any]:
        (found,) = [o for o in self.of("ConfigMap") if o["metadata"]["name"].startswith(f"{prefix}-")]
        return found

    def workers(self) -> list[dict[str, Any]]:
        return self.of("Deployment", **WORKER)


def runtime_stages(topology: Topology) -> list[Any]:
    """The runtime's own stage objects for every unit of ``topology`` (nothing connects)."""
    endpoints = Endpoints.model_construct(
        kafka=KafkaSettings.model_construct(bootstrap_servers="kafka:9092"),
        triton=TritonSettings.model_construct(grpc_url="triton:8001"),
        s3=S3Settings.model_construct(endpoint="http://minio:9000"),
    )
    return list(build_stages(topology, endpoints, PipelineMetrics()))


def runtime_units(topology: Topology) -> list[tuple[str, str, tuple[str, ...]]]:
    """What `pipeline run --stage` would start: the runtime's own stage objects (nothing connects)."""
    return [(s.io.stage, s.io.group_id, (s.io.input_topic, *s.io.more_input_topics)) for s in runtime_stages(topology)]


def render(topology_file: Path, folder: Path, options: DeployOptions | None = None) -> Rendered:
    bundle = generate(topology_file, options or DeployOptions())
    write_bundle(bundle, folder)
    return Rendered(bundle, folder, kustomize(folder), runtime_units(bundle.topology))


def variant(tmp_path: Path, base: str, **changes: Any) -> Path:
    """A copy of ``topologies/<base>.yaml`` with top-level keys changed."""
    data = yaml.safe_load((REPO / "topologies" / f"{base}.yaml").read_text())
    data.update(changes)
    path = tmp_path / f"{base}-variant.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


@pytest.fixture(scope="module", params=["audio", "dense", "ensemble"])
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return render(REPO / "topologies" / f"{request.param}.yaml", tmp_path_factory.mktemp(request.param))


def test_renders_and_core_objects_validate(rendered: Rendered) -> None:
    kinds = {o["kind"] for o in rendered.objects}
    assert kinds == CORE_KINDS | {"ServiceMonitor", "ScaledObject"}
    core = [o for o in rendered.objects if o["kind"] in CORE_KINDS]
    for obj in core:
        # Raises with the failing path; strict: a field Kubernetes does not know is an error.
        assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
    # Two ConfigMaps, and per unit a Deployment, Service and budget; plus Triton's pair.
    units = len(rendered.units)
    assert len(core) == 2 + 3 * units + 2 + 2


def test_scaled_objects_follow_kedas_documented_schema(rendered: Rendered) -> None:
    scaled = rendered.of("ScaledObject")
    assert len(scaled) == len(rendered.units)
    for obj in scaled:
        jsonschema.validate(obj, SCALED_OBJECT, cls=jsonschema.Draft202012Validator)


def test_the_keda_schema_refuses_what_keda_would_not_take() -> None:
    """The schema check above means something: typical mistakes fail it."""
    metadata = {"bootstrapServers": "kafka:9092", "consumerGroup": "g", "topic": "t", "lagThreshold": "5"}

    def scaled_object(trigger_metadata: dict[str, Any], **spec: Any) -> dict[str, Any]:
        triggers = [{"type": "kafka", "metadata": trigger_metadata}]
        return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
                "spec": {"scaleTargetRef": {"name": "x"}, "triggers": triggers, **spec}}

    jsonschema.validate(scaled_object(metadata), SCALED_OBJECT)
    wrong = [
        scaled_object({k: v for k, v in metadata.items() if k != "consumerGroup"}),  # a required parameter
        scaled_object({**metadata, "lagThreshold": "0"}),  # the scaler refuses a threshold below 1
        scaled_object({**metadata, "lagThreshold": 5}),  # metadata values are strings in the CRD
        scaled_object({**metadata, "lagTreshold": "5"}),  # misspelt: KEDA would silently use its default
        scaled_object({**metadata, "offsetResetPolicy": "oldest"}),
        scaled_object(metadata, scaleTargetRef={"kind": "Deployment"}),  # the target's name is mandatory
        scaled_object(metadata, maxReplicas=4),  # an HPA field, not a ScaledObject's
    ]
    for obj in wrong:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(obj, SCALED_OBJECT)


def test_one_deployment_per_unit_scaled_on_the_group_pipeline_run_uses(rendered: Rendered) -> None:
    partitions = rendered.topology.kafka.partitions
    by_stage = {container(d)["args"][3]: d for d in rendered.workers()}
    assert sorted(by_stage) == sorted(name for name, _, _ in rendered.units)  # kustomize sorts objects
    for name, group_id, topics in rendered.units:
        deployment = by_stage[name]
        scaled = rendered.named("ScaledObject", deployment["metadata"]["name"])
        spec = scaled["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": deployment["metadata"]["name"]}
        assert [t["metadata"]["consumerGroup"] for t in spec["triggers"]] == [group_id] * len(topics)
        assert tuple(t["metadata"]["topic"] for t in spec["triggers"]) == topics
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= partitions
        # The brokers come from the very ConfigMap the Deployment reads (one place to change them).
        env_names = [t["metadata"]["bootstrapServersFromEnv"] for t in spec["triggers"]]
        endpoints = rendered.config_map(rendered.bundle.context.endpoints_config)
        assert container(deployment)["envFrom"][0] == {"configMapRef": {"name": endpoints["metadata"]["name"]}}
        assert all(endpoints["data"][n] == "kafka:9092" for n in env_names)
        assert "replicas" not in deployment["spec"]  # KEDA's to set


def test_static_membership_makes_stateful_sets_whose_pods_join_under_their_own_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--static-membership``: per unit a StatefulSet (valid, strictly) instead of the Deployment,
    governed by the unit's headless Service, each pod's group instance id its own stable name
    (the downward API), KEDA scaling the StatefulSet; the runtime reads that variable as the
    instance id of every stage consumer (``KafkaSettings.group_instance_id``)."""
    case = render(REPO / "topologies" / "ensemble.yaml", tmp_path, DeployOptions(static_membership=True))
    assert not case.of("Deployment", **WORKER)
    sets = case.of("StatefulSet", **WORKER)
    assert sorted(container(s)["args"][3] for s in sets) == sorted(name for name, _, _ in case.units)
    headless = {s["metadata"]["name"] for s in case.of("Service") if s["spec"].get("clusterIP") == "None"}
    for obj in sets:
        assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
        name, spec = obj["metadata"]["name"], obj["spec"]
        assert spec["serviceName"] == name and name in headless
        assert spec["podManagementPolicy"] == "Parallel" and "replicas" not in spec  # KEDA's to set
        env = {e["name"]: e for e in container(obj)["env"]}
        assert env["PIPELINE_KAFKA_GROUP_INSTANCE_ID"] == {
            "name": "PIPELINE_KAFKA_GROUP_INSTANCE_ID",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        }
        scaled = case.named("ScaledObject", name)
        jsonschema.validate(scaled, SCALED_OBJECT, cls=jsonschema.Draft202012Validator)
        assert scaled["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name}
    pod_name = f"{sets[0]['metadata']['name']}-0"
    monkeypatch.setenv("PIPELINE_KAFKA_GROUP_INSTANCE_ID", pod_name)
    assert KafkaSettings().group_instance_id == pod_name
    (triton,) = case.of("Deployment", **{"app.kubernetes.io/name": "triton"})  # Triton keeps its Deployment
    assert triton["kind"] == "Deployment"


def test_containers_run_pipeline_run_with_probes_on_the_health_port(
    rendered: Rendered, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_command = typer.main.get_group(app).commands["run"]
    for deployment in rendered.workers():
        spec = container(deployment)
        assert spec["command"] == ["pipeline"]
        for variable in spec["env"]:
            monkeypatch.setenv(variable["name"], variable["value"])
        params = run_command.make_context("run", list(spec["args"][1:])).params
        (port,) = [p["containerPort"] for p in spec["ports"] if p["name"] == "health"]
        assert spec["args"][0] == "run"
        assert params["http_port"] == port
        assert params["health_host"] == "0.0.0.0"  # reachable by the kubelet, not loopback only
        assert params["topology_file"] == Path("/config/topology.yaml")
        assert spec["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
        assert spec["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
        assert spec["startupProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
        service = rendered.named("Service", deployment["metadata"]["name"])
        assert service["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "health"}]
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
        monitor = rendered.named("ServiceMonitor", deployment["metadata"]["name"])
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
        budget = rendered.named("PodDisruptionBudget", deployment["metadata"]["name"])
        assert budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["selector"] == deployment["spec"]["selector"]
        # Nothing but scrapes and probes reach a worker (docs/security.md: restrict the port).
        policy = rendered.named("NetworkPolicy", f"{rendered.topology.name}-workers")
        assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": port}]}]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def _prestop_s(spec: dict[str, Any]) -> int:
    command = spec["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    return int(command[1])


def test_the_grace_period_covers_the_drain(rendered: Rendered, tmp_path: Path) -> None:
    slow = render(variant(tmp_path, "dense", drain_timeout_s=95.5), tmp_path / "slow")
    for case in (rendered, slow):
        drain = case.topology.drain_timeout_s
        for deployment in case.workers():
            pod = deployment["spec"]["template"]["spec"]
            assert pod["terminationGracePeriodSeconds"] >= math.ceil(drain) + _prestop_s(container(deployment))
    assert slow.topology.drain_timeout_s == 95.5


def test_the_topology_config_map_is_the_file_and_loads_as_in_the_pod(rendered: Rendered) -> None:
    ctx = rendered.bundle.context
    topology_map = rendered.config_map(ctx.topology_config)
    text = topology_map["data"]["topology.yaml"]
    assert text == rendered.bundle.topology_source.read_text()
    endpoints = rendered.config_map(ctx.endpoints_config)["data"]
    for deployment in rendered.workers():
        pod = deployment["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["topology"]["configMap"]["name"] == topology_map["metadata"]["name"]
        env = {**endpoints, **{v["name"]: v["value"] for v in container(deployment)["env"]}}
        assert parse_topology(text, "pod", env) == rendered.topology


def test_security_contexts(rendered: Rendered) -> None:
    found = re.search(r"--uid (\d+)", (REPO / "Dockerfile").read_text())
    assert found, "Dockerfile creates no user with a fixed uid"
    for deployment in rendered.of("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert isinstance(pod["securityContext"]["runAsUser"], int)
        assert pod["automountServiceAccountToken"] is False
        security = container(deployment)["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
    for deployment in rendered.workers():
        assert container(deployment)["securityContext"]["readOnlyRootFilesystem"] is True
        assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(found.group(1))


def test_credentials_only_by_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys in the generating shell never reach a manifest; pods get them from Secrets."""
    planted = {name: secrets.token_hex(16) for name in (
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PIPELINE_S3_SECRET_KEY", "PIPELINE_KAFKA_SASL_PASSWORD")}
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "laptop.local:9092")  # the topology's ${KAFKA_BOOTSTRAP:-}
    monkeypatch.setenv("PIPELINE_S3_PREFIX", "my-laptop")
    stage_keys, triton_keys = "stage-keys", "triton-keys"  # names of Secrets, not values
    case = render(REPO / "topologies" / "audio.yaml", tmp_path / "out",
                  DeployOptions(secret=stage_keys, triton_secret=triton_keys))
    written = "".join(p.read_text() for p in case.folder.iterdir())
    rendered_text = yaml.safe_dump_all(case.objects)
    for value in [*planted.values(), "laptop.local", "my-laptop"]:
        assert value not in written and value not in rendered_text
    assert findings(rendered_text, python=False) == []
    assert case.topology.kafka.bootstrap_servers is None  # expanded with the pod's environment
    secret_refs = {}
    for deployment in case.of("Deployment"):
        spec = container(deployment)
        secret_refs[deployment["metadata"]["name"]] = [e["secretRef"]["name"] for e in spec["envFrom"] if "secretRef" in e]
        assert all("valueFrom" not in e and not re.search("KEY|PASSW|SECRET|TOKEN", e["name"]) for e in spec.get("env", []))
    assert secret_refs == {"audio-preprocess": [stage_keys], "audio-vad": [stage_keys], "audio-triton": [triton_keys]}
    endpoints = case.config_map(case.bundle.context.endpoints_config)["data"]
    assert not [k for k in endpoints if re.search("KEY|PASSW|SECRET|TOKEN", k)]


def test_triton_reads_the_s3_store(rendered: Rendered, tmp_path: Path) -> None:
    (triton,) = rendered.of("Deployment", **{"app.kubernetes.io/name": "triton"})
    spec = container(triton)
    assert "--model-repository=s3://minio:9000/models" in spec["args"]
    assert "--model-control-mode=explicit" in spec["args"]
    assert spec["image"] == TRITON_IMAGE
    assert spec["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
    assert ports["http"] == 8000 and ports["grpc"] == 8001
    service = rendered.named("Service", triton["metadata"]["name"])
    assert {p["port"] for p in service["spec"]["ports"]} == {8001, 8002}  # no HTTP model-control API
    endpoints = rendered.config_map(rendered.bundle.context.endpoints_config)["data"]
    assert endpoints["PIPELINE_TRITON_GRPC_URL"] == f"{service['metadata']['name']}:8001"
    assert "limits" not in spec["resources"] or "nvidia.com/gpu" not in spec["resources"]["limits"]
    policy = rendered.named("NetworkPolicy", triton["metadata"]["name"])
    grpc_rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 8001)
    assert grpc_rule["from"] == [{"podSelector": {"matchLabels": {
        **WORKER, "app.kubernetes.io/part-of": rendered.topology.name}}}]


def test_triton_options(tmp_path: Path) -> None:
    dense = REPO / "topologies" / "dense.yaml"
    gpu = render(dense, tmp_path / "gpu", DeployOptions(
        triton_resources=Resources("2", "8Gi", "16Gi", gpus=2), s3_endpoint="https://s3.example:9000",
        s3_prefix="prod", triton_image="registry.example/triton:24.08-onnx"))
    (triton,) = gpu.of("Deployment", **{"app.kubernetes.io/name": "triton"})
    spec = container(triton)
    assert spec["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "--model-repository=s3://https://s3.example:9000/models/prod" in spec["args"]
    assert spec["image"] == "registry.example/triton:24.08-onnx"
    external = render(dense, tmp_path / "external", DeployOptions(triton_url="triton.shared:8001"))
    assert not external.of("Deployment", **{"app.kubernetes.io/name": "triton"})
    assert external.config_map("dense-demo-endpoints")["data"]["PIPELINE_TRITON_GRPC_URL"] == "triton.shared:8001"


def test_replicas_are_capped_at_the_partitions(tmp_path: Path) -> None:
    dense = REPO / "topologies" / "dense.yaml"
    case = render(dense, tmp_path / "many", DeployOptions(min_replicas=2, max_replicas=64))
    (scaled,) = case.of("ScaledObject")
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (2, 4)
    assert case.bundle.notes == ["--max-replicas 64 capped at 4: the topology's topics have 4 partitions"]
    with pytest.raises(ConfigError, match="below --min-replicas"):
        DeployOptions(min_replicas=3, max_replicas=2)
    fixed = render(dense, tmp_path / "many", DeployOptions(keda=False, min_replicas=3))  # same folder: rewritten
    assert not fixed.of("ScaledObject") and not (fixed.folder / "scaled-objects.yaml").exists()
    assert [d["spec"]["replicas"] for d in fixed.workers()] == [3]


def test_names_fit_kubernetes_and_never_collide(tmp_path: Path) -> None:
    long_name = "a" + "-long-name" * 6 + "-xy"  # 64 characters, the topology's maximum
    assert len(long_name) == 64
    base = yaml.safe_load((REPO / "topologies" / "dense.yaml").read_text())
    stage = {**base["stages"][0], "name": long_name}
    case = render(variant(tmp_path, "dense", name=long_name, stages=[stage, {**stage, "name": long_name[:-1] + "w"}],
                          input_topic="long.in"), tmp_path / "long")
    names = [o["metadata"]["name"] for o in case.objects if o["kind"] != "ConfigMap"]
    assert all(len(n) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", n) for n in names)
    assert len({(o["kind"], o["metadata"]["name"]) for o in case.objects}) == len(case.objects)
    assert len(case.workers()) == 2
    clash = variant(tmp_path, "dense", stages=[{**base["stages"][0], "name": "triton"}])
    with pytest.raises(ConfigError, match="named 'dense-demo-triton'"):
        generate(clash, DeployOptions())
    generate(clash, DeployOptions(triton_url="triton:8001"))  # no generated Triton: no clash


def test_the_topologys_own_endpoint_wins(tmp_path: Path) -> None:
    pinned = variant(tmp_path, "dense", kafka={"bootstrap_servers": "broker-0.kafka:9092", "partitions": 6})
    case = render(pinned, tmp_path / "pinned")
    assert case.config_map("dense-demo-endpoints")["data"]["PIPELINE_KAFKA_BOOTSTRAP_SERVERS"] == "broker-0.kafka:9092"
    assert case.of("ScaledObject")[0]["spec"]["maxReplicaCount"] == 6
    with pytest.raises(ConfigError, match="--kafka-bootstrap"):
        generate(pinned, DeployOptions(kafka_bootstrap="other:9092"))


def test_triton_image_default_is_the_one_that_loads_the_sample_models() -> None:
    """Issue 24: the stock image cannot load the shipped Python-backend models (they import
    onnxruntime); the default is what docker/triton.Dockerfile builds on it, as compose tags it."""
    dockerfile = (REPO / "docker" / "triton.Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", dockerfile, flags=re.MULTILINE)
    assert base and base.group(1) == TRITON_BASE_IMAGE
    assert "onnxruntime" in dockerfile
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    assert compose["services"]["triton"]["image"] == TRITON_IMAGE
    assert compose["services"]["triton"]["build"]["dockerfile"] == "docker/triton.Dockerfile"


def test_the_command_writes_a_base_that_renders(tmp_path: Path) -> None:
    out = tmp_path / "audio-k8s"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "deploy", "k8s", "topologies/audio.yaml", "--out", str(out),
         "--namespace", "inference"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in ("deployments.yaml", "scaled-objects.yaml", "topology.yaml", "kustomization.yaml"):
        assert f"wrote {out / name}" in done.stdout
    assert f"kubectl apply -k {out}" in done.stdout
    objects = kustomize(out)
    assert {o["metadata"]["namespace"] for o in objects} == {"inference"}
    assert len([o for o in objects if o["kind"] == "Deployment"]) == 3  # preprocess, vad, triton
    helped = subprocess.run([sys.executable, "-m", "pipeline", "deploy", "k8s", "--help"],
                            cwd=REPO, capture_output=True, text=True, check=False)
    assert helped.returncode == 0 and "--lag-threshold" in helped.stdout
    missing = subprocess.run([sys.executable, "-m", "pipeline", "deploy", "k8s", "nope.yaml", "--out", str(out)],
                             cwd=REPO, capture_output=True, text=True, check=False)
    assert missing.returncode == 1 and "nope.yaml" in missing.stderr


def test_quantities_are_checked_when_the_options_are_made() -> None:
    with pytest.raises(ConfigError, match=r"^CPU request 'lots' is not a Kubernetes quantity \(e\.g\. 500m or 2\)$"):
        Resources(cpu_request="lots")
    with pytest.raises(ConfigError, match=r"^memory limit '2GB' is not a Kubernetes quantity"):
        Resources(memory_limit="2GB")
    assert Resources("250m", "512Mi", "1.5Gi", cpu_limit="2").manifest()["limits"] == {"cpu": "2", "memory": "1.5Gi"}


def test_a_gpu_triton_rolls_out_without_surge_onto_gpu_nodes(tmp_path: Path) -> None:
    dense = REPO / "topologies" / "dense.yaml"
    gpu = render(dense, tmp_path / "gpu", DeployOptions(
        triton_resources=Resources("2", "8Gi", "16Gi", gpus=1),
        triton_node_selector=(("nvidia.com/gpu.present", "true"),)))
    (triton,) = gpu.of("Deployment", **{"app.kubernetes.io/name": "triton"})
    # One GPU per pod: a surge pod would wait for a GPU the old pod holds, and the rollout stall.
    assert triton["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    pod = triton["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert kubernetes_validate.validate(triton, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
    cpu = render(dense, tmp_path / "cpu", DeployOptions())
    (triton,) = cpu.of("Deployment", **{"app.kubernetes.io/name": "triton"})
    assert triton["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert "tolerations" not in triton["spec"]["template"]["spec"]


def test_strimzi_topics_for_every_topic_the_topology_owns(tmp_path: Path) -> None:
    audio = REPO / "topologies" / "audio.yaml"
    case = render(audio, tmp_path / "strimzi", DeployOptions(strimzi_cluster="prod-kafka"))
    topics = case.of("KafkaTopic")
    for topic in topics:
        jsonschema.validate(topic, KAFKA_TOPIC)
    by_name = {t["spec"]["topicName"]: t["spec"] for t in topics}
    owned = [*case.topology.topics(), *case.topology.state_topics()]
    assert sorted(by_name) == sorted(set(owned))
    assert {spec["partitions"] for spec in by_name.values()} == {case.topology.kafka.partitions}
    (state,) = case.topology.state_topics()
    assert by_name[state]["config"]["cleanup.policy"] == "compact"
    assert all("cleanup.policy" not in spec["config"] for name, spec in by_name.items() if name != state)
    assert all(int(spec["config"]["max.message.bytes"]) >= 1 << 20 for spec in by_name.values())
    assert {t["metadata"]["labels"]["strimzi.io/cluster"] for t in topics} == {"prod-kafka"}
    assert "kafka-topics.yaml" in case.bundle.kustomization()["resources"]
    assert not render(audio, tmp_path / "plain", DeployOptions()).of("KafkaTopic")


def test_the_command_line_checks_quantities_and_writes_strimzi_topics(tmp_path: Path) -> None:
    def deploy(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pipeline", "deploy", "k8s", str(REPO / "topologies" / "audio.yaml"),
             "--out", str(tmp_path / "k8s"), *args],
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )

    bad = deploy("--cpu", "lots")
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1] == (
        "error: CPU request 'lots' is not a Kubernetes quantity (e.g. 500m or 2)"
    )
    good = deploy("--strimzi", "prod-kafka", "--triton-gpus", "1", "--triton-node-selector", "gpu=yes")
    assert good.returncode == 0, good.stderr
    topics = list(yaml.safe_load_all((tmp_path / "k8s" / "kafka-topics.yaml").read_text()))
    assert topics and all(t["metadata"]["labels"]["strimzi.io/cluster"] == "prod-kafka" for t in topics)
    (triton,) = [d for d in yaml.safe_load_all((tmp_path / "k8s" / "deployments.yaml").read_text())
                 if d["metadata"]["labels"]["app.kubernetes.io/name"] == "triton"]
    assert triton["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "yes"}


def test_several_triton_replicas_are_reached_through_a_headless_service(tmp_path: Path) -> None:
    """--triton-replicas 3: the Deployment runs three pods; a headless Service beside the
    normal one lists the ready ones, and the workers are pointed at its name (dns:///), which
    the stages resolve to a channel per pod (one channel to the Service sticks to one pod)."""
    from pipeline.triton.replicas import replica_spec

    fleet = render(REPO / "topologies" / "audio.yaml", tmp_path, DeployOptions(triton_replicas=3))
    (triton,) = fleet.of("Deployment", **{"app.kubernetes.io/name": "triton"})
    assert triton["spec"]["replicas"] == 3
    name = triton["metadata"]["name"]
    headless = fleet.named("Service", f"{name}-replicas")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is False
    assert headless["spec"]["selector"] == fleet.named("Service", name)["spec"]["selector"]
    assert [p["port"] for p in headless["spec"]["ports"]] == [8001]
    assert kubernetes_validate.validate(headless, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
    url = fleet.config_map(fleet.bundle.context.endpoints_config)["data"]["PIPELINE_TRITON_GRPC_URL"]
    assert url == f"dns:///{name}-replicas:8001"
    assert replica_spec(url).dns_names == ((f"{name}-replicas", 8001),)
    single = render(REPO / "topologies" / "audio.yaml", tmp_path / "one", DeployOptions())
    assert not [s for s in single.of("Service") if s["metadata"]["name"].endswith("-replicas")]


def test_triton_autoscales_on_its_queue_time_per_request(tmp_path: Path) -> None:
    """--triton-max-replicas: a KEDA ScaledObject (KEDA's documented schema) scales Triton's
    Deployment from --triton-replicas on Prometheus's mean queue time per request of this
    Triton's Service; the workers reach every pod through the headless Service."""
    options = DeployOptions(triton_replicas=1, triton_max_replicas=4, triton_queue_target_us=20_000)
    scaled = render(REPO / "topologies" / "dense.yaml", tmp_path, options)
    (triton,) = scaled.of("Deployment", **{"app.kubernetes.io/name": "triton"})
    name = triton["metadata"]["name"]
    (scaler,) = [o for o in scaled.of("ScaledObject") if o["spec"]["scaleTargetRef"]["name"] == name]
    jsonschema.validate(scaler, SCALED_OBJECT, cls=jsonschema.Draft202012Validator)
    assert (scaler["spec"]["minReplicaCount"], scaler["spec"]["maxReplicaCount"]) == (1, 4)
    (trigger,) = scaler["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "20000"
    assert f'nv_inference_queue_duration_us{{service="{name}"}}' in trigger["metadata"]["query"]
    url = scaled.config_map(scaled.bundle.context.endpoints_config)["data"]["PIPELINE_TRITON_GRPC_URL"]
    assert url == f"dns:///{name}-replicas:8001"
    with pytest.raises(ConfigError, match="--triton-max-replicas"):
        DeployOptions(triton_replicas=3, triton_max_replicas=2)


ALL_TOPOLOGIES = sorted(p.stem for p in (REPO / "topologies").glob("*.yaml"))
IMPLY_DESCRIBE = {"Read", "Write", "Delete", "Alter"}  # Kafka's authorizer: each of these allows Describe


def allows(user: dict[str, Any], kind: str, name: str, operation: str) -> bool:
    """Whether ``user``'s ``simple`` ACLs let it do ``operation`` on resource ``kind``/``name``, as
    Kafka's authorizer decides (literal or prefix match; Read, Write, Delete, Alter imply Describe)."""
    for rule in user["spec"]["authorization"]["acls"]:
        resource, operations = rule["resource"], set(rule["operations"])
        if resource["type"] != kind or rule.get("type", "allow") != "allow" or rule.get("host", "*") != "*":
            continue
        literal = resource.get("patternType", "literal") == "literal"
        if (name == resource["name"]) if literal else name.startswith(resource["name"]):
            implied = operation == "Describe" and operations & IMPLY_DESCRIBE
            if operation in operations or "All" in operations or implied:
                return True
    return False


def granted(user: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """(resource type, pattern type, name, operation) of every operation the user's rules list."""
    return {
        (rule["resource"]["type"], rule["resource"]["patternType"], rule["resource"]["name"], operation)
        for rule in user["spec"]["authorization"]["acls"]
        for operation in rule["operations"]
    }


def runtime_needs(topology: Topology, stage: Any) -> set[tuple[str, str, str, str]]:
    """What the runtime's own stage object reads, writes, joins and watches, from its parts:
    its StageIO, state store, shadow, tenant gate and upstream watch (not from pipeline.deploy)."""
    io = stage.io
    reads = {*io.input_topics, *stage.copartitioned_topics()}
    writes = {io.output_topic, io.dead_letter_topic, topology.metrics_topic}  # + the process's metric snapshots
    if (states := getattr(stage, "states", None)) is not None:
        reads.add(states.topic)
        writes.add(states.topic)
    if (shadow := getattr(stage, "shadow", None)) is not None:
        writes.add(shadow.topic)
    if (gate := getattr(stage, "_gate", None)) is not None and gate.settings.delay_topic:
        writes.add(gate.settings.delay_topic)
    settings = getattr(stage, "node", None) or getattr(stage, "settings", None)
    upstream = getattr(settings, "upstream", ())
    needs = {("topic", "literal", t, op) for t in reads for op in ("Read", "Describe")}
    needs |= {("topic", "literal", t, op) for t in writes for op in ("Write", "Describe")}
    needs |= {("group", "literal", io.group_id, op) for op in ("Read", "Describe")}
    needs |= {("group", "literal", up.group_id, "Describe") for up in upstream}
    needs |= {("topic", "literal", up.topic, op) for up in upstream for op in ("Read", "Describe")}
    if io.reply_prefix:
        needs |= {("topic", "prefix", io.reply_prefix, op) for op in ("Write", "Describe")}
    return needs


def users_by_stage(bundle: Bundle) -> dict[str, dict[str, Any]]:
    """Each generated KafkaUser by the --stage its workers run."""
    workloads = {o["metadata"]["name"]: o for o in bundle.objects if o["kind"] in ("Deployment", "StatefulSet")}
    return {container(workloads[u["metadata"]["name"]])["args"][3]: u
            for u in bundle.objects if u["kind"] == "KafkaUser"}


@pytest.mark.parametrize("name", ALL_TOPOLOGIES)
def test_strimzi_users_allow_what_the_runtime_stage_does_and_nothing_more(name: str) -> None:
    """Every topology: one KafkaUser per unit, valid against Strimzi's CRD schema, whose ACLs are
    exactly what the runtime's own stage object uses (topics read and written, its group, the
    groups and inputs it watches, the reply topics), every topic one the KafkaTopics declare."""
    bundle = generate(REPO / "topologies" / f"{name}.yaml", DeployOptions(strimzi_cluster="prod", strimzi_users=True))
    users = users_by_stage(bundle)
    stages = runtime_stages(bundle.topology)
    assert sorted(users) == sorted(s.io.stage for s in stages)
    declared = {t["spec"]["topicName"] for t in bundle.objects if t["kind"] == "KafkaTopic"}
    for stage in stages:
        user = users[stage.io.stage]
        jsonschema.validate(user, KAFKA_USER, cls=jsonschema.Draft202012Validator)
        assert user["metadata"]["labels"]["strimzi.io/cluster"] == "prod"
        assert user["spec"]["authentication"] == {"type": "scram-sha-512"}
        assert granted(user) == runtime_needs(bundle.topology, stage), stage.io.stage
        literal = {r["resource"]["name"] for r in user["spec"]["authorization"]["acls"]
                   if r["resource"]["type"] == "topic" and r["resource"]["patternType"] == "literal"}
        assert literal <= declared
    assert "kafka-users.yaml" in bundle.kustomization()["resources"]


def test_a_stage_user_reads_its_own_input_and_not_another_stages_output() -> None:
    audio = generate(REPO / "topologies" / "audio.yaml", DeployOptions(strimzi_cluster="prod", strimzi_users=True))
    preprocess, vad = users_by_stage(audio)["preprocess"], users_by_stage(audio)["vad"]
    assert allows(preprocess, "topic", "audio.chunks", "Read")
    assert allows(preprocess, "group", "audio.preprocess", "Read")
    assert allows(preprocess, "topic", "audio.preprocess.out", "Write")
    assert not allows(preprocess, "topic", "audio.results", "Read")  # vad's output, nobody's input
    assert not allows(preprocess, "topic", "audio.results", "Describe")
    assert not allows(preprocess, "topic", "audio.vad.state", "Read")  # vad's own state
    assert not allows(preprocess, "topic", "audio.chunks", "Write")  # its input is the producers' to write
    assert not allows(preprocess, "group", "audio.vad", "Read")  # cannot join another stage's group
    assert not allows(preprocess, "topic", "audio.results.reply.client-1", "Write")
    assert not allows(preprocess, "cluster", "kafka-cluster", "Create")
    assert allows(vad, "topic", "audio.preprocess.out", "Read") and allows(vad, "topic", "audio.vad.state", "Write")
    assert allows(vad, "topic", "audio.results.reply.client-1", "Write")  # the reply topics, by prefix
    assert allows(vad, "group", "audio.preprocess", "Describe") and not allows(vad, "group", "audio.preprocess", "Read")
    assert not allows(vad, "topic", "audio.results", "Read")
    ensemble = users_by_stage(generate(REPO / "topologies" / "ensemble.yaml",
                                       DeployOptions(strimzi_cluster="prod", strimzi_users=True)))
    assert allows(ensemble["classify"], "topic", "ensemble.normalise.out", "Read")
    for other in ("ensemble.score.out", "ensemble.results", "ensemble.join-result.state"):
        assert not allows(ensemble["classify"], "topic", other, "Read"), other


def test_a_client_user_writes_requests_and_owns_only_its_reply_topic() -> None:
    """`--strimzi-client alice`: the KafkaUser a request-reply client logs in as, with the same
    rules `pipeline deploy acls --client alice` creates (checked against a real broker in
    tests/integration/test_kafka_acls.py)."""
    bundle = generate(REPO / "topologies" / "audio.yaml",
                      DeployOptions(strimzi_cluster="prod", strimzi_clients=("alice", "bob")))
    users = {m["metadata"]["name"]: m for m in bundle.objects if m["kind"] == "KafkaUser"}
    assert set(users) == {"alice", "bob"}, "no stage users without --strimzi-users"
    alice = users["alice"]
    jsonschema.validate(alice, KAFKA_USER)
    assert alice["metadata"]["labels"]["strimzi.io/cluster"] == "prod"
    assert allows(alice, "topic", "audio.chunks", "Write")
    assert allows(alice, "topic", "audio.results.reply.alice", "Read")
    assert allows(alice, "topic", "audio.results.reply.alice", "Create")
    assert not allows(alice, "topic", "audio.results.reply.bob", "Read")
    assert not allows(alice, "topic", "audio.results.reply.bob", "Describe")
    assert not allows(alice, "topic", "audio.results", "Read")
    assert not allows(alice, "topic", "audio.dead-letters", "Read")
    assert not allows(alice, "topic", "audio.chunks", "Read")
    with pytest.raises(ConfigError, match="--strimzi-client needs --strimzi"):
        DeployOptions(strimzi_clients=("alice",))
    with pytest.raises(ConfigError, match="a KafkaUser's name"):
        DeployOptions(strimzi_cluster="prod", strimzi_clients=("Alice_1",))


def test_the_kafkauser_schema_refuses_what_strimzi_would_not_take() -> None:
    rule = {"resource": {"type": "topic", "name": "t", "patternType": "literal"}, "operations": ["Read"], "host": "*"}

    def user(acl: dict[str, Any] = rule, **spec: Any) -> dict[str, Any]:
        body = {"authentication": {"type": "scram-sha-512"}, "authorization": {"type": "simple", "acls": [acl]}, **spec}
        return {"apiVersion": "kafka.strimzi.io/v1", "kind": "KafkaUser",
                "metadata": {"name": "u", "labels": {"strimzi.io/cluster": "c"}}, "spec": body}

    jsonschema.validate(user(), KAFKA_USER)
    jsonschema.validate(user(authentication={"type": "tls"}), KAFKA_USER)
    wrong = [
        user({**rule, "operations": ["read"]}),  # operations are capitalised
        user({**rule, "operations": ["Consume"]}),
        user({**rule, "resource": {"type": "user", "name": "t"}}),
        user({**rule, "resource": {"type": "topic", "name": "t", "patternType": "prefixed"}}),
        user({**rule, "resource": {"name": "t"}}),  # the resource type is required
        user({"resource": rule["resource"], "operation": "Read"}),  # v1beta2's single operation, gone in v1
        user(authentication={"type": "scram-sha-256"}),  # Strimzi's users are SCRAM-SHA-512 only
        user(authorization={"type": "opa", "acls": []}),
        user(authorization={"type": "simple"}),  # acls required
        {**user(), "metadata": {"name": "u", "labels": {}}},  # no cluster label: the operator ignores it
    ]
    for obj in wrong:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(obj, KAFKA_USER)


def test_workers_log_in_as_their_own_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--strimzi-users: each worker's SCRAM username is its unit's KafkaUser, the password only a
    reference to the Secret the User Operator writes under that name (key ``password``), over
    TLS trusting the cluster CA; the variables are the runtime's own Kafka settings."""
    options = DeployOptions(strimzi_cluster="prod", strimzi_users=True, kafka_bootstrap="prod-kafka-bootstrap:9093",
                            keda_auth="kafka-scaler")
    case = render(REPO / "topologies" / "audio.yaml", tmp_path / "tls", options)
    assert case.bundle.notes == []
    users = {u["metadata"]["name"] for u in case.of("KafkaUser")}
    assert {d["metadata"]["name"] for d in case.workers()} == users
    for deployment in case.workers():
        assert kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
        spec, name = container(deployment), deployment["metadata"]["name"]
        env = {e["name"]: e for e in spec["env"]}
        assert env["PIPELINE_KAFKA_SASL_PASSWORD"]["valueFrom"] == {"secretKeyRef": {"name": name, "key": "password"}}
        assert "value" not in env["PIPELINE_KAFKA_SASL_PASSWORD"]
        plain = {k: e["value"] for k, e in env.items() if "value" in e}
        assert plain["PIPELINE_KAFKA_SASL_USERNAME"] == name
        mounts = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes["kafka-ca"]["secret"]["secretName"] == "prod-cluster-ca-cert"
        assert plain["PIPELINE_KAFKA_SSL_CAFILE"] == f"{mounts['kafka-ca']}/ca.crt"
        for key, value in plain.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("PIPELINE_KAFKA_SASL_PASSWORD", secrets.token_hex(16))  # what the Secret holds
        settings = KafkaSettings()
        assert (settings.security_protocol, settings.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
        assert settings.sasl_username == name and settings.ssl_cafile == "/etc/kafka-ca/ca.crt"
    plain_options = DeployOptions(strimzi_cluster="prod", strimzi_users=True, strimzi_tls=False, static_membership=True)
    plaintext = render(REPO / "topologies" / "audio.yaml", tmp_path / "plain", plain_options)
    for workers in plaintext.of("StatefulSet", **WORKER):
        env = {e["name"]: e.get("value") for e in container(workers)["env"]}
        assert env["PIPELINE_KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT" and "PIPELINE_KAFKA_SSL_CAFILE" not in env
        assert "PIPELINE_KAFKA_GROUP_INSTANCE_ID" in env
        assert "kafka-ca" not in {v["name"] for v in workers["spec"]["template"]["spec"]["volumes"]}
    assert plaintext.bundle.notes == [
        "--strimzi-users: the workers log in at kafka:9092; give --kafka-bootstrap prod-kafka-bootstrap:PORT, "
        "the listener with scram-sha-512 authentication",
        "--strimzi-users: KEDA's Kafka scaler needs credentials too: --keda-auth NAME (a TriggerAuthentication; "
        "docs/deployment.md)",
    ]
    without = render(REPO / "topologies" / "audio.yaml", tmp_path / "topics", DeployOptions(strimzi_cluster="prod"))
    assert without.of("KafkaTopic") and not without.of("KafkaUser")
    assert not (without.folder / "kafka-users.yaml").exists()
    for deployment in without.workers():
        assert "PIPELINE_KAFKA_SASL_USERNAME" not in {e["name"] for e in container(deployment)["env"]}


def test_strimzi_users_need_a_cluster_and_leave_the_workloads_secrets_alone(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--strimzi-users needs --strimzi CLUSTER$"):
        DeployOptions(strimzi_users=True)
    base = yaml.safe_load((REPO / "topologies" / "dense.yaml").read_text())
    clash = variant(tmp_path, "dense", name="pipeline", stages=[{**base["stages"][0], "name": "credentials"}])
    with pytest.raises(ConfigError, match="KafkaUser 'pipeline-credentials' would overwrite the Secret of --secret"):
        generate(clash, DeployOptions(strimzi_cluster="prod", strimzi_users=True))
    renamed = "dense-keys"  # the name of a Secret, not a value
    generate(clash, DeployOptions(strimzi_cluster="prod", strimzi_users=True, secret=renamed))


def test_triton_tolerations_take_kubectl_taint_syntax(tmp_path: Path) -> None:
    gpu_taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert toleration("nvidia.com/gpu:NoSchedule") == gpu_taint
    assert toleration("dedicated=gpu-pool:NoExecute") == {
        "key": "dedicated", "operator": "Equal", "value": "gpu-pool", "effect": "NoExecute"}
    assert toleration("example.com/tier=:PreferNoSchedule")["value"] == ""
    for bad in ("nvidia.com/gpu", "nvidia.com/gpu:NoScheduling", "=gpu:NoSchedule", "a b:NoSchedule",
                "gpu=x y:NoSchedule", "a:b:NoSchedule", ":NoSchedule", "Example.com/gpu:NoSchedule"):
        with pytest.raises(ConfigError, match=rf"^--triton-toleration {re.escape(repr(bad))}: expected "
                           r"KEY\[=VALUE\]:EFFECT with EFFECT one of NoSchedule, PreferNoSchedule, NoExecute "
                           r"\(e\.g\. nvidia\.com/gpu:NoSchedule\)$"):
            toleration(bad)
    gpu = render(REPO / "topologies" / "dense.yaml", tmp_path / "gpu", DeployOptions(
        triton_resources=Resources("2", "8Gi", "16Gi", gpus=1),
        triton_tolerations=(toleration("dedicated=gpu:NoSchedule"), toleration("nvidia.com/gpu:NoExecute"))))
    (triton,) = gpu.of("Deployment", **{"app.kubernetes.io/name": "triton"})
    assert kubernetes_validate.validate(triton, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
    assert triton["spec"]["template"]["spec"]["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
    ]
    cpu = generate(REPO / "topologies" / "dense.yaml", DeployOptions(triton_tolerations=(toleration("a:NoSchedule"),)))
    assert cpu.notes == ["--triton-node-selector and --triton-toleration apply to a GPU Triton only (--triton-gpus N)"]


def test_the_command_line_takes_tolerations_and_strimzi_users(tmp_path: Path) -> None:
    def deploy(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pipeline", "deploy", "k8s", str(REPO / "topologies" / "audio.yaml"),
             "--out", str(tmp_path / "k8s"), *args],
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )

    bad = deploy("--triton-gpus", "1", "--triton-toleration", "nvidia.com/gpu")
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "error: --triton-toleration 'nvidia.com/gpu': expected KEY[=VALUE]:EFFECT with EFFECT one of "
        "NoSchedule, PreferNoSchedule, NoExecute (e.g. nvidia.com/gpu:NoSchedule)"
    ]
    good = deploy("--triton-gpus", "1", "--triton-toleration", "dedicated=gpu:NoSchedule",
                  "--triton-toleration", "nvidia.com/gpu:NoSchedule", "--strimzi", "prod", "--strimzi-users",
                  "--no-strimzi-tls")
    assert good.returncode == 0, good.stderr
    deployments = list(yaml.safe_load_all((tmp_path / "k8s" / "deployments.yaml").read_text()))
    (triton,) = [d for d in deployments if d["metadata"]["labels"]["app.kubernetes.io/name"] == "triton"]
    assert [t["key"] for t in triton["spec"]["template"]["spec"]["tolerations"]] == ["dedicated", "nvidia.com/gpu"]
    users = list(yaml.safe_load_all((tmp_path / "k8s" / "kafka-users.yaml").read_text()))
    assert sorted(u["metadata"]["name"] for u in users) == ["audio-preprocess", "audio-vad"]
    assert "note: --strimzi-users: KEDA's Kafka scaler needs credentials too" in good.stdout


def test_a_strimzi_cluster_name_that_is_a_flag_is_refused_in_one_line() -> None:
    """``--strimzi --strimzi-users`` took the flag as the cluster's name and wrote KafkaTopics
    labelled ``strimzi.io/cluster: --strimzi-users`` (found trying the command, 2026-11-27)."""
    from pipeline.deploy.options import DeployOptions

    with pytest.raises(ConfigError, match="--strimzi '--strimzi-users': a Strimzi cluster's name"):
        DeployOptions(strimzi_cluster="--strimzi-users")
    DeployOptions(strimzi_cluster="prod-kafka")  # a name is taken


def test_strimzi_topics_carry_the_topologys_topic_configs(tmp_path: Path) -> None:
    doc = yaml.safe_load((REPO / "topologies" / "dense.yaml").read_text())
    doc.setdefault("kafka", {}).update(replication_factor=3, topic_configs={"min.insync.replicas": 2})
    path = tmp_path / "replicated.yaml"
    path.write_text(yaml.safe_dump(doc))
    case = render(path, tmp_path / "strimzi", DeployOptions(strimzi_cluster="prod-kafka"))
    specs = [t["spec"] for t in case.of("KafkaTopic")]
    assert specs and all(s["replicas"] == 3 and s["config"]["min.insync.replicas"] == "2" for s in specs)
    assert all(int(s["config"]["max.message.bytes"]) >= 1 << 20 for s in specs)  # the pipeline's own, kept
