"""A frame as text: one header line and a table, plain lines or a rich renderable.

Both forms come from the same cells (:func:`table_cells`), so a script reading
``pipeline top --once`` and a person watching the live view see the same numbers.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from pipeline.tools.top.book import Frame, StageRow

COLUMNS = ("stage", "procs", "req/s", "requests", "results", "lag", "pending", "p50", "p99", "batch", "triton", "dead letters")
_LEFT = {"stage", "dead letters"}


def header_line(frame: Frame) -> str:
    """Topology, processes seen (stale ones named), and how old the newest snapshot is."""
    live = len(frame.processes) - len(frame.stale)
    parts = [f"topology {frame.topology}", f"processes {live} live"]
    if frame.stale:
        names = ", ".join(f"{p.process} ({_age(p.age_s)} ago)" for p in frame.stale)
        parts[-1] += f", {len(frame.stale)} stale: {names}"
    if frame.newest_age_s is None:
        parts.append("no snapshot yet (is the topology running?)")
    else:
        parts.append(f"newest snapshot {_age(frame.newest_age_s)} ago")
    if frame.skipped:
        parts.append(f"{frame.skipped} non-snapshot record(s) skipped")
    return "  ".join(parts)


def table_cells(frame: Frame) -> list[tuple[str, ...]]:
    """One tuple of cell texts per stage, in :data:`COLUMNS` order."""
    return [_cells(row) for row in frame.rows]


def plain_lines(frame: Frame) -> list[str]:
    """The frame as aligned plain-text lines: no colour, no box drawing."""
    rows = [COLUMNS, *table_cells(frame)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [header_line(frame)]
    for row in rows:
        cells = [cell.ljust(w) if name in _LEFT else cell.rjust(w) for name, cell, w in zip(COLUMNS, row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines


def rich_frame(frame: Frame, footer: str) -> Group:
    """The frame for :class:`rich.live.Live`: header, table, and ``footer`` (how to quit)."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in COLUMNS:
        table.add_column(name, justify="left" if name in _LEFT else "right", no_wrap=name != "dead letters")
    for cells in table_cells(frame):
        table.add_row(*cells)
    return Group(Text(header_line(frame), style="bold"), table, Text(footer, style="dim"))


def _cells(row: StageRow) -> tuple[str, ...]:
    t = row.totals
    dead = sum(t.dead_letters.values())
    classes = ", ".join(f"{name} {_count(n)}" for name, n in sorted(t.dead_letters.items()) if n)
    branches = ", ".join(f"{b} {state}" for b, state in sorted(t.branches.items()))
    return (
        row.stage + (f" [{branches}]" if branches else ""),  # a join's branches: behind / caught-up / gone
        str(row.processes),
        "-" if row.rate is None else f"{row.rate:,.1f}",
        _count(t.requests),
        _count(t.results),
        _count(t.lag),
        _count(t.pending),
        _ms(row.p50_s),
        _ms(row.p99_s),
        "-" if row.mean_batch is None else f"{row.mean_batch:.1f}",
        "-" if row.triton_ms is None else f"{row.triton_ms:.1f} ms",
        _count(dead) + (f" ({classes})" if classes else ""),
    )


def _count(value: float) -> str:
    return f"{round(value):,}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _age(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
