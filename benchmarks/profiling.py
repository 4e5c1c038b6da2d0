"""``--profile DIR``: py-spy on a worker during its throughput phase, and what its samples say.

Why: the stateless, ensemble and audio benchmarks all attach py-spy to a
worker process the same way (raw collapsed stacks, non-blocking, attached
before the phase starts) and summarise the stacks into top-frame shares. One
wrapper keeps the three attaching the same way; the two summaries differ on
purpose (:func:`summarize_profile` per function, :func:`summarize_profile_lines`
per line and per project file as well, for the audio stages).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import BenchmarkFailure

Summary = Callable[[Path], dict[str, Any]]


class PySpy:
    """One ``py-spy record`` of a process, until :meth:`stop`."""

    def __init__(self, profile_dir: Path, pid: int, name: str, rate: int = 250) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(spy).exists():
            raise BenchmarkFailure("--profile needs py-spy: .venv/bin/pip install py-spy")
        profile_dir.mkdir(parents=True, exist_ok=True)
        self.out = profile_dir / name
        argv = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking"]
        argv += ["--format", "raw", "--output", str(self.out)]
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # let py-spy attach before the phase starts

    @classmethod
    def start(cls, profile_dir: Path | None, pid: int, name: str, rate: int = 250) -> PySpy | None:
        """A recording into ``profile_dir/name``, or None without ``--profile``."""
        return None if profile_dir is None else cls(profile_dir, pid, name, rate)

    def stop(self, summarize: Summary | None = None) -> dict[str, Any]:
        """Stop recording (SIGINT: py-spy writes its file); the file and its summary."""
        self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        return {"collapsed_stacks": str(self.out), **(summarize or summarize_profile)(self.out)}


def _stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    """(frames, samples) per line of py-spy's collapsed (raw) format."""
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def _without_line(frame: str) -> str:
    return re.sub(r":\d+\)$", ")", frame)


def _short(frame: str) -> str:
    """``fn (/long/path/to/pkg/file.py:12)`` -> ``fn (pkg/file.py:12)``."""
    return re.sub(r"\((?:.*/)?([^/()]+/[^/()]+\.py(?::\d+)?)\)$", r"(\1)", frame)


@dataclass
class _Tally:
    """Samples per frame: on top of the stack (self), anywhere in it (inclusive, per function),
    and anywhere in it for project frames (per line)."""

    total: int = 0
    own: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    inclusive: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    project: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @classmethod
    def of(cls, path: Path, name: Callable[[str], str]) -> _Tally:
        """Count ``path``'s stacks, each frame written as ``name(frame)``."""
        tally = cls()
        for stack, n in _stacks(path):
            tally.total += n
            frames = [name(f) for f in stack]
            tally.own[frames[-1]] += n
            for frame in {_without_line(f) for f in frames}:
                tally.inclusive[frame] += n
            for frame in set(frames):
                if re.search(r"\((workers|pipeline)/", frame):
                    tally.project[frame] += n
        return tally

    def share(
        self, table: dict[str, int], top: int, below: float | None = None
    ) -> list[tuple[str, float]]:
        """The ``top`` frames of ``table`` and their % of all samples; with ``below``, only
        frames on fewer than that fraction of the stacks."""
        kept = [(k, n) for k, n in table.items() if below is None or n < below * self.total]
        ranked = sorted(kept, key=lambda kv: -kv[1])[:top]
        return [(k, round(100 * n / self.total, 1)) for k, n in ranked]


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    if not path.exists():
        return {"samples": 0}
    tally = _Tally.of(path, _without_line)
    return {
        "samples": tally.total,
        "self_pct": tally.share(tally.own, top),
        "inclusive_pct": tally.share(tally.inclusive, top),
    }


def summarize_profile_lines(path: Path, top: int = 20) -> dict[str, Any]:
    """Shares of samples: self time per line, inclusive per function, and per project file:line.

    Frames on (nearly) every stack (the CLI, the event loop) say nothing: left out.
    """
    if not path.exists():
        return {"samples": 0}
    tally = _Tally.of(path, _short)
    return {
        "samples": tally.total,
        "self_pct": tally.share(tally.own, top, below=0.8),
        "inclusive_pct": tally.share(tally.inclusive, top, below=0.8),
        "project_lines_inclusive_pct": tally.share(tally.project, top, below=0.8),
    }
