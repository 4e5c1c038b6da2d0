"""``pipeline validate``: check a topology file before anything runs it.

Two levels: the file itself (syntax, types, topic chain; ``--offline``), and
the file against the models a running Triton serves (names, tensors,
datatypes and shapes along the chain). Both are what a worker would trip
over at start-up or, worse, on the first record; here they cost a second.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from pipeline.cli.app import app, console, console_err
from pipeline.cli.connection import announce, connection_options, endpoints_text, given
from pipeline.errors import ConfigError
from pipeline.settings import TritonSettings
from pipeline.topology.compat import check_compatibility
from pipeline.topology.loader import load_topology
from pipeline.topology.model import DaliStageConfig, SequenceStageConfig, StatelessStageConfig, Topology
from pipeline.topology.models_phrase import describe_models
from pipeline.topology.schema import render_schema


@app.command()
@connection_options(triton=True)
def validate(
    file: Annotated[
        Path | None,
        typer.Argument(metavar="FILE", help="Topology YAML file.", show_default=False),
    ] = None,
    offline: Annotated[
        bool,
        typer.Option("--offline", help="Check the file only; do not ask Triton about the models."),
    ] = False,
    schema: Annotated[
        bool, typer.Option("--schema", help="Print the JSON schema of topology files and exit.")
    ] = False,
) -> None:
    """Validate a topology file, and its models against Triton unless --offline.

    Exit status 0 when everything checks out, 1 on any problem.
    """
    if schema:
        if file is not None:
            raise ConfigError("--schema takes no FILE")
        sys.stdout.write(render_schema())
        return
    if file is None:
        raise ConfigError("missing topology FILE (or --schema to print the schema)")
    topology = load_topology(file)
    problems: list[str] = [] if offline else _check_models(topology)
    _print_summary(topology)
    if problems:
        for problem in problems:
            console_err.print(
                f"[bold red]error:[/] {escape(f'{file}: {problem}')}",
                highlight=False,
                soft_wrap=True,
            )
        # SystemExit, not typer.Exit: `pipeline.cli.main` runs click with
        # standalone_mode=False, where typer.Exit's code would be returned, not exited with.
        raise SystemExit(1)
    note = " (offline: models not checked against Triton)" if offline else ""
    console.print(f"[bold green]ok[/]{note}", highlight=False)


def _triton_settings(topology: Topology) -> TritonSettings:
    """The topology's Triton endpoint, else the environment's, else the embedded stack's."""
    if topology.triton.grpc_url and not given().triton:
        # TLS and the other options still come from PIPELINE_TRITON_*.
        return TritonSettings().model_copy(update={"grpc_url": topology.triton.grpc_url})
    from pipeline.endpoints import resolve_endpoints

    return resolve_endpoints(need=("triton",)).triton


def _check_models(topology: Topology) -> list[str]:
    # Imported here: tritonclient and grpc are slow to import and not needed --offline.
    from pipeline.triton.admin import TritonAdmin

    settings = _triton_settings(topology)
    announce(endpoints_text(triton=settings))
    with TritonAdmin(settings) as admin:
        return check_compatibility(topology, admin.describe)


def _print_graph(topology: Topology) -> None:
    """Steps and joins of a graph topology, with the topics the graph gives them."""
    graph = topology.graph()
    for name in graph.order:
        node, stage = graph.steps[name], topology.stage(name)
        model = getattr(stage, "model", stage.kind)
        line = f"{name} ({model}): {node.input_topic} -> {node.output_topic}, group {topology.group_id(name)}"
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    for name, join in graph.joins.items():
        line = (
            f"{name} ({join.mode} join of {', '.join(join.branches)}, window {join.window_ms:.0f} ms): "
            f"{', '.join(join.input_topics)} -> {join.output_topic}"
        )
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    console.print(
        f"inputs {topology.inputs} -> outputs {topology.outputs}; topics: {escape(', '.join(topology.topics()))}",
        highlight=False,
        soft_wrap=True,
    )


def _print_summary(topology: Topology) -> None:
    """One line per stage (kind, model, topics, group), then every topic: short and greppable."""
    console.print(
        f"topology [bold]{escape(topology.name)}[/]: {len(topology.stages)} stage(s)",
        highlight=False,
    )
    if topology.is_graph:
        _print_graph(topology)
        return
    for stage, route in zip(topology.stages, topology.stage_topics(), strict=True):
        if isinstance(stage, StatelessStageConfig):
            model = describe_models(stage)
        elif isinstance(stage, SequenceStageConfig):
            model = stage.model
        else:
            assert isinstance(stage, DaliStageConfig)
            model = f"DALI on {stage.device}"
        line = (
            f"{stage.name} ({stage.kind}, {model}): {route.input} -> {route.output}, "
            f"group {topology.group_id(stage.name)}"
        )
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    if lanes := topology.resolved_lanes():
        order = " > ".join(
            f"{lane.name} ({lane.topic}" + (f", priority {lane.priority})" if lane.priority is not None else ")")
            for lane in lanes
        )
        console.print(f"lanes, read highest first: {escape(order)}", highlight=False, soft_wrap=True)
    console.print(
        f"topics: {escape(', '.join(topology.topics()))}", highlight=False, soft_wrap=True
    )
