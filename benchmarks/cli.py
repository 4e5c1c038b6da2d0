"""Command-line options the benchmarks share, defined once.

Why: ``benchmarks.stateless``, ``benchmarks.ensemble`` and ``benchmarks.audio``
measure with one method (``benchmarks.phases``) and so take the same knobs
(``--requests``, ``--min-window``, ``--latency-*``, ``--stall-seconds``,
``--cases``, ``--profile``, ``--json``...). Each used to declare them again,
with drifting help texts; here each option has one definition (type, default,
help) and a benchmark names the ones it takes, changing a default or a help
text only where its meaning really differs. The options' ``dest`` names are
the benchmarks' ``Config`` field names, so :func:`config_from` builds a
``Config`` from the parsed namespace without listing every field again.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

OPTIONS: dict[str, dict[str, Any]] = {
    "--requests": {
        "type": int,
        "help": "throughput backlog per case (grown while the window < --min-window)",
    },
    "--warmup-requests": {"type": int, "default": 200},
    "--min-window": {
        "dest": "min_window_s",
        "metavar": "MIN_WINDOW",
        "type": float,
        "default": 2.0,
        "help": "repeat the throughput phase with a bigger backlog until it lasts this long (s)",
    },
    "--max-requests": {"type": int, "help": "cap on that backlog"},
    "--latency-seconds": {"type": float, "default": 4.0},
    "--latency-load": {
        "type": float,
        "default": 0.5,
        "help": "fraction of the measured throughput offered in the latency phase",
    },
    "--latency-max-rate": {
        "type": float,
        "default": 5000.0,
        "help": "cap on the latency phase's rate, so fast cases compare at one load (req/s)",
    },
    "--latency-attempts": {
        "type": int,
        "help": "halve the latency rate up to this many times while the queue grows",
    },
    "--stall-seconds": {
        "type": float,
        "default": 30.0,
        "help": "fail when no result arrives for this long",
    },
    "--fetch-max-wait-ms": {
        "type": int,
        "default": None,
        "help": "override the project's consumer default (pipeline/kafka/clients.py)",
    },
    "--cases": {"help": "which cases to run"},
    "--profile": {
        "dest": "profile_dir",
        "metavar": "DIR",
        "type": Path,
        "default": None,
        "help": "record the throughput phase with py-spy into DIR",
    },
    "--json": {"type": Path, "default": None, "help": "write the raw numbers here"},
}


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """``python -m benchmarks.<module>``, described by the first paragraph of its docstring."""
    return argparse.ArgumentParser(
        prog=f"python -m benchmarks.{module}", description=(doc or "").split("\n\n")[0]
    )


def add_shared(p: argparse.ArgumentParser, *flags: str, **changes: dict[str, Any]) -> None:
    """Add the shared options ``flags``, in that order.

    ``changes`` are keyed by the option's name without dashes (``requests=...``,
    ``fetch_max_wait_ms=...``) and update its definition: a default or help text
    of this benchmark's own.
    """
    unknown = set(changes) - {flag.removeprefix("--").replace("-", "_") for flag in flags}
    if unknown:
        raise ValueError(f"changes for options not added: {sorted(unknown)}")
    for flag in flags:
        spec = {**OPTIONS[flag], **changes.get(flag.removeprefix("--").replace("-", "_"), {})}
        p.add_argument(flag, **spec)


def select_cases(
    p: argparse.ArgumentParser, value: str, known: Iterable[str], separator: str = ""
) -> tuple[str, ...]:
    """The cases ``--cases`` names, in the benchmark's order; a usage error for unknown ones.

    Single-letter cases are written together (``abd``), longer names with ``separator``
    (``s1,e2``).
    """
    known = list(known)
    wanted = value.split(separator) if separator else list(value)
    if not wanted or not set(wanted) <= set(known):
        takes = (
            f"a comma-separated subset of {separator.join(known)}"
            if separator
            else f"letters from {''.join(known)}"
        )
        p.error(f"--cases takes {takes}")
    return tuple(k for k in known if k in wanted)


def config_from(cls: type[T], namespace: argparse.Namespace, **values: Any) -> T:
    """A ``Config`` dataclass from the parsed options: ``values`` first, else the option of
    that name."""
    given = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.name in values:
            given[field.name] = values[field.name]
        elif hasattr(namespace, field.name):
            given[field.name] = getattr(namespace, field.name)
    return cls(**given)


def config_dict(config: object) -> dict[str, Any]:
    """A ``Config`` for ``--json``: paths as strings."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(config).items()}
