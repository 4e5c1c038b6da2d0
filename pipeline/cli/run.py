"""``pipeline run TOPOLOGY``: serve a topology's stages."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

from pipeline.cli.app import app, console
from pipeline.embedded.stack import EmbeddedStack
from pipeline.endpoints import clear_stack_state, read_stack_state, resolve_endpoints, write_stack_state
from pipeline.errors import ConfigError
from pipeline.runtime.health import DEFAULT_HOST, DEFAULT_PORT
from pipeline.runtime.runner import RunningProcess, run_topology
from pipeline.settings import Endpoints
from pipeline.topology.loader import load_topology
from pipeline.topology.model import Topology


def endpoints_for(topology: Topology) -> tuple[Endpoints, EmbeddedStack | None]:
    """The topology's own endpoints, else the environment, else a running `pipeline up`.

    With nothing configured anywhere, an embedded stack is started for this
    run (and stopped with it): the zero-configuration default.
    """
    endpoints = Endpoints()
    if topology.kafka.bootstrap_servers:
        endpoints.kafka.bootstrap_servers = topology.kafka.bootstrap_servers
    if topology.triton.grpc_url:
        endpoints.triton.grpc_url = topology.triton.grpc_url
    if endpoints.kafka.configured and endpoints.triton.configured:
        return endpoints, None
    if read_stack_state() is not None or endpoints.kafka.configured or endpoints.triton.configured:
        resolved = resolve_endpoints(need=("kafka", "triton"))
        if endpoints.kafka.configured:
            resolved.kafka = endpoints.kafka
        if endpoints.triton.configured:
            resolved.triton = endpoints.triton
        return resolved, None
    stack = EmbeddedStack()
    with console.status("no endpoints configured: starting the embedded stack") as status:
        stack.start(progress=lambda msg: status.update(msg))
    write_stack_state(stack.endpoints.environment(), stack.log_dir)  # `produce`/`consume` find it
    console.print(f"embedded stack up (logs in {stack.log_dir}); other `pipeline` commands use it")
    return stack.endpoints, stack


def _url_host(host: str) -> str:
    """Where a person on this machine reaches a server bound to ``host``."""
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


@app.command()
def run(
    topology_file: Path = typer.Argument(..., metavar="TOPOLOGY", help="Topology YAML file."),
    stage: list[str] = typer.Option(
        [],
        "--stage",
        help="Run only this stage; repeatable (scale out: more processes, same consumer groups).",
    ),
    http_port: int = typer.Option(
        None,
        "--http-port",
        envvar="PIPELINE_HTTP_PORT",
        help=f"Port for /livez, /readyz, /metrics (default: the topology's http_port, else {DEFAULT_PORT}); "
        "0 for any free port.",
    ),
    health_host: str = typer.Option(
        DEFAULT_HOST,
        "--health-host",
        envvar="PIPELINE_HEALTH_HOST",
        help="Address /livez, /readyz and /metrics listen on; 0.0.0.0 for probes from outside "
        "(Kubernetes).",
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Run a topology: consume its request topic, infer through Triton, produce results.

    Creates missing topics, checks each model is ready before its stage
    consumes, and on SIGTERM/Ctrl-C finishes in-flight work, commits and exits 0.
    """
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise ConfigError(f"unknown log level {log_level!r}")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    topology = load_topology(topology_file)
    endpoints, stack = endpoints_for(topology)

    def ready(process: RunningProcess) -> None:
        names = ", ".join(s.io.stage for s in process.stages or [])
        console.print(
            f"topology [bold]{topology.name}[/] running stages {names}; "
            f"health/metrics on http://{_url_host(health_host)}:{process.health_port}/metrics"
        )
        console.print(f"requests: {topology.input_topic}  results: {topology.result_topic}  "
                      f"dead letters: {topology.dead_letter_topic}")

    try:
        asyncio.run(run_topology(
            topology, endpoints, only_stages=stage, http_port=http_port, http_host=health_host, on_ready=ready
        ))
    finally:
        if stack is not None:
            stack.stop()
            clear_stack_state()
    console.print("stopped cleanly")
