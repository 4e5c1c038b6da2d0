"""Run a plan: warm up, then every step through the pipeline and, beside it, directly to Triton.

Steps run one after the other, the pipeline first and then the direct calls
at the same level, never both at once: they share Triton (and, on a small
machine, the cores), and a step must measure one thing. A stop (Ctrl-C) ends
the sweep with the steps completed so far; the step it interrupted is left
out, since a partial step's percentiles would mislead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import PipelineError
from pipeline.tools.bench.load import Caller, run_step
from pipeline.tools.bench.plan import Plan, Step
from pipeline.tools.bench.stages import StepStages
from pipeline.tools.bench.stats import StepStats


class NoAnswers(PipelineError):
    """The warm-up got no verified result: the topology is not running, or answers nothing right."""


@dataclass
class StepResult:
    step: Step
    pipeline: StepStats
    direct: StepStats | None = None
    started_ms: int = 0
    ended_ms: int = 0
    """Wall clock (as the metrics snapshots' timestamps) around the pipeline phase of the step."""
    stages: StepStages | None = None
    """What the stages saw during the pipeline phase (None: not read, see ``SweepResult``)."""

    def to_dict(self) -> dict[str, Any]:
        stages = self.stages
        return {
            "step": self.step.label,
            "mode": str(self.step.mode),
            "level": self.step.level,
            "pipeline": self.pipeline.to_dict(),
            "direct_triton": None if self.direct is None else self.direct.to_dict(),
            "stages": None if stages is None else stages.to_dict(),
            "stages_note": "not read" if stages is None else stages.note,
        }


@dataclass
class SweepResult:
    plan: Plan
    steps: list[StepResult] = field(default_factory=list)
    interrupted: bool = False
    unmatched: int = 0
    """Answers read that no waiting request claimed (late after a timeout, a replayed duplicate, others')."""
    stages_unavailable: str | None = None
    """Why no step has stage numbers (the metrics topic could not be read), if so."""

    @property
    def errors(self) -> int:
        """Requests of the pipeline path that were not verified, over every step."""
        return sum(result.pipeline.errors for result in self.steps)


async def run_sweep(
    plan: Plan,
    pipeline: Caller,
    direct: Caller | None,
    stop: asyncio.Event,
    progress: Callable[[str], None] = lambda text: None,
) -> SweepResult:
    """Warm up both paths at the first step's level, then measure every step of ``plan``."""
    result = SweepResult(plan)
    paths = [("pipeline", pipeline)] + ([("direct Triton", direct)] if direct is not None else [])
    if plan.warmup_s > 0:
        for name, call in paths:
            progress(f"warming up {name} at {plan.steps[0].label} for {plan.warmup_s:g} s")
            warm = await run_step(call, plan.steps[0], plan.warmup_s, stop)
            if warm is None:
                result.interrupted = True
                return result
            if warm.requests and not warm.verified:
                raise NoAnswers(
                    f"warm-up: none of {warm.requests} request(s) through {name} was answered right "
                    f"(first: {warm.first_error})"
                    + (": is the topology running (`pipeline run TOPOLOGY`)?" if name == "pipeline" else "")
                )
    for number, step in enumerate(plan.steps, 1):
        measured: list[StepStats] = []
        wall_ms: list[int] = []
        for name, call in paths:
            progress(f"step {number}/{len(plan.steps)} {step.label}: {name}, {plan.duration_s:g} s")
            wall_ms.append(_now_ms())
            stats = await run_step(call, step, plan.duration_s, stop)
            wall_ms.append(_now_ms())
            if stats is None:
                result.interrupted = True
                return result
            measured.append(stats)
        direct_stats = measured[1] if len(measured) > 1 else None
        result.steps.append(StepResult(step, measured[0], direct_stats, started_ms=wall_ms[0], ended_ms=wall_ms[1]))
    return result


def _now_ms() -> int:
    return int(time.time() * 1000)
