"""``pipeline top``: watch a running topology's stages, live, from its metrics topic.

On a terminal the frame refreshes in place (:class:`rich.live.Live`) until Ctrl-C,
which ends it with exit 0 and the cursor restored. Not on a terminal (a pipe, a log,
CI) each frame is printed as plain lines followed by a blank line; ``--once`` prints
one frame and exits. The numbers and how they are computed: :mod:`pipeline.tools.top`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.app import app, console
from pipeline.cli.connection import announce, connection_options, endpoints_text, load_target, required_topology

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.live import Live

    from pipeline.tools.target import Target
    from pipeline.tools.top.book import Frame

_QUIT = "Ctrl-C to quit"


@app.command()
@connection_options(kafka=True)
def top(
    topology_file: Annotated[
        Path | None, typer.Argument(metavar="TOPOLOGY", help="Topology file: read its metrics topic.", show_default=False)
    ] = None,
    topology_option: Annotated[
        Path | None, typer.Option("--topology", hidden=True, help="Deprecated: give TOPOLOGY as the argument.")
    ] = None,
    interval: Annotated[
        float | None,
        typer.Option(
            "--interval",
            min=0.1,
            help="Seconds between screen refreshes (default: the topology's metrics_interval_s, at most 5).",
        ),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Print one frame as plain text and exit.")] = False,
) -> None:
    """Watch a running topology's stages, live, from its metrics topic.

    Per stage: request rate, totals, consumer lag, pending records, p50/p99 end-to-end
    latency, mean batch size, Triton time and dead letters by class, summed over the
    stage's processes. Rates and latencies cover the last metrics interval; processes
    silent for 3 intervals are marked stale and left out.
    """
    target = load_target(required_topology(topology_file, topology_option))
    assert target.topology is not None
    announce(endpoints_text(kafka=target.kafka(), target=target))
    refresh = interval if interval is not None else min(target.topology.metrics_interval_s, 5.0)
    live = not once and console.is_terminal and not console.is_dumb_terminal
    asyncio.run(_top(target, refresh, once, live))


async def _top(target: Target, refresh: float, once: bool, live: bool) -> None:
    from rich.live import Live

    from pipeline.tools.signals import stop_on_signals
    from pipeline.tools.top.session import run_top

    assert target.topology is not None
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())  # the one-line error says it once
    stop = asyncio.Event()
    with stop_on_signals(stop):
        if not live:
            await run_top(target.topology, target.kafka(), refresh_s=refresh, once=once, show=_print_plain, stop=stop)
            return
        with Live(console=console, auto_refresh=False, transient=False) as screen:
            await run_top(
                target.topology, target.kafka(), refresh_s=refresh, once=False, show=_updater(screen), stop=stop
            )


def _print_plain(frame: Frame) -> None:
    from pipeline.tools.top.view import plain_lines

    sys.stdout.write("\n".join(plain_lines(frame)) + "\n\n")
    sys.stdout.flush()


def _updater(screen: Live) -> Callable[[Frame], None]:
    from pipeline.tools.top.view import rich_frame

    def show(frame: Frame) -> None:
        screen.update(rich_frame(frame, _QUIT), refresh=True)

    return show
