"""Figures a fault scenario reports, printed in the run's summary so CI's log carries them.

A fault test compares a faulted run with a fault-free one; what it found (records sent,
results, duplicates and whether each is exact, dead letters, records lost, time to
recover) is worth reading on every CI run, not only when the test fails. pytest captures
a passing test's output, so tests hand their figures to :func:`report` and
``tests/conftest.py`` prints them all in a "fault figures" section at the end. The suite
runs in two processes (pytest-xdist): each appends its lines to the file named by
``FIGURES_FILE`` (set by the controlling process), which the summary reads.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

FIGURES_FILE = "PIPELINE_TEST_FIGURES"
"""Environment variable: the file every test process appends its figures' lines to."""


@dataclasses.dataclass(frozen=True)
class FaultFigures:
    """One scenario on one topology."""

    scenario: str
    topology: str
    sent: int
    results: int
    duplicates: int
    exact_duplicates: bool
    dead_letters: int
    lost: int
    recovery_s: float | None = None
    note: str = ""

    def line(self) -> str:
        recovery = "-" if self.recovery_s is None else f"{self.recovery_s:.1f} s"
        exact = "all exact" if self.exact_duplicates else "NOT exact"
        text = (
            f"{self.scenario} [{self.topology}]: sent {self.sent}, results {self.results}, "
            f"duplicates {self.duplicates} ({exact}), dead letters {self.dead_letters}, "
            f"lost {self.lost}, recovered in {recovery}"
        )
        return f"{text}; {self.note}" if self.note else text


REPORTED: list[FaultFigures] = []


def report(figures: FaultFigures) -> None:
    """Keep ``figures`` for the run's summary (and print them for ``pytest -s``)."""
    REPORTED.append(figures)
    print(f"\n{figures.line()}")
    if path := os.environ.get(FIGURES_FILE):
        with Path(path).open("a", encoding="utf-8") as out:
            out.write(figures.line() + "\n")


def reported_lines() -> list[str]:
    """Every process's figures, in the order they were reported (this process's alone
    when no file is shared)."""
    path = os.environ.get(FIGURES_FILE)
    if path and Path(path).exists():
        return Path(path).read_text(encoding="utf-8").splitlines()
    return [figures.line() for figures in REPORTED]
