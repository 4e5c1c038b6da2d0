"""``pipeline deploy k8s TOPOLOGY``: a kustomize base generated from the topology; ``pipeline
deploy acls TOPOLOGY``: its least-privilege Kafka ACLs.

Generation only, but for ``acls --apply``: nothing else here talks to a cluster. ``kubectl apply -k DIR`` applies the
result; ``kubectl kustomize DIR`` shows it. The options say where the services are and how
big things are; what runs comes from the topology (:mod:`pipeline.deploy`).
"""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.app import app, console
from pipeline.cli.connection import announce, connection_options, endpoints_text, load_target
from pipeline.cli.help import PipelineGroup
from pipeline.deploy import DeployOptions, Resources, generate, write_bundle
from pipeline.deploy.options import DEFAULT_IMAGE, TRITON_IMAGE, toleration
from pipeline.errors import ConfigError

deploy_app = typer.Typer(
    name="deploy",
    help="Generate deployment manifests from a topology (the topology stays the single source of truth).",
    no_args_is_help=True,
    cls=PipelineGroup,
)
app.add_typer(deploy_app, name="deploy")

_defaults = DeployOptions()
_stage, _triton = _defaults.stage_resources, _defaults.triton_resources


@deploy_app.command("k8s")
def k8s(
    topology_file: Annotated[Path, typer.Argument(metavar="TOPOLOGY", help="Topology YAML file.")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder to write the base into (default: k8s/<topology name>).")
    ] = None,
    image: Annotated[str, typer.Option(help="Pipeline image (the repository's Dockerfile).")] = DEFAULT_IMAGE,
    namespace: Annotated[str | None, typer.Option(help="Namespace of every object (default: kubectl's current one).")] = None,
    kafka_bootstrap: Annotated[
        str | None,
        typer.Option(help="Kafka bootstrap servers (default: the topology's, else kafka:9092)."),
    ] = None,
    s3_endpoint: Annotated[str, typer.Option(help="S3 model store, http(s)://host:port.")] = _defaults.s3_endpoint,
    s3_bucket: Annotated[str, typer.Option(help="Model bucket Triton loads from.")] = _defaults.s3_bucket,
    s3_prefix: Annotated[str, typer.Option(help="Prefix of the model repository in the bucket.")] = "",
    s3_region: Annotated[str, typer.Option(help="S3 region (AWS_DEFAULT_REGION).")] = _defaults.s3_region,
    secret: Annotated[
        str, typer.Option(help="Secret holding the workers' credentials (S3 keys, SASL), as env variables.")
    ] = _defaults.secret,
    triton_secret: Annotated[str, typer.Option(help="Secret holding Triton's read-only S3 keys.")] = _defaults.triton_secret,
    triton_image: Annotated[
        str, typer.Option(help="Triton image (default: docker/triton.Dockerfile's, which loads the sample models).")
    ] = TRITON_IMAGE,
    triton_url: Annotated[str | None, typer.Option(help="Use an existing Triton (host:port) instead of generating one.")] = None,
    triton_gpus: Annotated[int, typer.Option(help="GPUs Triton requests (nvidia.com/gpu); 0 = CPU.")] = 0,
    triton_replicas: Annotated[int, typer.Option(help="Triton pods (the least, with --triton-max-replicas).")] = _defaults.triton_replicas,
    triton_max_replicas: Annotated[
        int | None,
        typer.Option(help="Autoscale Triton up to this many pods on its queue time per request (KEDA, Prometheus)."),
    ] = None,
    triton_queue_target_us: Annotated[
        int, typer.Option(help="Queue time per request (µs) Triton's autoscaling aims at.")
    ] = _defaults.triton_queue_target_us,
    prometheus_url: Annotated[
        str,
        typer.Option(
            help="Prometheus KEDA asks for Triton's queue time (default: the Prometheus Operator's, "
            "prometheus-operated in namespace monitoring).",
            show_default=False,
        ),
    ] = _defaults.prometheus_url,
    triton_node_selector: Annotated[
        list[str] | None,
        typer.Option(metavar="KEY=VALUE", help="Node label a GPU Triton must run on; repeatable."),
    ] = None,
    triton_toleration: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY[=VALUE]:EFFECT",
            help="Taint a GPU Triton tolerates, as kubectl taint writes it (nvidia.com/gpu:NoSchedule, the "
            "default); repeatable, replaces the default.",
        ),
    ] = None,
    strimzi_cluster: Annotated[
        str | None,
        typer.Option("--strimzi", help="Strimzi Kafka cluster name: also write a KafkaTopic per topic of the topology."),
    ] = None,
    strimzi_users: Annotated[
        bool,
        typer.Option(
            help="With --strimzi: a KafkaUser per stage (SCRAM-SHA-512, ACLs on its own topics and group only), "
            "which its workers log in as.",
        ),
    ] = False,
    strimzi_client: Annotated[
        list[str] | None,
        typer.Option(
            "--strimzi-client",
            metavar="NAME",
            help="With --strimzi: a KafkaUser NAME for a request-reply client (write the requests, own reply "
            "topic <result_topic>.reply.NAME; as `pipeline deploy acls --client`); repeatable.",
        ),
    ] = None,
    strimzi_tls: Annotated[
        bool,
        typer.Option(
            help="The --strimzi-users listener has TLS: SASL_SSL, trusting the cluster CA (else SASL_PLAINTEXT).",
        ),
    ] = True,
    http_port: Annotated[int, typer.Option(help="Health and metrics port of every worker.")] = _defaults.http_port,
    cpu: Annotated[str, typer.Option(help="CPU request of a worker.")] = _stage.cpu_request,
    memory: Annotated[str, typer.Option(help="Memory request of a worker.")] = _stage.memory_request,
    memory_limit: Annotated[str, typer.Option(help="Memory limit of a worker (empty: none).")] = _stage.memory_limit or "",
    triton_cpu: Annotated[str, typer.Option(help="CPU request of Triton.")] = _triton.cpu_request,
    triton_memory: Annotated[str, typer.Option(help="Memory request of Triton.")] = _triton.memory_request,
    triton_memory_limit: Annotated[str, typer.Option(help="Memory limit of Triton (empty: none).")] = _triton.memory_limit or "",
    min_replicas: Annotated[int, typer.Option(help="Fewest workers per stage (0: KEDA may scale to zero).")] = 1,
    max_replicas: Annotated[
        int | None, typer.Option(help="Most workers per stage (default and cap: the partition count).")
    ] = None,
    lag_threshold: Annotated[
        int, typer.Option(help="KEDA's target consumer lag per worker, in records.")
    ] = _defaults.lag_threshold,
    keda: Annotated[bool, typer.Option(help="KEDA ScaledObjects (else fixed --min-replicas).")] = True,
    keda_auth: Annotated[str | None, typer.Option(help="KEDA TriggerAuthentication for a Kafka with SASL or TLS.")] = None,
    static_membership: Annotated[
        bool,
        typer.Option(help="StatefulSets whose pods are static group members named after the pod (KIP-345)."),
    ] = False,
    service_monitor: Annotated[bool, typer.Option(help="Prometheus Operator ServiceMonitors.")] = True,
    prestop_seconds: Annotated[int, typer.Option(help="Pause before SIGTERM.")] = _defaults.prestop_s,
) -> None:
    """Write a kustomize base for TOPOLOGY: a Deployment per stage, autoscaling, Triton.

    Per stage (per step and join of a graph): a Deployment (with --static-membership, a
    StatefulSet whose pods join as static members) running `pipeline run --stage`,
    with probes, a pre-stop pause and a grace period covering the drain; a
    PodDisruptionBudget; a metrics Service and ServiceMonitor; a KEDA ScaledObject on the
    stage's consumer-group lag; with --strimzi-users, a KafkaUser it logs in as. Triton
    reads the S3 model store. Apply with `kubectl apply -k DIR` after creating the Secrets.
    """
    # Every option named like a DeployOptions field is that field; the rest are assembled here.
    given = {k: v for k, v in locals().items() if k in {f.name for f in fields(DeployOptions)}}
    given["strimzi_clients"] = tuple(strimzi_client or ())
    given["triton_node_selector"] = tuple(_label(text) for text in triton_node_selector or ())
    if triton_toleration:
        given["triton_tolerations"] = tuple(toleration(text) for text in triton_toleration)
    options = DeployOptions(
        **given,
        triton_resources=Resources(triton_cpu, triton_memory, triton_memory_limit or None, gpus=triton_gpus),
        stage_resources=Resources(cpu, memory, memory_limit or None),
        prestop_s=prestop_seconds,
    )
    bundle = generate(topology_file, options)
    folder = out or Path("k8s") / bundle.topology.name
    for path, what in write_bundle(bundle, folder):
        console.print(f"wrote {path}  [dim]{what}[/]", highlight=False, soft_wrap=True)
    for note in bundle.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    console.print(f"render: kubectl kustomize {folder}    apply: kubectl apply -k {folder}", highlight=False,
                  soft_wrap=True)


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--triton-node-selector {text!r}: expected KEY=VALUE")
    return key, value


@deploy_app.command("acls")
@connection_options(kafka=True)
def acls(
    topology_file: Annotated[Path, typer.Argument(metavar="TOPOLOGY", help="Topology YAML file.")],
    clients: Annotated[
        list[str] | None,
        typer.Option(
            "--client",
            metavar="NAME",
            help="Also a request-reply client User:NAME: write the requests, use reply topic "
            "<result_topic>.reply.NAME (repeatable).",
        ),
    ] = None,
    apply_now: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Create the ACLs on the cluster (-b, -X as an admin) instead of printing kafka-acls.sh commands.",
        ),
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Compare the cluster's ACLs of these principals with these (-b, -X as an admin): print each "
            "missing and extra binding; exit 1 if any.",
        ),
    ] = False,
) -> None:
    """Least-privilege Kafka ACLs for each run unit (User:<topology>-<unit>) and each --client.

    Each unit may read its inputs and group, write its outputs, dead letters, metrics and
    state, and watch the units upstream of it; nothing else (docs/security.md). Printed as a
    shell script of kafka-acls.sh commands (it reads $BOOTSTRAP and $ADMIN_CONFIG), or, with
    --apply, created through the admin API; creating an existing ACL is harmless. --check
    lists what the cluster grants these principals beyond them, or lacks of them.
    """
    import asyncio

    from pipeline.deploy.kafka_acls import kafka_acls_script, topology_grants
    from pipeline.kafka.acl_admin import create_acls, principal_acls

    target = load_target(topology_file)
    assert target.topology is not None
    try:
        grants = topology_grants(target.topology, clients or ())
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if apply_now and check:
        raise ConfigError("choose one of --apply and --check")
    if not (apply_now or check):
        sys.stdout.write(kafka_acls_script(grants))
        return
    kafka = target.kafka()
    announce(endpoints_text(kafka=kafka, target=target))
    bindings = [binding for grant in grants for binding in grant.bindings()]
    principals = list(dict.fromkeys(grant.principal for grant in grants))
    if apply_now:
        created = asyncio.run(create_acls(kafka, bindings))
        console.print(f"created {created} ACL bindings for {len(principals)} principals", highlight=False, soft_wrap=True)
        return
    found = asyncio.run(principal_acls(kafka, principals))
    missing, extra = sorted(set(bindings) - found), sorted(found - set(bindings))
    for label, listed in (("missing", missing), ("extra", extra)):
        for b in listed:
            console.print(f"{label}: {b.principal} {b.operation} on {b.resource_type} {b.name!r} ({b.pattern})",
                          highlight=False, soft_wrap=True)
    console.print(f"{len(bindings) - len(missing)} of {len(bindings)} ACL bindings present for {len(principals)} "
                  f"principals; {len(missing)} missing, {len(extra)} extra", highlight=False, soft_wrap=True)
    if missing or extra:
        raise typer.Exit(1)
