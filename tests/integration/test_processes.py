"""`pipeline run --processes 2`: one supervisor, two workers of the same consumer group.

Both children serve records; a child killed with SIGKILL mid-stream is started again by
the supervisor and every request still gets exactly its result (duplicates, if any, are
exact copies); SIGTERM to the supervisor drains both children and exits 0.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from pipeline.contract.response import decode_response
from tests.helpers.dense_reference import mlp_reference, random_features
from tests.helpers.fault_compare import RunOutputs, by_key
from tests.helpers.fault_workloads import stateless
from tests.helpers.topology_process import PipelineProcess, collect_outputs, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

N, SEED = 3_000, 103


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/cmdline").read_bytes() != b""  # a zombie is not alive


def test_two_processes_share_the_group_survive_kill_9_and_stop_cleanly(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    workload = stateless(N, SEED)
    topo = workload.topology(tmp_path)
    supervisor = PipelineProcess(topo, cli_env, tmp_path / "supervisor.log", args=["--processes", "2"]).start()
    ports = [supervisor.http_port, supervisor.http_port + 1]
    try:
        wait_until(lambda: supervisor.get("/readyz", ports[1])[0] == 200, "the second child ready", supervisor)
        producer = workload.producing(kafka_bootstrap, topo, seconds=15)
        wait_until(
            lambda: all(supervisor.metric("pipeline_results_total", port) > 0 for port in ports),
            "results from both children", supervisor,
        )
        victim = supervisor.children()[ports[1]]
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: supervisor.children().get(ports[1], victim) != victim
            and supervisor.get("/readyz", ports[1])[0] == 200,
            "the killed child restarted", supervisor,
        )
        producer.join(timeout=60)
        collect_outputs(kafka_bootstrap, topo, workload.done, timeout=90)
        children = list(supervisor.children().values())
        assert len(children) == 2
        assert supervisor.terminate(timeout=60) == 0, supervisor.log()
        assert not [pid for pid in children if _alive(pid)], "children outlived the supervisor"
    finally:
        if supervisor.proc is not None and supervisor.proc.poll() is None:
            supervisor.kill()

    log = supervisor.log()
    assert f"process 2 (pid {victim}) exited with -9" in log, log
    out = RunOutputs.read(kafka_bootstrap, topo, by_key)
    assert out.dead_letters == []
    assert set(out.results) == {f"sl-{i}".encode() for i in range(N)}, "lost requests"
    assert out.inexact() == [], "a duplicate differs from its first delivery"
    features = random_features(N, SEED)
    for key, records in out.results.items():
        index = int(key.decode().removeprefix("sl-"))
        logits = decode_response(records[0].value, records[0].headers).outputs["logits"]
        np.testing.assert_allclose(logits, mlp_reference(features[index : index + 1]), rtol=1e-4, atol=1e-5)
    print(f"\n--processes 2, kill -9 of one child: {N} requests, {out.duplicates()} duplicates")
