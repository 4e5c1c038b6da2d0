"""``pipeline run TOPOLOGY``: serve a topology's stages, in this process or in N supervised ones."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from pipeline.cli.announce import Announcer
from pipeline.cli.app import app
from pipeline.cli.connection import announce, connection_options, endpoints_text, given
from pipeline.embedded.stack import EmbeddedStack, default_broker
from pipeline.endpoints import (
    clear_stack_state,
    embedded_allowed,
    read_stack_state,
    resolve_endpoints,
    write_stack_state,
)
from pipeline.extras import require_for_topology
from pipeline.kafka import explicit_topics
from pipeline.observability.logging import LogSettings, configure_logging
from pipeline.runtime.event_loop import EventLoopName, chosen_event_loop, run_on_event_loop
from pipeline.runtime.gc_tuning import tune_gc
from pipeline.runtime.health import DEFAULT_HOST, DEFAULT_PORT
from pipeline.runtime.runner import RunningProcess, health_port, run_topology
from pipeline.runtime.summary import StartupSummary
from pipeline.runtime.supervisor import Supervisor
from pipeline.settings import Endpoints
from pipeline.topology.loader import load_topology
from pipeline.topology.model import Topology

_SUPERVISOR_MARGIN_S = 15.0
"""A child's start-up and close on top of its drain, before the supervisor kills it."""


def endpoints_for(topology: Topology, say: Announcer) -> tuple[Endpoints, EmbeddedStack | None]:
    """The topology's own endpoints, else the environment, else a running `pipeline up`.

    With nothing configured anywhere, an embedded stack is started for this
    run (and stopped with it): the zero-configuration default, refused with
    ``--no-embedded``/``PIPELINE_NO_EMBEDDED=1``. A ``-b``/``--triton`` flag wins
    over the topology's endpoint.
    """
    endpoints = Endpoints()
    flags = given()
    if topology.kafka.bootstrap_servers and not flags.bootstrap_server:
        endpoints.kafka.bootstrap_servers = topology.kafka.bootstrap_servers
    if topology.triton.grpc_url and not flags.triton:
        endpoints.triton.grpc_url = topology.triton.grpc_url
    if endpoints.kafka.configured and endpoints.triton.configured:
        return endpoints, None
    stack_running = embedded_allowed() and read_stack_state() is not None
    if stack_running or endpoints.kafka.configured or endpoints.triton.configured or not embedded_allowed():
        resolved = resolve_endpoints(need=("kafka", "triton"))
        if endpoints.kafka.configured:
            resolved.kafka = endpoints.kafka
        if endpoints.triton.configured:
            resolved.triton = endpoints.triton
        return resolved, None
    stack = EmbeddedStack(broker=default_broker())
    with say.status("no endpoints configured: starting the embedded stack") as progress:
        stack.start(progress=progress)
    write_stack_state(stack.endpoints.environment(), stack.log_dir)  # `produce`/`consume` find it
    say.say(f"embedded stack up (logs in {stack.log_dir}); other `pipeline` commands use it")
    return stack.endpoints, stack


def _say_endpoints(endpoints: Endpoints, say: Announcer) -> None:
    """The endpoints line: first on stderr in text mode, a log record in JSON mode."""
    text = endpoints_text(kafka=endpoints.kafka, triton=endpoints.triton, s3=endpoints.s3)
    if say.json:
        say.say(text)
    else:
        announce(text)  # printed before the next line: a failure before one prints its error alone


def _url_host(host: str) -> str:
    """Where a person on this machine reaches a server bound to ``host``."""
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


@app.command()
@connection_options(kafka=True, triton=True, s3=True)
def run(
    topology_file: Path = typer.Argument(..., metavar="TOPOLOGY", help="Topology YAML file."),
    stage: list[str] = typer.Option(
        [],
        "--stage",
        help="Run only this stage; repeatable (scale out: more processes, same consumer groups).",
    ),
    processes: int = typer.Option(
        1,
        "--processes",
        min=1,
        help="Worker processes on this host (same consumer groups); above 1 this command supervises "
        "them and restarts a crashed one. Process i serves health/metrics on --http-port + i.",
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
        help="Address /livez, /readyz and /metrics listen on; 0.0.0.0 for probes from outside (Kubernetes).",
    ),
    log_level: str = typer.Option(
        "info", "--log-level", help="debug, info, warning or error; libraries log only warnings unless debug."
    ),
    log_format: str = typer.Option("text", "--log-format", help="text, or json: one JSON object per line."),
    process_index: int = typer.Option(0, "--process-index", hidden=True),
    process_count: int = typer.Option(1, "--process-count", hidden=True),
    standby: bool = typer.Option(False, "--standby", hidden=True),
) -> None:
    """Run a topology: consume its request topic, infer through Triton, produce results.

    Creates missing topics, checks each model is ready before its stage
    consumes, and on SIGTERM/Ctrl-C finishes in-flight work, commits and exits 0.
    Serves on uvloop's event loop (PIPELINE_EVENT_LOOP=asyncio for asyncio's own).
    """
    logs = LogSettings(log_level.lower(), log_format)
    configure_logging(logs)
    say = Announcer(logs.json)
    loop = chosen_event_loop()
    topology = load_topology(topology_file)
    require_for_topology(topology, stage)  # a missing extra (DALI) fails before the stack starts
    if standby:  # a supervisor's warm spare: imported and loaded, it waits to be told who it is
        index = _activation()
        if index is None:
            return
        process_index, http_port = index, (http_port + index if http_port else http_port)
    endpoints, stack = endpoints_for(topology, say)
    _say_endpoints(endpoints, say)
    port = health_port(topology, http_port)  # --http-port, else the topology's, else DEFAULT_PORT
    code = 0
    try:
        if processes > 1:
            code = _supervise(topology_file, topology, endpoints, processes, port, stage, health_host, logs, say, loop)
        else:
            _serve(topology, endpoints, stage, port, health_host, say, process_index, process_count, loop)
    finally:
        if stack is not None:
            stack.stop()
            clear_stack_state()
    if code:
        raise typer.Exit(code)
    say.say(
        "stopped cleanly" if process_count == 1 else f"process {process_index + 1} of {process_count} stopped cleanly"
    )


def _serve(
    topology: Topology,
    endpoints: Endpoints,
    stage: list[str],
    port: int,
    health_host: str,
    say: Announcer,
    index: int,
    count: int,
    loop: EventLoopName,
) -> None:
    """This process runs the stages; process ``index`` of ``count`` under a supervisor."""

    def ready(process: RunningProcess) -> None:
        url = f"http://{_url_host(health_host)}:{process.health_port}/metrics"
        ios = [s.io for s in process.stages or []]
        summary = StartupSummary.of(topology, ios, endpoints, url, process=index + 1, processes=count)
        say.summary(summary, full=index == 0)

    endpoints = endpoints.model_copy(update={"kafka": endpoints.kafka.for_process(index, count)})
    tune_gc()  # the collector a stage runs best with (pipeline/runtime/gc_tuning.py)
    explicit_topics.install()  # a worker never creates a topic by naming it (a client's deleted reply topic)
    run_on_event_loop(
        run_topology(topology, endpoints, only_stages=stage, http_port=port, http_host=health_host, on_ready=ready),
        loop,
    )


def _activation() -> int | None:
    """The process index a supervisor gives its standby on stdin; None at EOF (not needed)."""
    line = sys.stdin.readline()
    return int(line) if line.strip() else None


def _supervise(
    topology_file: Path,
    topology: Topology,
    endpoints: Endpoints,
    count: int,
    port: int,
    stage: list[str],
    health_host: str,
    logs: LogSettings,
    say: Announcer,
    loop: EventLoopName,
) -> int:
    """Start ``count`` children of this command (one process each), keep them running."""

    def argv(index: int) -> list[str]:
        child_port = port + index if port else 0  # 0: each child picks a free one
        args = [sys.executable, "-m", "pipeline", "run", str(topology_file), "--processes", "1"]
        args += ["--http-port", str(child_port), "--health-host", health_host]
        args += ["--log-level", logs.level, "--log-format", logs.format]
        args += ["--process-index", str(index), "--process-count", str(count)]
        for name in stage:
            args += ["--stage", name]
        return args

    ports = f"ports {port}-{port + count - 1}" if port else "free ports"
    say.say(f"supervisor (pid {os.getpid()}): {count} processes of topology {topology.name}, health/metrics on {ports}")
    # Children talk to exactly what this process resolved (an embedded stack included).
    env = {**os.environ, **endpoints.environment()}
    supervisor = Supervisor(
        argv, count, env=env, stop_timeout_s=topology.drain_timeout_s + _SUPERVISOR_MARGIN_S,
        standby_argv=[*argv(0), "--standby"],
    )  # fmt: skip
    return run_on_event_loop(supervisor.run(), loop)
