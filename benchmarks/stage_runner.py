"""``python -m benchmarks.stage_runner [--fetch-max-wait-ms MS] <pipeline run arguments>``

What-ifs for case (d) only, to estimate a change's effect before making it:

- ``--fetch-max-wait-ms``: the stage consumers' ``fetch_max_wait_ms`` overridden,
  to show how much of the measured latency is the consumer's fetch long-poll on
  this broker (Tansu does not answer a waiting fetch as soon as data arrives);
- ``BENCH_STAGE_PATCH=/path/to/patch.py`` (environment): that file is executed
  first, in this process, so it can monkeypatch the stage (an experiment, never
  a fix: make the real change in the project once the numbers justify it).

The project code is not changed; without either, the benchmark runs the stock
``python -m pipeline run``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pipeline.cli import main as pipeline_main
from pipeline.kafka import clients
from workers.runtime import stage_clients


def _main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--fetch-max-wait-ms"] and len(args) >= 2:
        wait_ms = int(args[1])
        args = args[2:]
        original = clients.make_consumer

        def make_consumer(
            settings: Any, *topics: str, group_id: str | None, **overrides: Any
        ) -> Any:
            overrides.setdefault("fetch_max_wait_ms", wait_ms)
            return original(settings, *topics, group_id=group_id, **overrides)

        stage_clients.make_consumer = make_consumer  # type: ignore[assignment]
    patch = os.environ.get("BENCH_STAGE_PATCH")
    if patch:
        code = compile(Path(patch).read_text(), patch, "exec")
        exec(code, {"__name__": "bench_stage_patch"})  # an explicit, opt-in experiment
    if not args:
        raise SystemExit(
            "usage: python -m benchmarks.stage_runner [--fetch-max-wait-ms MS] run TOPOLOGY ..."
        )
    sys.argv = ["pipeline", *args]
    pipeline_main()


if __name__ == "__main__":
    _main()
