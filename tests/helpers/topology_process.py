"""Run `pipeline run` as a real subprocess on a private copy of a topology.

Each test gets unique topic names and a unique consumer group, so tests share
one broker without seeing each other's records.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiokafka.structs import ConsumerRecord
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.kafka_io import Collected, collect

ENSEMBLE_YAML = Path(__file__).resolve().parents[2] / "topologies" / "ensemble.yaml"


@dataclass
class TopologyFiles:
    path: Path
    name: str
    input_topic: str
    result_topic: str
    dead_letter_topic: str
    metrics_topic: str


def write_topology(
    tmp_path: Path,
    *,
    partitions: int = 4,
    stage: dict[str, Any] | None = None,
    stages: list[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> TopologyFiles:
    """A topology with unique names: by default one dense_classifier stage (``stage``
    overrides its settings); ``stages`` replaces the stage list entirely."""
    suffix = uuid.uuid4().hex[:8]
    name = f"t-{suffix}"
    stage_config: dict[str, Any] = {
        "name": "classify",
        "kind": "stateless",
        "model": "dense_classifier",
        "batching": {"max_queue_delay_ms": 5.0, "max_inflight_batches": 4},
    }
    stage_config.update(stage or {})
    doc = {
        "name": name,
        "kafka": {"partitions": partitions},
        "input_topic": f"{name}.requests",
        "result_topic": f"{name}.results",
        "dead_letter_topic": f"{name}.dead-letters",
        "metrics_topic": f"{name}.metrics",
        "metrics_interval_s": 1,
        "stages": stages if stages is not None else [stage_config],
    }
    doc.update(extra or {})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return TopologyFiles(
        path=path,
        name=name,
        input_topic=doc["input_topic"],
        result_topic=doc["result_topic"],
        dead_letter_topic=doc["dead_letter_topic"],
        metrics_topic=doc["metrics_topic"],
    )


def write_ensemble_topology(
    tmp_path: Path,
    *,
    partitions: int = 2,
    mode: str = "inner",
    window_ms: float = 5000,
    fuse: list[dict[str, Any]] | None = None,
    **join_settings: Any,
) -> TopologyFiles:
    """A private copy of ``topologies/ensemble.yaml`` (fan-out, two branches, a result join);
    ``fuse``: its ``fuse:`` entries (none by default); ``join_settings``: more of the result
    join's settings (``branch_gone_after``, ``max_wait``)."""
    ensemble = yaml.safe_load(ENSEMBLE_YAML.read_text())
    join = {"mode": mode, "window_ms": window_ms, **join_settings}
    extra: dict[str, Any] = {"inputs": ensemble["inputs"], "outputs": ensemble["outputs"], "result_join": join}
    if fuse:
        extra["fuse"] = fuse
    return write_topology(tmp_path, partitions=partitions, stages=ensemble["stages"], extra=extra)


def _processes(args: Sequence[str]) -> int:
    return int(args[args.index("--processes") + 1]) if "--processes" in args else 1


_HANDED_OUT: set[int] = set()
"""Ports listen_ports returned in this process: several workers are given theirs before
any of them listens (start_runs), so a port free when checked is not proof enough (two
reference workers were once given 24179 and the second could not bind, CI 2026-11-27)."""


def listen_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive free ports, below the kernel's ephemeral range,
    none of them handed out before by this process.

    A port the kernel hands out for ``bind(0)`` lies in the ephemeral range, where any
    outgoing connection may take it: a ``--processes`` child restarted onto ``port + i``
    after kill -9 found it taken by a Kafka connection and failed five times in a row
    (CI, 2026-11-24). Ports below that range are only taken by listeners."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        base = random.randrange(20_000, low - count)
        ports = range(base, base + count)
        if _HANDED_OUT.intersection(ports):
            continue
        try:
            for port in ports:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        _HANDED_OUT.update(ports)
        return base
    raise AssertionError(f"no {count} consecutive free ports between 20000 and {low}")


class PipelineProcess:
    """One `pipeline run` process with its health port and log file."""

    def __init__(
        self,
        topology: TopologyFiles,
        env: dict[str, str],
        log_path: Path,
        stage: str | list[str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        """``args``: more options of `pipeline run` (``--processes 2``, ``--log-format json``)."""
        self.topology = topology
        self.args = list(args)
        self.env = dict(env, PYTHONUNBUFFERED="1", COLUMNS="200")
        self.log_path = log_path
        self.stage = stage
        self.http_port = listen_ports(_processes(self.args))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout: float = 120.0) -> PipelineProcess:
        argv = [sys.executable, "-m", "pipeline", "run", str(self.topology.path), "--http-port", str(self.http_port)]
        for name in [self.stage] if isinstance(self.stage, str) else (self.stage or []):
            argv += ["--stage", name]
        argv += self.args
        log = open(self.log_path, "ab")  # owned by the process, closed when it exits
        self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"pipeline run exited with {self.proc.returncode}:\n{self.log()}")
            if self.get("/readyz")[0] == 200:
                return self
            time.sleep(0.2)
        raise AssertionError(f"pipeline run not ready after {ready_timeout}s:\n{self.log()}")

    def get(self, path: str, port: int | None = None) -> tuple[int, str]:
        """GET ``path`` on the health port (``port``: another one, e.g. a supervised child's)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port or self.http_port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except OSError:
            return 0, ""

    def metric(self, name: str, port: int | None = None, **labels: str) -> float:
        """Sum of the samples of ``name`` in /metrics that carry ``labels`` (0 when absent).
        Parsed with prometheus_client's own parser: series carry more labels than a test
        names (``topology`` on every one), in any order."""
        _, text = self.get("/metrics", port)
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    def metric_reaching(self, name: str, expected: float, timeout: float = 15.0, **labels: str) -> float:
        """``metric(name)`` once it is at least ``expected``, or its last value after ``timeout``.

        A stage counts a result or a dead letter when the broker acknowledges it, and a
        test's consumer can read the record before the producer's acknowledgement
        arrives: a count read the moment the outputs are seen may still be short by
        records in flight. The caller asserts equality on what this returns, so a count
        that overshoots still fails."""
        deadline = time.monotonic() + timeout
        value = self.metric(name, **labels)
        while value < expected and time.monotonic() < deadline:
            time.sleep(0.1)
            value = self.metric(name, **labels)
        return value

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def children(self) -> dict[int, int]:
        """``--processes N``: the supervisor's children that serve, health port -> pid. The
        port is the one each listens on (its command line may not say: the warm standby
        learns its index, and so its port, only when it replaces a crashed child); the
        standby, not listening yet, and a zombie, with no sockets, are left out."""
        listening = _listening_ports()
        found = {}
        for pid in Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split():
            ports = [listening[inode] for inode in _socket_inodes(int(pid)) if inode in listening]
            if ports:
                found[min(ports)] = int(pid)
        return found

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def terminate(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@contextlib.contextmanager
def pipeline_process(
    topology: TopologyFiles, env: dict[str, str], tmp_path: Path, stage: str | list[str] | None = None
) -> Iterator[PipelineProcess]:
    process = PipelineProcess(topology, env, tmp_path / f"run-{uuid.uuid4().hex[:6]}.log", stage).start()
    try:
        yield process
    finally:
        if process.proc is not None and process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait(timeout=10)


def collect_outputs(
    bootstrap: str,
    topology: TopologyFiles,
    done: Callable[[list[ConsumerRecord[bytes, bytes]]], bool],
    timeout: float,
) -> Collected:
    """Read the topology's result and dead-letter topics from the beginning until ``done``."""
    topics = [topology.result_topic, topology.dead_letter_topic]
    return asyncio.run(collect(bootstrap, topics, done=done, timeout=timeout))


def distinct_keys(n: int) -> Callable[[list[ConsumerRecord[bytes, bytes]]], bool]:
    """``done`` for :func:`collect_outputs`: ``n`` different keys seen (a replay repeats some)."""
    return lambda records: len({r.key for r in records}) >= n


def wait_until(condition: Callable[[], bool], what: str, process: PipelineProcess, timeout: float = 60.0) -> None:
    """Poll ``condition`` until true; past ``timeout`` fail naming ``what`` with the end of
    ``process``'s log (CI shows a part of a failure's output, and the cause is last)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:  # the log is read once, when it is needed
            tail = "\n".join(process.log().splitlines()[-40:])
            raise AssertionError(f"{what} not within {timeout:.0f}s; the log ends:\n{tail}")
        time.sleep(0.1)


def _socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets ``pid`` holds open (none once it exited)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:  # exited meanwhile
        pass
    return inodes


def _listening_ports() -> dict[int, int]:
    """Socket inode -> port, for every TCP socket listening on this host (``/proc/net/tcp*``)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                found[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    return found
