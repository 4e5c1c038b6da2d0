"""A quiet console: `pipeline run` prints its summary and its own lines, not the libraries' chatter.

aiokafka logs every group join, assignment and commit failure at INFO; a normal run shows
none of it (libraries log warnings only, unless --log-level debug). With --log-format json
every line of the output is one JSON object, the startup summary included.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.fault_workloads import stateless
from tests.helpers.topology_process import PipelineProcess, collect_outputs

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]


def _serve_briefly(bootstrap: str, env: dict[str, str], tmp_path: Path, *args: str) -> str:
    """Start, serve a few requests (joins, assignments, commits), stop; the whole output."""
    workload = stateless(20, seed=104)
    topo = workload.topology(tmp_path)
    worker = PipelineProcess(topo, env, tmp_path / f"run{'-'.join(args)}.log", args=args).start()
    try:
        workload.producing(bootstrap, topo, seconds=0).join(timeout=60)
        collect_outputs(bootstrap, topo, workload.done, timeout=60)
        assert worker.terminate(timeout=60) == 0, worker.log()
    finally:
        if worker.proc is not None and worker.proc.poll() is None:
            worker.kill()
    return worker.log_path.read_text(errors="replace")


def test_text_console_has_the_summary_and_no_library_info_lines(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    output = _serve_briefly(kafka_bootstrap, cli_env, tmp_path)
    chatter = [line for line in output.splitlines() if " INFO aiokafka" in line or " INFO kafka" in line]
    assert chatter == [], "\n".join(chatter[:5])
    assert "running stages classify" in output and "group t-" in output, output
    assert "kafka: " in output and "triton: " in output and "stopped cleanly" in output, output


def test_json_log_format_writes_one_json_object_per_line(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    output = _serve_briefly(kafka_bootstrap, cli_env, tmp_path, "--log-format", "json")
    records = [json.loads(line) for line in output.splitlines() if line.strip()]
    assert all({"timestamp", "level", "logger", "message"} <= set(r) for r in records), records[:3]
    assert not [r for r in records if r["logger"].startswith("aiokafka") and r["level"] == "INFO"]
    summary = next(r["summary"] for r in records if "summary" in r)
    assert [stage["name"] for stage in summary["stages"]] == ["classify"]
    assert summary["health_url"].endswith("/metrics")
