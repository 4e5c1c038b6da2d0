"""Stateless stage benchmark: our stage against the baselines it must be compared with.

    .venv/bin/python -m benchmarks.stateless [--requests N] [--concurrency C] [--batch B] [--json out.json]

One embedded stack (Tansu, moto S3, Triton 2.51 CPU) serves every case; the
model is ``dense_classifier`` (16 FP32 features -> 4 logits, one row per
request) and every Kafka case moves the same ~100-byte protobuf request records.

(a) raw Kafka echo        consumer -> producer, record unchanged, periodic commits after acks
(b) direct Triton         tritonclient.grpc.aio, batch B, C calls in flight, no Kafka
(c) naive worker          consume 1 -> decode -> infer 1 -> produce 1 -> await ack -> commit
(d) our stateless stage   ``python -m pipeline run`` on a dense.yaml-like topology
(e) faust echo agent      faust-streaming agent forwarding each event (optional)

Every worker is a child process (it never shares an event loop or a GIL with
the measuring process). All are started at once so their consumer-group joins
overlap, then measured one after the other:

1. warm-up: a few hundred requests through the worker (joined, connections warm);
2. throughput: the worker is frozen (SIGSTOP), N requests are pre-produced to its
   4-partition input topic, the worker is thawed (SIGCONT); throughput =
   N / (thaw -> timestamp of the last result). Repeated with a bigger backlog
   while that window is shorter than ``--min-window``;
3. latency: requests at a fixed rate (``--latency-load`` of the throughput, at
   most ``--latency-max-rate``) for ``--latency-seconds``; p50/p99 of (result
   timestamp - request timestamp). If the queue grows (saturated) the rate is
   halved and the phase repeated.

Every correlation ID must come back with a correct result, else the run fails
(exit 1). See benchmarks/README.md for the caveats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from benchmarks.common import (
    FEATURES,
    BenchmarkFailure,
    CaseResult,
    CpuMeter,
    TopicCounter,
    WorkerProcess,
    check_complete,
    create_topics,
    index_by_id,
    latency_summary,
    latency_timeline,
    machine_info,
    make_requests,
    package_versions,
    produce_all,
    produce_at_rate,
    queue_verdict,
    read_topic,
    tansu_version,
    triton_version,
)
from pipeline.contract.response import decode_response
from pipeline.embedded.stack import EmbeddedStack
from pipeline.kafka.clients import make_consumer
from pipeline.settings import Endpoints
from pipeline.topology.loader import load_topology

MODEL = "dense_classifier"
REPO = Path(__file__).resolve().parents[1]
BASE_TOPOLOGY = REPO / "topologies" / "dense.yaml"

CASES: dict[str, str] = {
    "a": "raw Kafka echo",
    "b": "direct Triton, no Kafka",
    "c": "naive worker",
    "d": "our stateless stage",
    "e": "faust echo agent",
}
KAFKA_CASES = "acde"
TARGET_VS_BOUND = 0.8  # d >= 0.8 * min(a, b)
TARGET_VS_NAIVE = 10.0  # d >= 10 * c

console = Console(width=max(Console().width, 132))

Verify = Callable[[dict[str, Any], dict[str, bytes]], None]


@dataclass(frozen=True)
class Config:
    requests: int
    naive_requests: int
    faust_requests: int
    batch: int
    concurrency: int
    max_queue_delay_ms: float
    latency_seconds: float
    latency_load: float
    latency_attempts: int
    latency_max_rate: float
    warmup_requests: int
    min_window_s: float
    max_requests: int
    fetch_max_wait_ms: int | None
    profile_dir: Path | None
    cases: str
    stall_seconds: float


@dataclass
class KafkaWorker:
    """One Kafka case's worker process and topics."""

    key: str
    requests: int
    source: str
    sink: str
    process: WorkerProcess
    verify: Verify
    notes: tuple[str, ...] = ()
    ready_s: float | None = None


# =========================================================================== runner
class Benchmark:
    def __init__(
        self,
        config: Config,
        endpoints: Endpoints,
        log_dir: Path,
        services: dict[str, int] | None = None,
    ) -> None:
        self.services: dict[str, int | list[int]] = dict(services or {})  # stack groups, for CPU
        self.processes: list[WorkerProcess] = []  # every worker started (CPU accounting)
        self.config = config
        self.endpoints = endpoints
        self.kafka = endpoints.kafka
        self.log_dir = log_dir
        self.run_id = f"{int(time.time()) % 1_000_000:06d}{secrets.token_hex(2)}"

    def topic(self, key: str, what: str) -> str:
        return f"bench.{self.run_id}.{key}.{what}"

    # ------------------------------------------------------------------ (b)
    async def direct_triton(self) -> CaseResult:
        import tritonclient.grpc.aio as triton_aio
        from tritonclient.grpc import InferInput, InferRequestedOutput

        cfg = self.config
        result = CaseResult("b", CASES["b"], unit="rows/s")
        assert self.endpoints.triton.grpc_url
        client = triton_aio.InferenceServerClient(self.endpoints.triton.grpc_url)
        rng = np.random.default_rng(1)
        rows = [rng.standard_normal((1, FEATURES), dtype=np.float32) for _ in range(4096)]

        async def infer(n: int, start: int) -> None:
            # Rows arrive as separate (1, 16) arrays, as they do in the stage: concatenate, send, split.
            data = np.concatenate([rows[(start + i) % len(rows)] for i in range(n)], axis=0)
            tensor = InferInput("features", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            response = await client.infer(MODEL, [tensor], outputs=[InferRequestedOutput("logits")])
            logits = response.as_numpy("logits")
            if logits is None or logits.shape != (n, 4):
                raise BenchmarkFailure(
                    f"direct Triton: logits shape {None if logits is None else logits.shape}"
                )
            _ = [logits[i : i + 1] for i in range(n)]  # split per request, as a worker must

        try:
            for _ in range(10):
                await infer(cfg.batch, 0)
            # Throughput: C callers keep batches of B rows in flight until N rows (and >= 3 s) are done.
            done_rows = 0
            call_ms: list[float] = []
            started = time.perf_counter()

            async def caller() -> None:
                nonlocal done_rows
                while done_rows < cfg.requests or time.perf_counter() - started < 3.0:
                    done_rows += cfg.batch
                    t0 = time.perf_counter()
                    await infer(cfg.batch, done_rows)
                    call_ms.append((time.perf_counter() - t0) * 1000)

            await asyncio.gather(*(caller() for _ in range(cfg.concurrency)))
            elapsed = time.perf_counter() - started
            result.requests = done_rows
            result.window_s = elapsed
            result.throughput = done_rows / elapsed
            result.extra["saturated_call_ms_p50"] = float(np.percentile(call_ms, 50))
            result.extra["saturated_call_ms_p99"] = float(np.percentile(call_ms, 99))
            result.extra["calls"] = len(call_ms)

            # Latency: rows arrive on a fixed schedule; batch up to B rows or max_queue_delay,
            # at most C calls in flight; latency = result available - row's scheduled arrival.
            rate = min(result.throughput * cfg.latency_load, cfg.latency_max_rate)
            total = max(50, int(rate * cfg.latency_seconds))
            delay_s = cfg.max_queue_delay_ms / 1000
            slots = asyncio.Semaphore(cfg.concurrency)
            timed: list[tuple[float, float]] = []  # (arrival, latency ms)
            tasks: set[asyncio.Task[None]] = set()

            async def send(arrivals: list[float]) -> None:
                async with slots:
                    await infer(len(arrivals), len(timed))
                now = time.perf_counter()
                timed.extend((a, (now - a) * 1000) for a in arrivals)

            def dispatch(arrivals: list[float]) -> None:
                task = asyncio.create_task(send(arrivals))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

            t0 = time.perf_counter()
            arrived = 0
            pending: list[float] = []
            while arrived < total or pending:
                now = time.perf_counter()
                due = min(total, int((now - t0) * rate) + 1)
                while arrived < due:
                    pending.append(t0 + arrived / rate)
                    arrived += 1
                while len(pending) >= cfg.batch:
                    dispatch(pending[: cfg.batch])
                    pending = pending[cfg.batch :]
                if pending and (now - pending[0] >= delay_s or arrived >= total):
                    dispatch(pending)
                    pending = []
                await asyncio.sleep(0.0005)
            achieved = total / (time.perf_counter() - t0)
            while tasks:
                await asyncio.gather(*list(tasks))
            timed.sort()
            sent_ms = [a * 1000 for a, _ in timed]
            latencies = [latency for _, latency in timed]
            result.latency_offered_rate = rate
            result.latency_achieved_rate = achieved
            latency_summary(result, latencies)
            result.extra["latency_timeline_p50_ms"] = latency_timeline(sent_ms, latencies)
            verdict = queue_verdict(sent_ms, latencies, achieved, rate)
            if verdict != "ok":
                result.notes.append(f"latency phase saturated: {verdict}")
            result.notes.append(
                f"batch {cfg.batch}, {cfg.concurrency} in flight; latency batches up to {cfg.batch} rows "
                f"or {cfg.max_queue_delay_ms:g} ms, perf_counter clock"
            )
        finally:
            await client.close()
        return result

    # ------------------------------------------------------------------ Kafka workers
    async def launch(self, key: str) -> KafkaWorker:
        """Create the case's topics and start its worker (without waiting for it)."""
        cfg = self.config
        source, sink = self.topic(key, "requests"), self.topic(key, "results")
        topics = [source, sink]
        py = sys.executable
        bootstrap = str(self.kafka.bootstrap_servers)
        fetch = (
            []
            if cfg.fetch_max_wait_ms is None
            else ["--fetch-max-wait-ms", str(cfg.fetch_max_wait_ms)]
        )
        common = [
            "--bootstrap",
            bootstrap,
            "--input",
            source,
            "--output",
            sink,
            "--group",
            f"bench-{self.run_id}-{key}",
        ]
        env: dict[str, str] = {}
        if key == "a":
            argv = [py, "-m", "benchmarks.workers", "echo", *common, *fetch]
            marker, n, verify = "READY", cfg.requests, _same_value
            notes: tuple[str, ...] = (
                "aiokafka, acks=all, linger 2 ms, commit every 0.5 s past acked offsets",
            )
        elif key == "c":
            argv = [
                py,
                "-m",
                "benchmarks.workers",
                "naive",
                *common,
                "--triton",
                str(self.endpoints.triton.grpc_url),
                *fetch,
            ]
            marker, n, verify = "READY", cfg.naive_requests, _valid_responses
            notes = ("decode -> infer(batch 1) -> encode -> send_and_wait -> commit, per record",)
        elif key == "d":
            dead = self.topic("d", "dead-letters")
            topics.append(dead)
            topology = self._write_topology(source, sink, dead)
            runner = ["pipeline"]  # the stock CLI, unless a what-if asks for the patching runner
            if cfg.fetch_max_wait_ms is not None or os.environ.get("BENCH_STAGE_PATCH"):
                runner = ["benchmarks.stage_runner", *fetch]
            argv = [py, "-m", *runner, "run", str(topology), "--log-level", "warning"]
            marker, n, verify = "running stages", cfg.requests, _valid_responses
            notes = (
                (
                    f"`python -m pipeline run` child process; max_batch_size {cfg.batch}, "
                    f"{cfg.concurrency} batches in flight, {cfg.max_queue_delay_ms:g} ms max queue delay"
                ),
            )
        elif key == "e":
            argv = [py, "-m", "benchmarks.faust_echo", "worker", "-l", "warn", "--without-web"]
            env = {
                "BENCH_BOOTSTRAP": bootstrap,
                "BENCH_INPUT": source,
                "BENCH_OUTPUT": sink,
                "BENCH_APP_ID": f"bench-{self.run_id}-e",
                "BENCH_DATADIR": str(self.log_dir / f"faust-{self.run_id}"),
            }
            marker, n, verify = "READY", cfg.faust_requests, _same_value
            notes = ("faust defaults (fetch_max_wait 1.5 s hard-coded), raw serializers, acks=all",)
        else:
            raise ValueError(key)
        await create_topics(self.kafka, topics)
        process = WorkerProcess(f"{key}-{self.run_id}", argv, self.log_dir, marker, env=env)
        self.processes.append(process)
        return KafkaWorker(key, n, source, sink, process, verify, notes)

    def _start_profiler(
        self, key: str, process: WorkerProcess, round_no: int
    ) -> tuple[subprocess.Popen[bytes], Path] | None:
        """``--profile DIR``: py-spy (CPU samples, collapsed stacks) on the stage during a throughput round."""
        if self.config.profile_dir is None or key != "d":
            return None
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(spy).exists():
            raise BenchmarkFailure("--profile needs py-spy: .venv/bin/pip install py-spy")
        self.config.profile_dir.mkdir(parents=True, exist_ok=True)
        out = self.config.profile_dir / f"{key}-throughput-round{round_no}.txt"
        proc = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(process.pid),
                "--rate",
                "250",
                "--nonblocking",
                "--format",
                "raw",
                "--output",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # let py-spy attach before the round starts
        return proc, out

    def _write_topology(self, source: str, sink: str, dead: str) -> Path:
        """dense.yaml with this run's topics, endpoints, batch size and concurrency."""
        cfg = self.config
        data = yaml.safe_load(BASE_TOPOLOGY.read_text())
        data["name"] = f"bench-{self.run_id}"
        data["kafka"]["bootstrap_servers"] = self.kafka.bootstrap_servers
        data["triton"]["grpc_url"] = self.endpoints.triton.grpc_url
        data["input_topic"], data["result_topic"], data["dead_letter_topic"] = source, sink, dead
        data["metrics_topic"] = self.topic("d", "metrics")
        batching = data["stages"][0]["batching"]
        batching["max_batch_size"] = cfg.batch
        batching["max_inflight_batches"] = cfg.concurrency
        batching["max_queue_delay_ms"] = cfg.max_queue_delay_ms
        path = self.log_dir / f"topology-{self.run_id}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        load_topology(path)  # fail here, not in the child, if the file is wrong
        return path

    # ------------------------------------------------------------------ one Kafka case
    async def measure(self, worker: KafkaWorker) -> CaseResult:
        """Warm-up, throughput on frozen-then-thawed backlogs, then latency at a fixed rate."""
        cfg = self.config
        key, source, sink, verify = worker.key, worker.source, worker.sink, worker.verify
        process = worker.process
        result = CaseResult(key, CASES[key], notes=list(worker.notes))
        result.extra["worker_ready_s"] = worker.ready_s
        result.extra["worker_log"] = str(process.log_path)
        alive = process.check_alive
        sent = 0
        async with TopicCounter(self.kafka, sink) as counter:
            # 1. Warm-up: group joined, partitions assigned, connections (and Triton) warm.
            warm = make_requests(cfg.warmup_requests, f"{key}-w", seed=1)
            await produce_all(self.kafka, source, warm)
            sent += len(warm)
            result.extra["warmup_s"] = await counter.wait_for(
                sent, stall_s=max(cfg.stall_seconds, 60), check_alive=alive, what="warm-up results"
            )

            # 2. Throughput: freeze, pre-produce the backlog, thaw; window = thaw -> last result.
            rounds: list[dict[str, Any]] = []
            size = worker.requests
            for round_no in range(4):
                prefix = f"{key}-t{round_no}"
                backlog = make_requests(size, prefix, seed=2 + round_no)
                spy = self._start_profiler(key, process, round_no)
                idle = [p.pid for p in self.processes if p is not process and p.running()]
                cpu = CpuMeter({"worker": process.pid, **self.services, "idle_workers": idle})
                process.freeze()
                try:
                    produce_s = await produce_all(self.kafka, source, backlog)
                    sent += size
                finally:
                    cpu.start()
                    thawed_at = time.time()
                    process.thaw()
                try:
                    await counter.wait_for(sent, stall_s=cfg.stall_seconds, check_alive=alive)
                finally:
                    usage = cpu.stop()
                    if spy is not None:
                        result.extra["profile"] = stop_profiler(*spy)
                found, dups = index_by_id(
                    await read_topic(self.kafka, sink, sent, idle_s=0.2), f"{prefix}-"
                )
                check_complete(found, backlog, f"({key}) throughput phase")
                verify(found, {r.key.decode(): r.value for r in backlog if r.key})
                result.duplicates += dups
                stamps = [r.timestamp for r in found.values()]
                window = max(stamps) / 1000 - thawed_at
                rounds.append(
                    {
                        "requests": size,
                        "window_s": window,
                        "first_result_after_s": min(stamps) / 1000 - thawed_at,
                        "throughput": size / window,
                        "preproduce_rate": size / produce_s,
                        "frozen_s": produce_s,
                        # CPU used from thaw until the count was seen complete (polls every ~0.1 s).
                        "cpu": usage,
                        "worker_cpu_us_per_request": round(usage["worker_cpu_s"] / size * 1e6, 1),
                    }
                )
                result.requests, result.window_s, result.throughput = size, window, size / window
                if window >= cfg.min_window_s or size >= cfg.max_requests:
                    break
                size = min(
                    cfg.max_requests, math.ceil(size * 1.3 * cfg.min_window_s / max(window, 0.05))
                )
            result.extra["throughput_rounds"] = rounds
            last_cpu = rounds[-1]["cpu"]
            if last_cpu["other_cpu_s"] > 0.25 * last_cpu["wall_s"]:
                result.notes.append(
                    f"[yellow]other jobs used {last_cpu['other_cpu_s']:.1f} CPU-s of the machine during the "
                    f"{last_cpu['wall_s']:.1f} s window: throughput disturbed[/]"
                )
            if max(r["frozen_s"] for r in rounds) > 5.0:
                result.notes.append(
                    "worker frozen > 5 s: near the 10 s session timeout, a rebalance may be in the window"
                )
            if result.window_s is not None and result.window_s < cfg.min_window_s:
                result.notes.append(f"window only {result.window_s:.2f}s (raise --max-requests)")

            # 3. Latency at a fixed offered rate; if the queue grew (saturated), halve it and retry.
            assert result.throughput is not None
            attempts: list[dict[str, Any]] = []
            rate = min(result.throughput * cfg.latency_load, cfg.latency_max_rate)
            for attempt in range(cfg.latency_attempts):
                before = _scrape_stage(process) if key == "d" else None
                m = max(50, int(rate * cfg.latency_seconds))
                prefix = f"{key}-l{attempt}"
                timed = make_requests(m, prefix, seed=10 + attempt)
                achieved = await produce_at_rate(self.kafka, source, timed, rate)
                sent += m
                await counter.wait_for(sent, stall_s=cfg.stall_seconds, check_alive=alive)
                found, dups = index_by_id(
                    await read_topic(self.kafka, sink, sent, idle_s=0.3), f"{prefix}-"
                )
                check_complete(found, timed, f"({key}) latency phase at {rate:.0f}/s")
                verify(found, {r.key.decode(): r.value for r in timed if r.key})
                result.duplicates += dups
                inputs, _ = index_by_id(
                    await read_topic(self.kafka, source, sent, idle_s=0.1), f"{prefix}-"
                )
                ordered = sorted(found, key=lambda cid: inputs[cid].timestamp)
                latencies = [found[cid].timestamp - inputs[cid].timestamp for cid in ordered]
                sent_at = [inputs[cid].timestamp for cid in ordered]
                verdict = queue_verdict(sent_at, latencies, achieved, rate)
                attempts.append(
                    {
                        "timeline_p50_ms": latency_timeline(sent_at, latencies),
                        "offered": rate,
                        "achieved": achieved,
                        "requests": m,
                        "p50_ms": float(np.percentile(latencies, 50)),
                        "p99_ms": float(np.percentile(latencies, 99)),
                        "verdict": verdict,
                    }
                )
                if before is not None:
                    attempts[-1]["stage_metrics"] = _stage_breakdown(before, _scrape_stage(process))
                result.latency_offered_rate, result.latency_achieved_rate = rate, achieved
                latency_summary(result, latencies)
                if verdict == "ok":
                    break
                rate /= 2
            result.extra["latency_attempts"] = attempts
            _latency_notes(result, attempts)
            if result.duplicates:
                result.notes.append(
                    f"{result.duplicates} duplicate results (at-least-once redelivery)"
                )
        if key == "d":
            dead = await read_topic(self.kafka, self.topic("d", "dead-letters"), 0, idle_s=0.3)
            if dead:
                raise BenchmarkFailure(
                    f"(d) {len(dead)} requests were dead-lettered (see {process.log_path})"
                )
        return result


def _latency_notes(result: CaseResult, attempts: list[dict[str, Any]]) -> None:
    if attempts[-1]["verdict"] != "ok":
        result.notes.append(
            f"latency phase saturated even at {attempts[-1]['offered']:.0f}/s: {attempts[-1]['verdict']}"
        )
    elif len(attempts) > 1:
        result.notes.append(
            "higher latency rates saturated ("
            + "; ".join(f"{a['offered']:.0f}/s: {a['verdict']}" for a in attempts[:-1])
            + ")"
        )


def stop_profiler(proc: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    return {"collapsed_stacks": str(out), **summarize_profile(out)}


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    if not path.exists():
        return {"samples": 0}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n

    def share(table: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        return [(name, round(100 * n / total, 1)) for name, n in ranked]

    return {"samples": total, "self_pct": share(own), "inclusive_pct": share(inclusive)}


# =========================================================================== verification
_METRICS_URL = re.compile(r"health/metrics on (http://\S+/metrics)")


def _scrape_stage(process: WorkerProcess) -> dict[str, float]:
    """The stage's own Prometheus histograms (sums and counts), from its /metrics endpoint."""
    found = _METRICS_URL.search(process.log_path.read_text(errors="replace"))
    if not found:
        return {}
    try:
        with urllib.request.urlopen(found.group(1), timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count")) and not sample.name.endswith("_created"):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def _stage_breakdown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Means over one phase, from the difference of two scrapes."""

    def mean(name: str, scale: float = 1000.0) -> float | None:
        count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        return round(total / count * scale, 2) if count > 0 else None

    out = {
        "end_to_end_mean_ms": mean("pipeline_end_to_end_latency_seconds"),
        "queue_delay_mean_ms": mean("pipeline_queue_delay_seconds"),
        "triton_call_mean_ms": mean("pipeline_triton_request_duration_seconds"),
        "batch_rows_mean": mean("pipeline_batch_size", 1.0),
    }
    return {k: v for k, v in out.items() if v is not None}


def _same_value(found: dict[str, Any], sent: dict[str, bytes]) -> None:
    wrong = [cid for cid, rec in found.items() if cid in sent and bytes(rec.value) != sent[cid]]
    if wrong:
        raise BenchmarkFailure(
            f"{len(wrong)} echoed records differ from their request (e.g. {wrong[0]})"
        )


def _valid_responses(found: dict[str, Any], sent: dict[str, bytes]) -> None:
    for cid, record in found.items():
        if cid not in sent:
            continue
        response = decode_response(record.value, list(record.headers or ()))
        logits = response.outputs.get("logits")
        if (
            response.correlation_id != cid
            or logits is None
            or logits.shape != (1, 4)
            or not np.isfinite(logits).all()
        ):
            raise BenchmarkFailure(
                f"result for {cid} is wrong: id {response.correlation_id}, logits {logits!r}"
            )


# =========================================================================== report
def ratios(results: dict[str, CaseResult]) -> dict[str, Any]:
    def tp(key: str) -> float | None:
        r = results.get(key)
        return r.throughput if r is not None and r.error is None else None

    out: dict[str, Any] = {}
    a, b, c, d = tp("a"), tp("b"), tp("c"), tp("d")
    if d is not None and a is not None and b is not None:
        bound = min(a, b)
        out["d_over_min_a_b"] = d / bound
        out["d_over_min_a_b_target"] = TARGET_VS_BOUND
        out["d_over_min_a_b_met"] = d / bound >= TARGET_VS_BOUND
        out["min_a_b_is"] = "a" if a <= b else "b"
    if d is not None and c is not None:
        out["d_over_c"] = d / c
        out["d_over_c_target"] = TARGET_VS_NAIVE
        out["d_over_c_met"] = d / c >= TARGET_VS_NAIVE
    return out


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def print_report(
    meta: dict[str, Any], config: Config, results: dict[str, CaseResult], rat: dict[str, Any]
) -> None:
    m = meta["machine"]
    v = meta["versions"]
    console.print(
        f"\n[bold]Stateless stage benchmark[/]  {m['date']}\n"
        f"machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}; broker, Triton, workers and the measuring process share them\n"
        f"versions: Triton {v['triton_server']}, {v['tansu']}, aiokafka {v['aiokafka']}, "
        f"tritonclient {v['tritonclient']}, faust-streaming {v['faust-streaming']}\n"
        f"model {MODEL} (16 FP32 -> 4 logits, 1 row/request, {meta['request_bytes']} B request values); "
        f"batch {config.batch}, concurrency {config.concurrency}; consumer fetch_max_wait_ms "
        + (
            f"{config.fetch_max_wait_ms} (what-if override)"
            if config.fetch_max_wait_ms is not None
            else f"{meta['project_consumer']['fetch_max_wait_ms']} (the project's default)"
        )
    )
    table = Table()
    for name, justify in (
        ("case", "left"),
        ("what", "left"),
        ("N", "right"),
        ("window s", "right"),
        ("throughput", "right"),
        ("worker CPU µs/req", "right"),
        ("latency at", "right"),
        ("p50 ms", "right"),
        ("p99 ms", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    notes: list[str] = []
    for key in CASES:
        r = results.get(key)
        if r is None:
            continue
        if r.error is not None:
            style = "yellow" if r.skipped else "bold red"
            table.add_row(
                key, r.name, str(r.requests or "-"), "-", f"[{style}]not measured[/]", "-", "-", "-"
            )
            notes.append(f"({key}) [{style}]{r.error}[/]")
            continue
        digits = 2 if key == "b" else 0
        table.add_row(
            key,
            r.name,
            f"{r.requests:,}",
            _fmt(r.window_s, 2),
            f"{_fmt(r.throughput, 0)} {r.unit}",
            _fmt(rounds[-1].get("worker_cpu_us_per_request"), 0)
            if (rounds := r.extra.get("throughput_rounds"))
            else "-",
            f"{_fmt(r.latency_achieved_rate, 0)}/s",
            _fmt(r.p50_ms, digits),
            _fmt(r.p99_ms, digits),
        )
        if r.notes:
            notes.append(f"({key}) " + "; ".join(r.notes))
    console.print(table)
    for note in notes:
        console.print(note)
    if "d_over_min_a_b" in rat:
        met = "[green]met[/]" if rat["d_over_min_a_b_met"] else "[bold red]NOT met[/]"
        console.print(
            f"d / min(a, b) = {rat['d_over_min_a_b']:.2f}  (min is {rat['min_a_b_is']}; "
            f"target >= {TARGET_VS_BOUND}): {met}"
        )
    if "d_over_c" in rat:
        met = "[green]met[/]" if rat["d_over_c_met"] else "[bold red]NOT met[/]"
        console.print(f"d / c = {rat['d_over_c']:.1f}  (target >= {TARGET_VS_NAIVE:g}): {met}")
    profile = results["d"].extra.get("profile") if "d" in results else None
    if profile and profile.get("samples"):
        console.print(
            f"\n[bold](d) py-spy, last throughput round[/] ({profile['samples']} samples, {profile['collapsed_stacks']})"
        )
        for title, rows in (("self", profile["self_pct"]), ("inclusive", profile["inclusive_pct"])):
            console.print(
                f"  top {title}: " + "; ".join(f"{pct}% {name}" for name, pct in rows[:15])
            )
    console.print(
        "throughput: Kafka cases = N pre-produced requests / (worker thawed -> last result's timestamp); "
        "b = rows/s at saturation.\n"
        "latency: fixed-rate phase below saturation; Kafka cases = result ts - request ts (1 ms timestamps); "
        "b = per row, scheduled arrival -> result in hand."
    )


# =========================================================================== main
def parse_args(argv: list[str] | None) -> tuple[Config, Path | None]:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.stateless", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--requests",
        type=int,
        default=20_000,
        help="backlog for a and d, rows for b (default 20000; grown while the window < --min-window)",
    )
    p.add_argument(
        "--naive-requests",
        type=int,
        default=None,
        help="backlog for c (default requests/10, min 300)",
    )
    p.add_argument(
        "--faust-requests", type=int, default=None, help="backlog for e (default requests/2)"
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="batches in flight for b and d (default: dense.yaml's max_inflight_batches)",
    )
    p.add_argument(
        "--batch", type=int, default=64, help="rows per Triton call for b and d (model max 64)"
    )
    p.add_argument(
        "--max-queue-delay-ms",
        type=float,
        default=None,
        help="batching delay for b and d (default: dense.yaml's)",
    )
    p.add_argument("--latency-seconds", type=float, default=4.0)
    p.add_argument(
        "--latency-load", type=float, default=0.5, help="fraction of measured throughput offered"
    )
    p.add_argument(
        "--latency-max-rate",
        type=float,
        default=5000.0,
        help="cap on the latency phase's rate, so fast cases compare at one load (req/s)",
    )
    p.add_argument(
        "--latency-attempts",
        type=int,
        default=3,
        help="halve the latency rate up to this many times while the phase saturates",
    )
    p.add_argument("--warmup-requests", type=int, default=200)
    p.add_argument(
        "--min-window",
        type=float,
        default=2.0,
        help="repeat the throughput phase with a bigger backlog until it lasts this long (s)",
    )
    p.add_argument("--max-requests", type=int, default=300_000, help="cap on that backlog")
    p.add_argument(
        "--fetch-max-wait-ms",
        type=int,
        default=None,
        help="what-if: override the consumers' fetch_max_wait_ms in a, c and d "
        "(default: the project's, see pipeline/kafka/clients.py)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="record case d's throughput rounds with py-spy (collapsed stacks) into DIR",
    )
    p.add_argument(
        "--cases", default="abcde", help="which cases to run, e.g. 'abd' (default abcde)"
    )
    p.add_argument(
        "--stall-seconds",
        type=float,
        default=30.0,
        help="fail when no result arrives for this long",
    )
    p.add_argument("--json", type=Path, default=None, help="write the raw numbers here")
    a = p.parse_args(argv)
    base = yaml.safe_load(BASE_TOPOLOGY.read_text())["stages"][0]["batching"]
    if not a.cases or not set(a.cases) <= set(CASES):
        p.error(f"--cases takes letters from {''.join(CASES)}")
    config = Config(
        requests=a.requests,
        naive_requests=a.naive_requests or max(300, a.requests // 10),
        faust_requests=a.faust_requests or max(300, a.requests // 2),
        batch=a.batch,
        concurrency=a.concurrency or int(base.get("max_inflight_batches") or 4),
        max_queue_delay_ms=(
            a.max_queue_delay_ms
            if a.max_queue_delay_ms is not None
            else float(base["max_queue_delay_ms"])
        ),
        latency_seconds=a.latency_seconds,
        latency_load=a.latency_load,
        latency_attempts=a.latency_attempts,
        latency_max_rate=a.latency_max_rate,
        warmup_requests=a.warmup_requests,
        min_window_s=a.min_window,
        max_requests=a.max_requests,
        fetch_max_wait_ms=a.fetch_max_wait_ms,
        profile_dir=a.profile,
        cases="".join(k for k in CASES if k in a.cases),
        stall_seconds=a.stall_seconds,
    )
    return config, a.json


async def _project_consumer_defaults(endpoints: Endpoints) -> dict[str, Any]:
    """What ``make_consumer`` configures today (the workers a, c and d all use it)."""
    consumer = make_consumer(endpoints.kafka, group_id=None)
    try:
        return {
            "fetch_max_wait_ms": consumer._fetch_max_wait_ms,
            "session_timeout_ms": consumer._session_timeout_ms,
        }
    finally:
        await consumer.stop()


def _report_progress(key: str, result: CaseResult, started: float) -> None:
    r = result
    console.print(
        f"    ({key}) done in {time.perf_counter() - started:.1f}s: "
        + (
            r.error
            or f"{_fmt(r.throughput, 0)} {r.unit}, p50 {_fmt(r.p50_ms, 2)} ms, p99 {_fmt(r.p99_ms, 2)} ms"
        )
    )


async def run_cases(bench: Benchmark) -> dict[str, CaseResult]:
    cfg = bench.config
    results: dict[str, CaseResult] = {}
    workers: dict[str, KafkaWorker] = {}
    try:
        # Start every Kafka worker now: their group joins (session_timeout / 2 on Tansu) overlap.
        for key in cfg.cases:
            if key in KAFKA_CASES:
                workers[key] = await bench.launch(key)
        if workers:
            console.print(
                f"started workers {', '.join(workers)}; waiting for their consumer groups ..."
            )
            readiness = await asyncio.gather(
                *(w.process.wait_ready() for w in workers.values()), return_exceptions=True
            )
            for (key, worker), ready in zip(list(workers.items()), readiness, strict=True):
                if isinstance(ready, BaseException):
                    first = str(ready).splitlines()[0]
                    results[key] = CaseResult(
                        key, CASES[key], error=f"could not start: {first}", skipped=key == "e"
                    )
                    results[key].extra["detail"] = str(ready)
                    console.print(f"[yellow]({key}) did not start:[/] {ready}")
                    worker.process.stop(5)
                    del workers[key]
                else:
                    worker.ready_s = float(ready)
                    console.print(f"    ({key}) ready after {ready:.1f}s")
        for key in cfg.cases:
            if key in results:
                continue
            console.print(f"[bold]({key})[/] {CASES[key]} ...")
            started = time.perf_counter()
            try:
                if key == "b":
                    results[key] = await bench.direct_triton()
                else:
                    results[key] = await bench.measure(workers[key])
            except BenchmarkFailure as exc:
                results[key] = CaseResult(key, CASES[key], error=f"FAILED: {exc}")
                console.print(f"[bold red]({key}) FAILED:[/] {exc}")
            finally:
                if key in workers:
                    code = workers.pop(key).process.stop()
                    results[key].extra["worker_exit_code"] = code
            _report_progress(key, results[key], started)
    finally:
        for worker in workers.values():
            worker.process.stop(5)
    return results


def main(argv: list[str] | None = None) -> int:
    config, json_path = parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-stateless-"))
    started = time.perf_counter()
    stack = EmbeddedStack(log_dir=log_dir / "stack")
    try:
        with console.status("starting the embedded stack") as status:
            endpoints = stack.start(progress=lambda msg: status.update(msg))
        assert endpoints.triton.grpc_url and endpoints.kafka.bootstrap_servers
        meta: dict[str, Any] = {
            "machine": machine_info(),
            "versions": {
                "triton_server": triton_version(endpoints.triton.grpc_url),
                "tansu": tansu_version(),
                **package_versions(
                    ["aiokafka", "tritonclient", "grpcio", "faust-streaming", "numpy", "protobuf"]
                ),
            },
            "request_bytes": len(make_requests(1, "x-t")[0].value),
            "log_dir": str(log_dir),
        }
        meta["project_consumer"] = asyncio.run(_project_consumer_defaults(endpoints))
        console.print(
            f"stack up: Kafka {endpoints.kafka.bootstrap_servers}, Triton {endpoints.triton.grpc_url}; logs in {log_dir}"
        )
        services = {p.name.split("-")[0]: p.pid for p in stack.processes if p.pid is not None}
        results = asyncio.run(run_cases(Benchmark(config, endpoints, log_dir, services)))
    finally:
        stack.stop()
    meta["total_seconds"] = time.perf_counter() - started
    rat = ratios(results)
    print_report(meta, config, results, rat)
    failed = [k for k, r in results.items() if r.error is not None and not r.skipped]
    if json_path is not None:
        payload = {
            "meta": meta,
            "config": config.__dict__,
            "cases": {k: r.as_dict() for k, r in results.items()},
            "ratios": rat,
            "failed": failed,
        }
        json_path.write_text(json.dumps(payload, indent=2, default=str))
        console.print(f"raw numbers written to {json_path}")
    console.print(f"total {meta['total_seconds']:.0f}s")
    if failed:
        console.print(f"[bold red]benchmark FAILED for case(s) {', '.join(failed)}[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
