"""``pipeline replay``: send dead letters back to the topic they failed on (or ``--to``).

The logic lives in :mod:`pipeline.tools.replay` (reading, sending, committing) and
:mod:`pipeline.tools.replay_rules` (filters, the replay bound); this module turns
flags into calls and prints: the table (every selected record in a dry run; the
refused and failed ones otherwise) and the summary on stdout, progress on stderr.
Exit status 1 when any replay failed.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.app import app, console, console_err
from pipeline.cli.connection import announce, connection_options, endpoints_text, load_target, required_topology
from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pipeline.tools.replay import ReplayOptions, ReplayReport
    from pipeline.tools.target import Target

#: Seconds between progress lines on stderr.
PROGRESS_EVERY_S = 2.0
#: Longest reason shown in the table (the full text is in the record's error-reason header).
REASON_WIDTH = 80


@app.command()
@connection_options(kafka=True, s3=True)
def replay(
    topology_file: Annotated[
        Path | None, typer.Argument(metavar="TOPOLOGY", help="Topology file: replay its dead-letter topic.", show_default=False)
    ] = None,
    topology_option: Annotated[
        Path | None, typer.Option("--topology", hidden=True, help="Deprecated: give TOPOLOGY as the argument.")
    ] = None,
    to: Annotated[
        str | None,
        typer.Option("--to", help="Send every selected record to this topic (default: the topic it failed on)."),
    ] = None,
    error_class: Annotated[
        list[str] | None,
        typer.Option("--error-class", help="Only dead letters of this error class (repeatable)."),
    ] = None,
    stage: Annotated[str | None, typer.Option("--stage", help="Only dead letters of this stage.")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Only dead letters with this record key.")] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Only dead-lettered at or after: ISO 8601 time, or relative (10m, 2h, 1d)."),
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Only dead-lettered at or before (same forms as --since).")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Stop after this many selected records.")] = None,
    max_replays: Annotated[
        int,
        typer.Option("--max-replays", min=1, help="Refuse records already replayed this many times (replay-count)."),
    ] = 3,
    rate: Annotated[float, typer.Option("--rate", min=0.0, help="Records per second; 0 = as fast as possible.")] = 0.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be sent; send nothing.")] = False,
    replay_answered: Annotated[
        bool,
        typer.Option(
            "--replay-answered",
            help="Also replay dead letters whose correlation id already has a result (default: refused, "
            "so no request is answered twice; the result topic is read first).",
        ),
    ] = False,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="Start where this consumer group committed, and commit past what was read (never past a failed "
            "replay), so the next run with it does not redo them. Default: none, read all, commit nothing.",
        ),
    ] = None,
) -> None:
    """Replay a topology's dead letters: each selected record, byte for byte, back to its topic.

    Reads the dead-letter topic up to its end at the start (not following). Each
    record sent keeps its original key, value and headers, loses the dead-letter
    headers and gets replay-count one higher; records past --max-replays are refused
    (listed, not sent), as are those whose correlation id already has a result. Claim-check payloads are fetched from the S3 store and checked.
    Prints a summary; exit status 1 if any replay failed.
    """
    from pipeline.tools.replay import ReplayOptions
    from pipeline.tools.replay_rules import ReplayFilter, ReplayRules

    target = load_target(required_topology(topology_file, topology_option))
    assert target.topology is not None
    rules = ReplayRules(
        filter=ReplayFilter.build(
            error_classes=error_class or (),
            stage=stage,
            key=key,
            since=since,
            until=until,
            now_ms=time.time_ns() // 1_000_000,
        ),
        max_replays=max_replays,
        to_topic=to,
    )
    options = ReplayOptions(
        rules=rules, dry_run=dry_run, rate=rate, limit=limit, group=group,
        result_topic=None if replay_answered else target.topology.result_topic,
    )  # fmt: skip
    report = asyncio.run(_run(target, options))
    _print(report, dry_run=dry_run)
    if report.interrupted:
        raise SystemExit(130)
    if report.failed:
        raise PipelineError(f"{report.failed} of {report.selected} selected dead letter(s) failed to replay")


async def _run(target: Target, options: ReplayOptions) -> ReplayReport:
    from pipeline.endpoints import resolve_endpoints
    from pipeline.runtime.stages import record_limits
    from pipeline.tools.replay import replay
    from pipeline.tools.signals import stop_on_signals

    assert target.topology is not None
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())
    kafka = target.kafka()
    s3 = resolve_endpoints(need=()).s3
    announce(endpoints_text(kafka=kafka, s3=s3, target=target))
    topic = target.topology.dead_letter_topic
    action = "listing" if options.dry_run else "replaying"
    where = f" to {options.rules.to_topic}" if options.rules.to_topic else ""
    console_err.print(f"{action} dead letters of {topic}{where}", highlight=False, markup=False)
    progress = _Progress()
    stop = asyncio.Event()
    with stop_on_signals(stop):
        return await replay(
            topic,
            settings=kafka,
            limits=record_limits(target.topology, kafka),
            s3=s3 if s3.configured else None,
            options=options,
            on_progress=progress.update,
            stop=stop,
        )


class _Progress:
    """A line on stderr every few seconds while a long run goes on."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    def update(self, report: ReplayReport) -> None:
        now = time.monotonic()
        if now - self._last >= PROGRESS_EVERY_S:
            self._last = now
            print(
                f"read {report.read} of {report.to_read}, selected {report.selected}, sent {report.sent}, "
                f"refused {report.refused}, failed {report.failed}",
                file=sys.stderr,
                flush=True,
            )


def _print(report: ReplayReport, *, dry_run: bool) -> None:
    from rich.table import Table

    if report.rows:
        title = "would be sent (dry run: nothing sent)" if dry_run else "not replayed"
        table = Table(title=title, title_justify="left")
        for column in ("offset", "key", "error class", "stage", "reason", "target", "replays", "outcome"):
            table.add_column(column, overflow="fold")
        for row in report.rows:
            reason = row.reason if len(row.reason) <= REASON_WIDTH else row.reason[: REASON_WIDTH - 1] + "…"
            outcome = f"{row.outcome.value}: {row.detail}" if row.detail else row.outcome.value
            table.add_row(
                f"{row.partition}@{row.offset}",
                row.key,
                row.error_class,
                row.stage,
                reason,
                row.target or "-",
                str(row.replay_count),
                outcome,
            )
        console.print(table, highlight=False, markup=False, soft_wrap=False)
    sent = f"would send {report.would_send}" if dry_run else f"sent {report.sent}"
    print(
        f"{report.topic}: read {report.read}, selected {report.selected}, {sent}, "
        f"refused by max count {report.refused}, failed {report.failed}"
        + (f", already answered {report.answered}" if report.answered else "")
    )
    if report.committed:
        positions = ", ".join(f"{p}@{o}" for p, o in sorted(report.committed.items()))
        print(f"committed {positions}")
    sys.stdout.flush()
