"""Start-up and wind-down shared by the benchmarks that run on the embedded stack.

Why: ``benchmarks.stateless``, ``benchmarks.ensemble`` and ``benchmarks.audio``
each start the embedded stack (Tansu, moto S3, Triton) with a progress line,
probe the versions they measure, hand the stack's process groups to the CPU
accounting, always stop the stack, and end by writing ``--json`` and choosing
the exit code. Done once here, every benchmark starts, labels and ends its
runs the same way; what it measures in between stays in the benchmark.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from rich.console import Console

from benchmarks.cli import config_dict
from benchmarks.common import (
    CaseResult,
    machine_info,
    package_versions,
    tansu_version,
    triton_version,
)
from pipeline.embedded.stack import BROKER_ENV, EmbeddedStack
from pipeline.settings import Endpoints

ConfigT = TypeVar("ConfigT")


def new_log_dir(benchmark: str) -> Path:
    """A fresh directory for this run's stack and worker logs (kept: the report names it)."""
    return Path(tempfile.mkdtemp(prefix=f"bench-{benchmark}-"))


def new_run_id() -> str:
    """Unique per run: topic, group and stream names never collide with an earlier run's."""
    return f"{int(time.time()) % 1_000_000:06d}{secrets.token_hex(2)}"


@dataclass
class StackUp:
    """The started stack (its endpoints and process groups, for CPU accounting) and the run's
    log directory, start time and ``meta`` (machine, versions, what the benchmark adds)."""

    endpoints: Endpoints
    services: dict[str, int]
    log_dir: Path
    started: float
    meta: dict[str, Any]


@contextmanager
def embedded_stack(console: Console, benchmark: str, packages: Sequence[str]) -> Iterator[StackUp]:
    """Start the embedded stack (logs in a new directory), stop it whatever happens.

    ``meta``: the machine (sampled before the stack starts: the load average is
    the machine's, not the stack's start-up) and the versions measured: Triton's
    (from the server), Tansu's (from its binary) and the installed ``packages``'.
    """
    log_dir = new_log_dir(benchmark)
    started = time.perf_counter()
    meta: dict[str, Any] = {"machine": machine_info(), "log_dir": str(log_dir)}
    # Tansu unless PIPELINE_EMBEDDED_BROKER=kafka: the figures of earlier runs are on Tansu.
    broker = "kafka" if os.environ.get(BROKER_ENV, "").strip().lower() == "kafka" else "tansu"
    stack = EmbeddedStack(log_dir=log_dir / "stack", broker=broker)
    try:
        with console.status("starting the embedded stack") as status:
            endpoints = stack.start(progress=lambda msg: status.update(msg))
        assert endpoints.triton.grpc_url and endpoints.kafka.bootstrap_servers
        meta["versions"] = {
            "triton_server": triton_version(endpoints.triton.grpc_url),
            **({"tansu": tansu_version()} if broker == "tansu" else {"broker": "Apache Kafka (embedded)"}),
            **package_versions(packages),
        }
        console.print(
            f"stack up: Kafka {endpoints.kafka.bootstrap_servers}, Triton {endpoints.triton.grpc_url}; "
            f"logs in {log_dir}"
        )
        services = {p.name.split("-")[0]: p.pid for p in stack.processes if p.pid is not None}
        yield StackUp(endpoints, services, log_dir, started, meta)
    finally:
        stack.stop()


class StackBenchmark(Generic[ConfigT]):
    """What a benchmark's runner holds: its config, the stack's endpoints and process groups,
    the log directory and this run's ID."""

    def __init__(self, config: ConfigT, up: StackUp) -> None:
        self.config = config
        self.endpoints = up.endpoints
        self.kafka = up.endpoints.kafka
        self.log_dir = up.log_dir
        self.services: dict[str, int | list[int]] = dict(up.services)  # stack groups, for CPU
        self.run_id = new_run_id()


def finish(
    console: Console,
    json_path: Path | None,
    up: StackUp,
    config: object,
    results: Mapping[str, CaseResult],
    ratios: dict[str, Any],
    failed: Sequence[str],
    **extra: Any,
) -> int:
    """Write ``--json`` (meta, config, cases, ratios, ``extra``, failed), print the total time
    and the failures; the exit code: 1 when anything failed."""
    meta = up.meta
    meta["total_seconds"] = time.perf_counter() - up.started
    if json_path is not None:
        payload = {
            "meta": meta,
            "config": config_dict(config),
            "cases": {k: r.as_dict() for k, r in results.items()},
            "ratios": ratios,
            **extra,
            "failed": list(failed),
        }
        json_path.write_text(json.dumps(payload, indent=2, default=str))
        console.print(f"raw numbers written to {json_path}")
    console.print(f"total {meta['total_seconds']:.0f}s")
    if failed:
        console.print(f"[bold red]benchmark FAILED for case(s) {', '.join(failed)}[/]")
        return 1
    return 0
