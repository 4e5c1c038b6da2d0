"""``pipeline bench TOPOLOGY``: perf_analyzer for a running topology.

Turns flags into a :class:`~pipeline.tools.bench.plan.Plan`, connects both
paths, runs the sweep (:mod:`pipeline.tools.bench`) with progress on stderr,
then prints the table and writes ``--json`` / ``--plot``. Heavy imports happen
inside the command, so ``pipeline --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.app import app, console, console_err
from pipeline.cli.connection import announce, connection_options, endpoints_text, load_target
from pipeline.errors import ConfigError, PipelineError
from pipeline.extras import MATPLOTLIB, require

if TYPE_CHECKING:
    from pipeline.tools.bench.plan import Plan
    from pipeline.tools.bench.sweep import SweepResult
    from pipeline.tools.bench.workload import Workload
    from pipeline.tools.target import Target


@app.command()
@connection_options(kafka=True, triton=True)
def bench(
    topology: Annotated[
        Path,
        typer.Argument(
            metavar="TOPOLOGY", help="The topology file of the running topology to measure.", show_default=False
        ),
    ],
    concurrency: Annotated[
        str | None,
        typer.Option("--concurrency", help="Closed-loop sweep: requests in flight per step, e.g. 1,4,16 (default)."),
    ] = None,
    rate: Annotated[
        str | None, typer.Option("--rate", help="Open-loop sweep: requests per second per step, e.g. 500,1000,2000.")
    ] = None,
    duration: Annotated[float, typer.Option("--duration", min=0.1, help="Seconds each step sends requests.")] = 10.0,
    warmup: Annotated[
        float, typer.Option("--warmup", min=0.0, help="Seconds of unmeasured load first, at the first level.")
    ] = 2.0,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds after which a request with no result counts as missing.")
    ] = 30.0,
    direct: Annotated[
        bool, typer.Option("--direct/--no-direct", help="Also call Triton directly at every step, for comparison.")
    ] = True,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write every number to this JSON file.")] = None,
    plot_path: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG of latency against throughput to this file.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random requests.")] = 0,
    length: Annotated[int, typer.Option("--length", min=1, help="Size of variable (-1) dimensions.")] = 16,
) -> None:
    """Measure a running topology: throughput and latency percentiles per load step.

    Start the topology first (`pipeline run TOPOLOGY`). Each step sends random
    requests shaped by the first stage's model to the input topic and times
    each until its result arrives (matched by correlation id, decoded and
    shape-checked; dead letters and missing results count as errors), then
    makes the same calls directly to Triton for comparison. Ctrl-C stops with
    the steps done so far. Exit status 1 when any request was not verified.
    """
    from pipeline.tools.bench.plan import make_plan

    plan = make_plan(
        concurrency=concurrency, rate=rate, duration_s=duration, warmup_s=warmup, timeout_s=timeout, direct=direct
    )
    for path, flag in ((json_path, "--json"), (plot_path, "--plot")):
        if path is not None and not path.parent.is_dir():
            raise ConfigError(f"{flag} {path}: folder {path.parent} does not exist")
    if plot_path is not None:
        require("pipeline bench --plot", MATPLOTLIB)  # before the sweep, not after it
    if not topology.is_file():
        raise ConfigError(f"{topology}: no such file")
    target = load_target(topology)
    if target.model is None:
        raise ConfigError(f"{topology}: its first stage has no Triton model to generate requests for")
    announce(endpoints_text(kafka=target.kafka(), triton=target.triton(), target=target))
    workload = _workload(target, seed, length)
    title = _title(target, workload)
    # aiokafka logs connection failures itself; the one-line error says it once.
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())
    result = asyncio.run(_measure(target, workload, plan))
    console.print(_table(result, title))
    _write(result, target, workload, json_path, plot_path, title)
    if result.interrupted:
        console_err.print(f"interrupted: {len(result.steps)} of {len(plan.steps)} step(s) done", highlight=False)
        raise SystemExit(130)
    if result.errors:
        total = sum(step.pipeline.requests for step in result.steps)
        first = next(s.pipeline.first_error for s in result.steps if s.pipeline.first_error)
        raise PipelineError(f"{result.errors} of {total} request(s) through the pipeline not verified (first: {first})")


def _workload(target: Target, seed: int, length: int) -> Workload:
    from pipeline.tools.bench.workload import Workload
    from pipeline.triton.admin import TritonAdmin

    assert target.model is not None
    with TritonAdmin(target.triton()) as admin:
        described = admin.describe(target.model, target.model_version)
    return Workload.random(described, seed=seed, length=length)


def _title(target: Target, workload: Workload) -> str:
    assert target.topology is not None
    topology = target.topology
    return (
        f"topology {topology.name}: {topology.input_topic} -> {topology.result_topic}; "
        f"direct: Triton model {workload.model.name}, {workload.rows} row(s) per request"
    )


async def _measure(target: Target, workload: Workload, plan: Plan) -> SweepResult:
    from pipeline.tools.bench.direct import DirectPath
    from pipeline.tools.bench.kafka_path import KafkaPath
    from pipeline.tools.bench.sweep import run_sweep
    from pipeline.tools.signals import stop_on_signals

    kafka = KafkaPath(target.kafka(), target.input_topic(None), target.output_topics(None), workload, plan.timeout_s)
    triton = DirectPath(target.triton(), workload, target.model_version, plan.timeout_s) if plan.direct else None
    stop = asyncio.Event()
    try:
        with stop_on_signals(stop), _progress() as progress:
            progress("connecting to Kafka")
            await kafka.start()
            result = await run_sweep(plan, kafka.call, triton.call if triton else None, stop, progress)
            result.unmatched = kafka.unmatched
            if result.steps:
                progress("reading the stages' metrics snapshots")
                await _read_stages(target, result)
            return result
    finally:
        await kafka.close()
        if triton is not None:
            await triton.close()


async def _read_stages(target: Target, result: SweepResult) -> None:
    """Give each step what the stages saw during it; a metrics topic that cannot be read
    leaves them without (said once, in ``stages_unavailable``), never fails the benchmark."""
    from pipeline.tools.bench.stages import read_snapshots

    topology = target.topology
    assert topology is not None
    try:
        log = await read_snapshots(
            target.kafka(),
            topology.metrics_topic,
            topology.name,
            topology.metrics_interval_s,
            since_ms=result.steps[0].started_ms,
        )
    except Exception as e:  # noqa: BLE001 - any failure here only costs the stage columns
        result.stages_unavailable = str(e) or type(e).__name__
        return
    for step in result.steps:
        step.stages = log.step(step.started_ms, step.ended_ms)


@contextmanager
def _progress() -> Iterator[Callable[[str], None]]:
    """A live status line on a terminal; else one plain line per phase on stderr."""
    if not console_err.is_terminal:
        yield lambda text: print(text, file=sys.stderr, flush=True)
        return
    with console_err.status("starting") as status:
        yield lambda text: status.update(text)


def _table(result: SweepResult, title: str) -> object:
    from pipeline.tools.bench.report import sweep_tables

    return sweep_tables(result, title=title)


def _write(
    result: SweepResult,
    target: Target,
    workload: Workload,
    json_path: Path | None,
    plot_path: Path | None,
    title: str,
) -> None:
    from pipeline.tools.bench.plot import write_plot
    from pipeline.tools.bench.report import sweep_json

    assert target.topology is not None
    if json_path is not None:
        about = {
            "topology": target.topology.name,
            "input_topic": target.topology.input_topic,
            "result_topic": target.topology.result_topic,
            "model": workload.model.name,
            "rows_per_request": workload.rows,
            "metrics_topic": target.topology.metrics_topic,
            "metrics_interval_s": target.topology.metrics_interval_s,
        }
        json_path.write_text(json.dumps(sweep_json(result, **about), indent=2))
        console_err.print(f"numbers written to {json_path}", highlight=False)
    if plot_path is not None:
        if result.steps:
            write_plot(result, plot_path, title=title)
            console_err.print(f"plot written to {plot_path}", highlight=False)
        else:
            console_err.print(f"no step completed: no plot written to {plot_path}", highlight=False)
