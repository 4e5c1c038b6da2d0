"""Printing a benchmark's report: console, number format, the table, header and verdict lines.

Why: every benchmark ends with the same kind of report (a header naming the
machine and the versions measured, one table row per case, notes, targets
marked met / NOT met) and used to format it with its own copies of the same
helpers. These are the pieces they share; what a benchmark's table shows (its
columns and notes) stays in the benchmark.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.common import CaseResult


def wide_console(min_width: int) -> Console:
    """A console at least ``min_width`` columns wide (tables do not fold on a narrow terminal)."""
    return Console(width=max(Console().width, min_width))


def fmt(value: float | None, digits: int = 0) -> str:
    """``1,234.5`` with ``digits`` decimals; ``-`` for no value (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def verdict(ok: bool) -> str:
    return "[green]met[/]" if ok else "[bold red]NOT met[/]"


def case_table(
    columns: Iterable[str],
    left: Sequence[str] = ("case", "what"),
    no_wrap: Sequence[str] = (),
    **table: Any,
) -> Table:
    """A table with ``columns``: the ``left`` ones left-aligned, numbers right-aligned."""
    out = Table(**table)
    for name in columns:
        out.add_column(name, justify="left" if name in left else "right", no_wrap=name in no_wrap)
    return out


def machine_line(m: Mapping[str, Any]) -> str:
    """``machine: 2 CPUs (model), 23.5 GiB, Linux k, Python v`` (from
    :func:`~benchmarks.common.machine_info`)."""
    return (
        f"machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}"
    )


def versions_line(v: Mapping[str, str], *packages: str | tuple[str, str]) -> str:
    """``versions: Triton x, tansu y, <package> z, ...``; a package as a name or (label, name)."""
    named = [(p, p) if isinstance(p, str) else p for p in packages]
    return f"versions: Triton {v['triton_server']}, {v.get('tansu') or v.get('broker')}, " + ", ".join(
        f"{label} {v[name]}" for label, name in named
    )


def throughput_of(results: Mapping[str, CaseResult], key: str) -> float | None:
    """A case's throughput, or None when it was not run or failed."""
    r = results.get(key)
    return r.throughput if r is not None and r.error is None else None


def done_line(key: str, r: CaseResult, started: float, digits: int) -> str:
    """The progress line printed when a case is done (its error, or its headline numbers)."""
    return f"    ({key}) done in {time.perf_counter() - started:.1f}s: " + (
        r.error
        or f"{fmt(r.throughput)} {r.unit}, p50 {fmt(r.p50_ms, digits)} ms, p99 {fmt(r.p99_ms, digits)} ms"
    )


def print_profile(
    console: Console,
    heading: str,
    profile: Mapping[str, Any] | None,
    sections: Mapping[str, str],
    top: int,
    **print_options: Any,
) -> None:
    """py-spy's summary (:mod:`benchmarks.profiling`): ``label: pct% frame; ...`` per section."""
    if not profile or not profile.get("samples"):
        return
    console.print(
        f"\n[bold]{heading}[/] ({profile['samples']} samples, {profile['collapsed_stacks']})"
    )
    for label, key in sections.items():
        console.print(
            f"  {label}: " + "; ".join(f"{pct}% {name}" for name, pct in profile[key][:top]),
            **print_options,
        )
