"""From a topology file to a kustomize base on disk.

The topology is read as the pods will read it: with the environment their ConfigMap gives
them, not the generating shell's (which may hold credentials, or a ``KAFKA_BOOTSTRAP`` meant
for a laptop). Values the topology fixes itself (``kafka.bootstrap_servers``,
``triton.grpc_url``) win in the pods, so they are what the ConfigMap records too, and a
command-line value contradicting one is an error rather than a setting the workers would
ignore.

The base: one file per object kind, the topology file itself, and ``kustomization.yaml``,
whose ``configMapGenerator`` turns the topology and the endpoint variables into ConfigMaps
with a content hash in their names, so editing either rolls the Deployments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline.deploy.keda import max_replicas, scaled_object
from pipeline.deploy.kubernetes import TOPOLOGY_FILE, WORKER_ENV, unit_objects, worker_network_policy
from pipeline.deploy.objects import DeployContext, Manifest
from pipeline.deploy.options import GPU_TOLERATION, DeployOptions
from pipeline.deploy.strimzi import client_users, kafka_topics, kafka_users
from pipeline.deploy.triton import triton_grpc_url, triton_objects
from pipeline.deploy.units import run_units
from pipeline.errors import ConfigError
from pipeline.settings import Endpoints, KafkaSettings, TritonSettings
from pipeline.topology.loader import parse_topology
from pipeline.topology.model import Topology

DEFAULT_KAFKA_BOOTSTRAP = "kafka:9092"
"""The broker's in-cluster name when neither the topology nor an option gives one."""

FILES_BY_KIND = {
    "Deployment": "deployments.yaml",
    "StatefulSet": "stateful-sets.yaml",  # stage workers with --static-membership
    "Service": "services.yaml",
    "PodDisruptionBudget": "pod-disruption-budgets.yaml",
    "NetworkPolicy": "network-policies.yaml",
    "ServiceMonitor": "service-monitors.yaml",  # needs the Prometheus Operator's CRDs
    "ScaledObject": "scaled-objects.yaml",  # needs KEDA
    "KafkaTopic": "kafka-topics.yaml",  # needs the Strimzi operator (--strimzi)
    "KafkaUser": "kafka-users.yaml",  # needs Strimzi's User Operator (--strimzi-users)
}
KUSTOMIZATION = "kustomization.yaml"


class _PlainDumper(yaml.SafeDumper):
    """Writes a shared dict (the labels of a Deployment and its pod template) out in full
    each time: manifests are read by people, who should not have to resolve ``&id001``."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _dump(documents: list[Manifest]) -> str:
    return yaml.dump_all(documents, Dumper=_PlainDumper, sort_keys=False)


@dataclass(frozen=True)
class Bundle:
    """Everything one ``pipeline deploy k8s`` writes, before it is written."""

    context: DeployContext
    environment: dict[str, str]
    """The endpoint variables (ConfigMap literals): no credential, only where things are."""
    topology_source: Path
    topology_text: str
    objects: list[Manifest]
    notes: list[str] = field(default_factory=list)

    @property
    def topology(self) -> Topology:
        return self.context.topology

    def files(self) -> dict[str, list[Manifest]]:
        """File name -> its objects, in :data:`FILES_BY_KIND` order."""
        unfiled = {o["kind"] for o in self.objects} - FILES_BY_KIND.keys()
        assert not unfiled, f"no file for {sorted(unfiled)}: add the kind to FILES_BY_KIND"
        grouped: dict[str, list[Manifest]] = {}
        for kind, name in FILES_BY_KIND.items():
            objects = [o for o in self.objects if o["kind"] == kind]
            if objects:
                grouped[name] = objects
        return grouped

    def kustomization(self) -> Manifest:
        ctx = self.context
        generator_options = {"labels": ctx.common_labels()}
        kustomization: Manifest = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
        if ctx.options.namespace:
            kustomization["namespace"] = ctx.options.namespace
        kustomization["resources"] = list(self.files())
        kustomization["configMapGenerator"] = [
            {"name": ctx.topology_config, "files": [TOPOLOGY_FILE], "options": generator_options},
            {
                "name": ctx.endpoints_config,
                "literals": [f"{key}={value}" for key, value in self.environment.items()],
                "options": generator_options,
            },
        ]
        return kustomization


def generate(topology_file: Path, options: DeployOptions) -> Bundle:
    """Read and validate ``topology_file`` as the pods will, and build every object."""
    try:
        text = topology_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read topology {topology_file}: {exc.strerror or exc}") from None
    topology, generated_triton = _load_as_in_pod(text, str(topology_file), options)
    ctx = DeployContext(topology, options)
    bootstrap = _fixed_by_topology(topology.kafka.bootstrap_servers, options.kafka_bootstrap, "kafka.bootstrap_servers",
                                   "--kafka-bootstrap") or options.kafka_bootstrap or DEFAULT_KAFKA_BOOTSTRAP
    external_triton = (
        _fixed_by_topology(topology.triton.grpc_url, options.triton_url, "triton.grpc_url", "--triton-url")
        or options.triton_url
    )
    objects: list[Manifest] = []
    for unit in run_units(topology):
        objects += unit_objects(ctx, unit)
        if options.keda:
            objects.append(scaled_object(ctx, unit))
    objects.append(worker_network_policy(ctx))
    if external_triton is None:
        objects += triton_objects(ctx)
    if options.strimzi_cluster:
        objects += kafka_topics(ctx, options.strimzi_cluster)
        if options.strimzi_users:
            objects += kafka_users(ctx, options.strimzi_cluster)
        objects += client_users(ctx, options.strimzi_cluster)
    _check_unique(objects)
    _check_user_secrets(objects, options)
    return Bundle(
        context=ctx,
        topology_source=topology_file,
        topology_text=text,
        environment=_endpoint_environment(options, bootstrap, external_triton or generated_triton),
        objects=objects,
        notes=_notes(ctx, bootstrap, external_triton),
    )


def _load_as_in_pod(text: str, source: str, options: DeployOptions) -> tuple[Topology, str]:
    """The topology under the pods' environment, and the generated Triton's gRPC address.

    Two passes: that address is named after the topology, and the environment holding it is
    what the topology's ``${VAR}`` references are expanded with.
    """
    provisional = parse_topology(text, source, _pod_environment(options, options.triton_url or ""))
    triton_url = options.triton_url or triton_grpc_url(DeployContext(provisional, options))
    return parse_topology(text, source, _pod_environment(options, triton_url)), triton_url


def write_bundle(bundle: Bundle, out: Path) -> list[tuple[Path, str]]:
    """Write the base into ``out``; returns each file written with what it holds.

    Files of kinds this run does not generate (``--no-keda`` after a run with KEDA) are
    removed, so the folder never holds objects the kustomization does not list.
    """
    out.mkdir(parents=True, exist_ok=True)
    header = f"# Generated by `pipeline deploy k8s {bundle.topology_source}`: regenerate, or patch in an overlay.\n"
    written: list[tuple[Path, str]] = []
    files = bundle.files()
    for name, objects in files.items():
        path = out / name
        path.write_text(header + _dump(objects), encoding="utf-8")
        written.append((path, ", ".join(o["metadata"]["name"] for o in objects)))
    for stale in set(FILES_BY_KIND.values()) - set(files):
        (out / stale).unlink(missing_ok=True)
    (out / TOPOLOGY_FILE).write_text(bundle.topology_text, encoding="utf-8")
    written.append((out / TOPOLOGY_FILE, f"topology {bundle.topology.name}, mounted at /config"))
    (out / KUSTOMIZATION).write_text(header + _dump([bundle.kustomization()]), encoding="utf-8")
    written.append((out / KUSTOMIZATION, "resources and ConfigMap generators"))
    return written


def _pod_environment(options: DeployOptions, triton_url: str) -> dict[str, str]:
    """The variables a worker has before its Secret's: what ``${VAR}`` in the topology sees."""
    bootstrap = options.kafka_bootstrap or DEFAULT_KAFKA_BOOTSTRAP
    return {**_endpoint_environment(options, bootstrap, triton_url), **WORKER_ENV}


def _endpoint_environment(options: DeployOptions, bootstrap: str, triton_url: str) -> dict[str, str]:
    """``PIPELINE_*`` endpoint variables, named by :meth:`Endpoints.environment` itself.

    Built with ``model_construct``, which reads no environment variable: settings read the
    generating shell's environment, where S3 keys or a SASL password may be set.
    """
    endpoints = Endpoints.model_construct(
        kafka=KafkaSettings.model_construct(bootstrap_servers=bootstrap),
        triton=TritonSettings.model_construct(grpc_url=triton_url or None),
        s3=options.s3(),
    )
    return endpoints.environment()


def _fixed_by_topology(in_topology: str | None, option: str | None, key: str, flag: str) -> str | None:
    """The topology's own value; an option saying otherwise would be ignored by the workers."""
    if in_topology and option and in_topology != option:
        raise ConfigError(f"the topology sets {key} to {in_topology!r}, which the workers use; "
                          f"{flag} {option!r} contradicts it (remove one)")
    return in_topology


def _check_unique(objects: list[Manifest]) -> None:
    """Stage names are free, so ``<topology>-<stage>`` can meet a generated name (a stage
    called ``triton``); two objects of one kind and name would silently become one."""
    seen: set[tuple[str, str]] = set()
    for obj in objects:
        key = (obj["kind"], obj["metadata"]["name"])
        if key in seen:
            raise ConfigError(f"two generated {key[0]} objects would be named {key[1]!r}: rename the stage, "
                              "or use --triton-url for a Triton of your own")
        seen.add(key)


def _check_user_secrets(objects: list[Manifest], options: DeployOptions) -> None:
    """The User Operator writes each KafkaUser's Secret under the user's name (``<topology>-<stage>``):
    it must not be a Secret the workloads read their own credentials from."""
    flags = {"--secret": options.secret, "--triton-secret": options.triton_secret}
    taken = {name: flag for flag, name in flags.items()}
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] == "KafkaUser" and name in taken:
            raise ConfigError(f"the KafkaUser {name!r} would overwrite the Secret of {taken[name]}: "
                              "rename the stage or that Secret")


def _notes(ctx: DeployContext, bootstrap: str, external_triton: str | None) -> list[str]:
    options, notes = ctx.options, list[str]()
    wanted, cap = options.max_replicas, max_replicas(ctx)
    if wanted is not None and wanted > cap:
        notes.append(f"--max-replicas {wanted} capped at {cap}: the topology's topics have {cap} partitions")
    if options.strimzi_users and bootstrap == DEFAULT_KAFKA_BOOTSTRAP:
        notes.append(f"--strimzi-users: the workers log in at {bootstrap}; give --kafka-bootstrap "
                     f"{options.strimzi_cluster}-kafka-bootstrap:PORT, the listener with scram-sha-512 authentication")
    if options.strimzi_users and options.keda and not options.keda_auth:
        notes.append("--strimzi-users: KEDA's Kafka scaler needs credentials too: --keda-auth NAME "
                     "(a TriggerAuthentication; docs/deployment.md)")
    custom = options.triton_node_selector or options.triton_tolerations != (GPU_TOLERATION,)
    if custom and external_triton is None and not options.triton_resources.gpus:
        notes.append("--triton-node-selector and --triton-toleration apply to a GPU Triton only (--triton-gpus N)")
    return notes
