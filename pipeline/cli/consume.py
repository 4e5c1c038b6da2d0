"""``pipeline consume``: read results and dead letters back, and say what they add up to.

The logic lives in :mod:`pipeline.tools` (reading, classifying, summarising,
rendering); this module turns flags into calls and prints. Records go to
stdout, one line each (or JSON Lines with ``--json``, the summary being the
last line, ``"kind": "summary"``); status lines go to stderr, so stdout stays
parseable. Output is plain text: no markup, no colour codes.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.app import app
from pipeline.cli.connection import announce, connection_options, endpoints_text, load_target, topology_argument
from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from aiokafka.structs import TopicPartition

    from pipeline.settings import KafkaSettings
    from pipeline.tools.consumer import ConsumeOptions, ConsumeResult
    from pipeline.tools.decoding import Consumed

#: Idle timeout when neither --timeout nor --follow is given.
DEFAULT_IDLE_S = 10.0


@app.command()
@connection_options(kafka=True)
def consume(
    topology_file: Annotated[
        Path | None,
        typer.Argument(
            metavar="TOPOLOGY", help="Topology file: read its result and dead-letter topics.", show_default=False
        ),
    ] = None,
    topology_option: Annotated[
        Path | None, typer.Option("--topology", hidden=True, help="Deprecated: give TOPOLOGY as the argument.")
    ] = None,
    topics: Annotated[
        list[str] | None, typer.Option("--topic", help="Topic to read (repeatable; overrides the topology's).")
    ] = None,
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the oldest record (default: only new ones).")
    ] = False,
    partitions: Annotated[
        list[int] | None,
        typer.Option("--partition", min=0, help="Read only this partition of each topic (repeatable)."),
    ] = None,
    offset: Annotated[
        str | None,
        typer.Option(
            "--offset",
            help="Where to start in each partition: beginning, end, an offset (negative: that many before "
            "the end), or a time (ISO 8601, or relative such as 10m).",
        ),
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", "--max-messages", min=1, help="Stop after this many records.")
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Keep reading until Ctrl-C (no idle timeout).")] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", min=0.0, help=f"Stop after this many seconds without a record (default: {DEFAULT_IDLE_S:g})."
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option("--group", help="Consumer group to join and commit in (default: none, nothing committed)."),
    ] = None,
    show: Annotated[bool, typer.Option("--show", help="Print one line per record (the default).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="Print only the summary.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON Lines: one object per record, the summary last.")
    ] = False,
    values: Annotated[int, typer.Option("--values", min=0, help="Tensor values shown per tensor; 0 = all.")] = 8,
) -> None:
    """Consume result and dead-letter records, print them, and summarise.

    The summary counts results, dead letters by error class, distinct and
    duplicate correlation ids, end-to-end latency percentiles (from the
    sent-at-ms header `pipeline produce` adds) and per-key ordering.
    """
    from pipeline.tools.consumer import ConsumeOptions, StartAt

    if sum((show, quiet, as_json)) > 1:
        raise ConfigError("choose one of --show, --quiet and --json")
    if follow and timeout is not None:
        raise ConfigError("--follow reads until Ctrl-C; it takes no --timeout")
    if (partitions or offset is not None) and group is not None:
        raise ConfigError("--partition and --offset read without a consumer group: drop --group")
    if offset is not None and from_beginning:
        raise ConfigError("--from-beginning is --offset beginning: give one")
    start = StartAt.parse(offset, now_ms=time.time_ns() // 1_000_000) if offset is not None else None
    target = load_target(topology_argument(topology_file, topology_option))
    names = target.output_topics(topics)
    options = ConsumeOptions(
        from_beginning=from_beginning,
        count=count,
        idle_timeout_s=None if follow else (DEFAULT_IDLE_S if timeout is None else timeout),
        group=group,
        partitions=tuple(partitions or ()),
        start=start,
    )
    mode = "json" if as_json else "quiet" if quiet else "show"
    kafka = target.kafka()
    announce(endpoints_text(kafka=kafka, target=target))
    asyncio.run(_consume(names, kafka, options, mode, values))


async def _consume(topics: list[str], kafka: KafkaSettings, options: ConsumeOptions, mode: str, values: int) -> None:
    from pipeline.tools import render
    from pipeline.tools.consumer import consume
    from pipeline.tools.signals import stop_on_signals
    from pipeline.tools.summary import ConsumeSummary

    # aiokafka logs connection failures itself; the one-line error says it once.
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())
    summary = ConsumeSummary()

    def on_record(record: Consumed) -> None:
        summary.add(record)
        if mode == "json":
            _out(render.json_line(render.record_json(record, values=values)))
        elif mode == "show":
            _out(render.record_line(record, values=values))

    def on_ready(assigned: list[TopicPartition], missing: list[str]) -> None:
        start = "the beginning" if options.from_beginning else "now on"
        if options.start is not None:
            at = options.start
            start = f"{at.kind} {at.value}" if at.kind in ("offset", "time") else f"the {at.kind}"
        until = []
        if options.count is not None:
            until.append(f"{options.count} records")
        until.append("Ctrl-C" if options.idle_timeout_s is None else f"{options.idle_timeout_s:g} s idle")
        _status(f"consuming {', '.join(topics)} ({len(assigned)} partitions) from {start}, until {' or '.join(until)}")
        if missing:
            _status(f"no partitions of {', '.join(missing)} (yet): does the topic exist?")

    started = time.monotonic()
    stop = asyncio.Event()
    with stop_on_signals(stop):
        result = await consume(
            topics,
            settings=kafka,
            options=options,
            on_record=on_record,
            on_ready=on_ready,
            stop=stop,
        )
    elapsed = time.monotonic() - started
    _status(_stopped_text(result, options))
    if mode == "json":
        data = {
            "kind": "summary",
            **summary.to_dict(),
            "stopped_by": result.stopped_by.value,
            "elapsed_s": round(elapsed, 3),
        }
        _out(render.json_line(data))
    else:
        for line in render.consume_summary_lines(summary):
            _out(line)


def _stopped_text(result: ConsumeResult, options: ConsumeOptions) -> str:
    from pipeline.tools.consumer import StopReason

    if result.stopped_by is StopReason.COUNT:
        reason = "after the requested count"
    elif result.stopped_by is StopReason.IDLE:
        reason = f"after {options.idle_timeout_s or 0:g} s without a record"
    else:
        reason = "on a signal"
    return f"stopped {reason}: {result.records} record(s)"


def _out(line: str) -> None:
    """A line on stdout, flushed: with --follow a pipe reader sees each record as it comes."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _status(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
