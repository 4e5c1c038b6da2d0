"""`pipeline top` against a running topology: the real broker, Triton and `pipeline run`.

The live view is read as a person sees it: `pipeline top` runs on a pseudo-terminal
(so rich draws its live view with cursor movements), the test reads the screen bytes,
strips the escape codes and looks for the stage's row; Ctrl-C (SIGINT) must end it
with exit 0 and the cursor shown again. ``--once`` on a pipe prints one plain frame.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.contract.records import Record, read_dead_letter
from pipeline.contract.request import encode_request
from tests.helpers.cli import assert_one_line_error, ok, run_cli
from tests.helpers.dense_reference import random_features
from tests.helpers.kafka_io import produce
from tests.helpers.topology_process import (
    PipelineProcess,
    TopologyFiles,
    collect_outputs,
    distinct_keys,
    pipeline_process,
    write_topology,
)

pytestmark = [pytest.mark.kafka, pytest.mark.triton, pytest.mark.slow]

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")
SHOW_CURSOR = b"\x1b[?25h"
N = 1_500
BAD = 5
RATE = 150.0  # 10 s of traffic: the live view is read while it flows


@pytest.fixture(scope="module")
def running(
    kafka_bootstrap: str, cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TopologyFiles, PipelineProcess]]:
    tmp = tmp_path_factory.mktemp("top")
    topology = write_topology(tmp)  # metrics_interval_s: 1
    with pipeline_process(topology, cli_env, tmp) as process:
        yield topology, process


def _produce_in_background(bootstrap: str, topic: str) -> threading.Thread:
    features = random_features(N, seed=13)
    records = [encode_request({"features": features[i : i + 1]}, correlation_id=f"top-{i}") for i in range(N)]
    thread = threading.Thread(target=lambda: asyncio.run(produce(bootstrap, topic, records, rate=RATE)), daemon=True)
    thread.start()
    return thread


def _stage_row(screen: str, stage: str) -> list[str] | None:
    """The newest drawn row of ``stage``: its cells split on blanks."""
    rows = [line.split() for line in screen.splitlines() if line.strip().startswith(stage + " ")]
    return rows[-1] if rows else None


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_live_view_on_a_terminal_shows_the_stage_rate_and_count_and_quits_on_ctrl_c(
    running: tuple[TopologyFiles, PipelineProcess], kafka_bootstrap: str, cli_env: dict[str, str]
) -> None:
    topology, _ = running
    producer = _produce_in_background(kafka_bootstrap, topology.input_topic)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    env = {**cli_env, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "40"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "top", "--topology", str(topology.path), "--interval", "0.5"],
        stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
    )
    os.close(slave)
    raw = b""

    def read_for(seconds: float) -> None:
        nonlocal raw
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if select.select([master], [], [], min(left, 0.2))[0]:
                try:
                    raw += os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    return

    try:
        seen: list[str] | None = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            read_for(0.5)
            row = _stage_row(ANSI.sub("", raw.decode(errors="replace")), "classify")
            if row is not None and row[2] != "-" and _number(row[2]) > 0 and _number(row[3]) > 0:
                seen = row
                break
            assert proc.poll() is None, ANSI.sub("", raw.decode(errors="replace"))[-3000:]
        screen = ANSI.sub("", raw.decode(errors="replace"))
        assert seen is not None, f"no classify row with a rate on screen:\n{screen[-3000:]}"
        assert f"topology {topology.name}" in screen and "processes 1 live" in screen
        assert "req/s" in screen and "p99" in screen and "Ctrl-C to quit" in screen
        assert b"\x1b[" in raw  # a live view on a terminal, not plain lines
        assert _number(seen[1]) == 1  # one process serves the stage

        interrupted = len(raw)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) == 0
        read_for(0.5)
        assert SHOW_CURSOR in raw[interrupted:], "cursor not shown again: terminal not restored"
        assert "Traceback" not in ANSI.sub("", raw.decode(errors="replace"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        os.close(master)
        producer.join(timeout=60)


def test_once_on_a_pipe_prints_one_plain_frame_with_exact_counts_and_dead_letter_classes(
    running: tuple[TopologyFiles, PipelineProcess], kafka_bootstrap: str, cli_env: dict[str, str]
) -> None:
    topology, _ = running
    # After the live test's N requests (or, run alone, after producing them here): all answered.
    if not collect_outputs(kafka_bootstrap, topology, distinct_keys(N), timeout=5).records:
        _produce_in_background(kafka_bootstrap, topology.input_topic).join(timeout=60)
    bad = [Record(key=f"bad-{i}".encode(), value=b"not an inference request", headers=[]) for i in range(BAD)]
    asyncio.run(produce(kafka_bootstrap, topology.input_topic, bad))
    outputs = collect_outputs(kafka_bootstrap, topology, distinct_keys(N + BAD), timeout=60)
    assert len(outputs.on(topology.result_topic)) == N
    dead = outputs.on(topology.dead_letter_topic)
    classes = Counter(read_dead_letter(r.headers).error_class for r in dead)
    assert sum(classes.values()) == BAD
    expected_dead = f"{BAD} (" + ", ".join(f"{name} {n}" for name, n in sorted(classes.items())) + ")"

    deadline = time.monotonic() + 20
    while True:  # the next snapshot (1 s) carries the last outcomes
        result = ok(run_cli(cli_env, "top", "--topology", str(topology.path), "--once", timeout=60))
        lines = result.stdout.splitlines()
        row = _stage_row(result.stdout, "classify")
        assert row is not None, result.stdout
        if (_number(row[3]) == N + BAD and " ".join(row[11:]) == expected_dead) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert lines[0].startswith(f"topology {topology.name}  processes 1 live  newest snapshot "), lines[0]
    assert lines[1].split() == [
        "stage", "procs", "req/s", "requests", "results", "lag", "pending", "p50", "p99", "batch", "triton", "dead", "letters"
    ]
    assert _number(row[3]) == N + BAD and _number(row[4]) == N, result.stdout  # requests, results
    assert " ".join(row[11:]) == expected_dead, result.stdout  # dead letters, by error class
    assert lines[-1] == "" and len(lines) == 4, result.stdout  # one frame, then a blank line


def test_on_a_pipe_frames_repeat_as_plain_lines_until_sigint(
    running: tuple[TopologyFiles, PipelineProcess], cli_env: dict[str, str]
) -> None:
    topology, _ = running
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "top", "--topology", str(topology.path), "--interval", "0.3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**cli_env, "COLUMNS": "200"}, text=True,
    )
    try:
        assert proc.stdout is not None
        headers = 0
        deadline = time.monotonic() + 20
        while headers < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            headers += line.startswith(f"topology {topology.name}  ")
        assert headers == 3, "frames are not repeated"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=5)
        assert proc.returncode == 0, err
        assert "\x1b[" not in out + err and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


def test_a_topology_that_never_ran_is_one_line_error(cli_env: dict[str, str], tmp_path: Path) -> None:
    topology = write_topology(tmp_path)
    result = run_cli(cli_env, "top", "--topology", str(topology.path), "--once", timeout=60)
    assert_one_line_error(result, f"metrics topic {topology.metrics_topic} does not exist")
