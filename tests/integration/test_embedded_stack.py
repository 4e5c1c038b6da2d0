"""`pipeline up` / `pipeline down` as a user runs them: real processes, real signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.embedded.stack import child_pids_of
from pipeline.processes import pid_alive

pytestmark = [pytest.mark.kafka, pytest.mark.s3, pytest.mark.triton, pytest.mark.slow]

READY_TIMEOUT_S = 240  # a guard against hangs, not a speed target (see the README for timings)


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in child_pids_of(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def _start_up(tmp_path: Path) -> tuple[subprocess.Popen[str], dict[str, str], Path]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("PIPELINE_") and key.endswith(("_URL", "_SERVERS", "_ENDPOINT")):
            del env[key]  # `up` is about the embedded stack, whatever the session uses
    env["PIPELINE_STATE_DIR"] = str(tmp_path / "state")
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "200"
    log = tmp_path / "up.out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "up", "--log-dir", str(tmp_path / "logs")],
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        text = log.read_text()
        if "Press Ctrl-C" in text:
            return proc, env, log
        if proc.poll() is not None:
            pytest.fail(f"`pipeline up` exited with {proc.returncode}:\n{text}")
        time.sleep(0.3)
    proc.kill()
    pytest.fail(f"`pipeline up` not ready after {READY_TIMEOUT_S}s:\n{log.read_text()}")


def _exported(text: str) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)=(\S+)$", text, flags=re.MULTILINE))


def test_up_serves_models_from_s3_and_ctrl_c_leaves_no_process(tmp_path: Path) -> None:
    proc, _env, log = _start_up(tmp_path)
    try:
        exported = _exported(log.read_text())
        for key in (
            "PIPELINE_KAFKA_BOOTSTRAP_SERVERS",
            "PIPELINE_S3_ENDPOINT",
            "PIPELINE_TRITON_GRPC_URL",
            "PIPELINE_TRITON_HTTP_URL",
        ):
            assert key in exported, f"{key} not printed:\n{log.read_text()}"
        children = _descendants(proc.pid)
        assert len(children) >= 3, children

        # Triton's model repository is the bucket, not a folder.
        cmdlines = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in children]
        triton = [c for c in cmdlines if c and c[0].endswith(b"tritonserver")]
        assert len(triton) == 1
        repo_args = [a for a in triton[0] if a.startswith(b"--model-repository=")]
        assert repo_args == [b"--model-repository=s3://" + exported["PIPELINE_S3_ENDPOINT"].split("://")[1].encode() + b"/models"]

        # Both sample models are READY behind the printed HTTP endpoint.
        http = exported["PIPELINE_TRITON_HTTP_URL"]
        for model in ("dense_classifier", "silero_vad"):
            with urllib.request.urlopen(f"http://{http}/v2/models/{model}/ready", timeout=5) as r:
                assert r.status == 200

        # The state file lets other commands find the stack.
        state = json.loads((tmp_path / "state" / "stack.json").read_text())
        assert state["pid"] == proc.pid
        assert state["environment"]["PIPELINE_TRITON_GRPC_URL"] == exported["PIPELINE_TRITON_GRPC_URL"]
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    assert code == 0, log.read_text()
    assert "embedded stack stopped" in log.read_text()
    time.sleep(0.5)
    left = [pid for pid in children if pid_alive(pid)]
    assert left == [], f"processes left behind: {left}"
    assert not (tmp_path / "state" / "stack.json").exists()


def test_down_stops_a_running_stack(tmp_path: Path) -> None:
    proc, env, _log = _start_up(tmp_path)
    children = _descendants(proc.pid)
    down = subprocess.run(
        [sys.executable, "-m", "pipeline", "down"], env=env, capture_output=True, text=True, timeout=90
    )
    assert down.returncode == 0, down.stderr
    assert "stopped embedded stack" in down.stdout
    assert proc.wait(timeout=30) == 0
    time.sleep(0.5)
    assert [pid for pid in children if pid_alive(pid)] == []


def test_kill_9_of_the_supervisor_takes_the_services_with_it(tmp_path: Path) -> None:
    proc, _env, _log = _start_up(tmp_path)
    children = _descendants(proc.pid)
    assert children
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(pid_alive(p) for p in children):
        time.sleep(0.2)
    assert [pid for pid in children if pid_alive(pid)] == []


def test_down_without_a_stack_is_one_line_error(tmp_path: Path) -> None:
    env = dict(os.environ, PIPELINE_STATE_DIR=str(tmp_path / "empty"))
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "down"], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "no embedded stack is running" in result.stderr
    assert "Traceback" not in result.stderr
