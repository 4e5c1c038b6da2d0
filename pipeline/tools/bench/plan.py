"""The sweep a ``pipeline bench`` run makes: which load levels, how long each.

A level is either a *concurrency* (that many requests outstanding at once,
each sent when the previous one's result arrived: a closed loop, like
perf_analyzer's ``--concurrency-range``) or a *rate* (requests sent on a fixed
schedule whatever the answers do: an open loop, like ``--request-rate-range``).
Closed loops find the throughput a topology can give; open loops show the
latency a given arrival rate gets, including queueing when it cannot keep up.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.contract.errors import TextEnum
from pipeline.errors import ConfigError


class Mode(TextEnum):
    CONCURRENCY = "concurrency"
    RATE = "rate"


@dataclass(frozen=True)
class Step:
    """One load level of the sweep."""

    mode: Mode
    level: float

    @property
    def label(self) -> str:
        """``c=4`` or ``500/s``: how the table and the plot name the step."""
        if self.mode is Mode.CONCURRENCY:
            return f"c={int(self.level)}"
        return f"{self.level:g}/s"


@dataclass(frozen=True)
class Plan:
    """Every step, in order, and the timings shared by all of them."""

    steps: tuple[Step, ...]
    duration_s: float
    """How long each step sends requests (its results may arrive up to ``timeout_s`` later)."""
    warmup_s: float
    """Load before the first step, not measured: connections, Triton's first calls, the stage's batcher."""
    timeout_s: float
    """A request with no result after this long counts as missing."""
    direct: bool = True
    """Also measure direct Triton calls at every step."""


def parse_levels(text: str, flag: str, *, integer: bool) -> list[float]:
    """``"1,4,16"`` -> ``[1, 4, 16]``: positive, comma-separated; one line naming ``flag`` if not."""
    levels: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ConfigError(f"{flag} {text!r}: empty value (expected e.g. {flag} 1,4,16)")
        try:
            value = int(part) if integer else float(part)
        except ValueError:
            kind = "a whole number" if integer else "a number"
            raise ConfigError(f"{flag} {text!r}: {part!r} is not {kind}") from None
        if not value > 0 or value == float("inf"):
            raise ConfigError(f"{flag} {text!r}: {part!r} must be greater than 0")
        levels.append(float(value))
    return levels


def make_plan(
    *,
    concurrency: str | None,
    rate: str | None,
    duration_s: float,
    warmup_s: float,
    timeout_s: float,
    direct: bool = True,
) -> Plan:
    """The plan from the command's flags: ``--concurrency`` or ``--rate`` (default concurrency 1,4,16)."""
    if concurrency is not None and rate is not None:
        raise ConfigError("choose one sweep: --concurrency LEVELS or --rate LEVELS, not both")
    if duration_s <= 0:
        raise ConfigError("--duration must be greater than 0")
    if rate is not None:
        steps = [Step(Mode.RATE, level) for level in parse_levels(rate, "--rate", integer=False)]
    else:
        levels = parse_levels(concurrency or "1,4,16", "--concurrency", integer=True)
        steps = [Step(Mode.CONCURRENCY, level) for level in levels]
    return Plan(tuple(steps), duration_s=duration_s, warmup_s=warmup_s, timeout_s=timeout_s, direct=direct)
