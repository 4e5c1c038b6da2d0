"""A sweep as a person reads it (a rich table) and as a program reads it (``--json``).

One row per step: the pipeline's sent requests, verified results, errors
(dead letters, invalid, missing, refused: every request not verified),
throughput of verified results and latency percentiles, then the direct
Triton calls' throughput and percentiles at the same level. A second table
says what the stages saw during each step (their own metrics: requests, batch
size, Triton call time, end-to-end percentiles, dead letters; one row per step
and stage), kept apart so the first stays readable whatever the stage count.
The JSON holds every count and percentile of both paths per step, the stages'
numbers (``stages``), plus the plan.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from pipeline.tools.bench.stats import Outcome, StepStats
from pipeline.tools.bench.sweep import SweepResult
from pipeline.tools.top.window import StageRow

_ERROR_SHORT = {
    Outcome.DEAD_LETTER: "dead",
    Outcome.INVALID: "invalid",
    Outcome.MISSING: "missing",
    Outcome.SEND_FAILED: "refused",
}


def number(value: float | None, digits: int = 0) -> str:
    """``1,234.5`` with ``digits`` decimals; ``-`` for no value."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def errors_text(stats: StepStats) -> str:
    """``0``, or ``3 (2 dead, 1 missing)``."""
    if not stats.errors:
        return "0"
    parts = [f"{stats.outcomes[o]} {short}" for o, short in _ERROR_SHORT.items() if stats.outcomes[o]]
    return f"{stats.errors} ({', '.join(parts)})"


def sweep_table(result: SweepResult, *, title: str) -> Table:
    """The terminal table: pipeline columns, then direct Triton's."""
    direct = result.plan.direct
    table = Table(title=title, title_justify="left")
    columns = ["step", "sent", "sent/s", "verified", "errors", "results/s", "p50 ms", "p90 ms", "p99 ms"]
    if direct:
        columns += ["direct/s", "direct p50", "direct p90", "direct p99"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("step", "errors") else "right")
    for step in result.steps:
        p = step.pipeline.percentiles()
        row = [
            step.step.label,
            number(step.pipeline.requests),
            number(step.pipeline.send_rate),
            number(step.pipeline.verified),
            errors_text(step.pipeline),
            number(step.pipeline.throughput),
            number(p["p50"], 1),
            number(p["p90"], 1),
            number(p["p99"], 1),
        ]
        if direct:
            d = step.direct.percentiles() if step.direct is not None else {}
            row += [
                number(step.direct.throughput if step.direct is not None else None),
                number(d.get("p50"), 1),
                number(d.get("p90"), 1),
                number(d.get("p99"), 1),
            ]
        table.add_row(*row)
    return table


def sweep_tables(result: SweepResult, *, title: str) -> RenderableType:
    """The sweep table, then the stages' table (or the one line saying why there is none)."""
    if result.stages_unavailable is not None:
        note: RenderableType = Text(f"stage numbers unavailable: {result.stages_unavailable}")
        return Group(sweep_table(result, title=title), note)
    if not any(step.stages is not None for step in result.steps):
        return sweep_table(result, title=title)
    return Group(sweep_table(result, title=title), stages_table(result))


def stages_table(result: SweepResult) -> Table:
    """One row per step and stage: the stage's own numbers over the step (metrics snapshots)."""
    table = Table(
        title="stages during each step (their metrics snapshots, first to last inside the step)",
        title_justify="left",
    )
    columns = ["step", "stage", "procs", "window s", "requests", "req/s", "batch", "triton ms", "p50 ms", "p99 ms"]
    for name in [*columns, "dead letters"]:
        table.add_column(name, justify="left" if name in ("step", "stage") else "right")
    for step in result.steps:
        if step.stages is None:
            continue
        if step.stages.note is not None:
            table.add_row(step.step.label, step.stages.note, *["" for _ in columns[2:]], "")
        for row in step.stages.rows:
            table.add_row(step.step.label, *_stage_cells(row))
    return table


def _stage_cells(row: StageRow) -> list[str]:
    def ms(seconds: float | None) -> str:
        return number(None if seconds is None else seconds * 1000, 1)

    dead = row.delta.dead_letters
    return [
        row.stage,
        str(row.processes),
        number(row.window_s, 1),
        number(row.delta.requests),
        number(row.rate),
        number(row.mean_batch, 1),
        number(row.triton_ms, 1),
        ms(row.p50_s),
        ms(row.p99_s),
        number(sum(dead.values())),
    ]


def sweep_json(result: SweepResult, **about: Any) -> dict[str, Any]:
    """Everything measured, JSON-ready; ``about``: what was measured (topology, model, endpoints)."""
    plan = result.plan
    return {
        **about,
        "plan": {
            "mode": str(plan.steps[0].mode),
            "levels": [step.level for step in plan.steps],
            "duration_s": plan.duration_s,
            "warmup_s": plan.warmup_s,
            "timeout_s": plan.timeout_s,
            "direct_triton": plan.direct,
        },
        "interrupted": result.interrupted,
        "steps": [step.to_dict() for step in result.steps],
        "errors": result.errors,
        "unmatched_answers": result.unmatched,
        "stages_unavailable": result.stages_unavailable,
    }
