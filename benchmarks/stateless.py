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
(r) librdkafka echo       (a) with confluent-kafka's C clients: the transport's floor

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

import asyncio
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks import cli, phases, report
from benchmarks.common import (
    FEATURES,
    BenchmarkFailure,
    CaseResult,
    TopicCounter,
    WorkerProcess,
    check_complete,
    create_topics,
    index_by_id,
    latency_summary,
    latency_timeline,
    make_requests,
    produce_all,
    queue_verdict,
    read_topic,
)
from benchmarks.harness import StackBenchmark, StackUp, embedded_stack, finish
from benchmarks.metrics import Values, delta_mean, scrape_worker
from benchmarks.paced_producer import produce_paced
from benchmarks.report import fmt, verdict
from pipeline.contract.response import decode_response
from pipeline.kafka.clients import make_consumer
from pipeline.settings import Endpoints, KafkaSettings
from pipeline.topology.loader import load_topology

MODEL = "dense_classifier"
REPO = Path(__file__).resolve().parents[1]
BASE_TOPOLOGY = REPO / "topologies" / "dense.yaml"
PACKAGES = ("aiokafka", "tritonclient", "grpcio", "faust-streaming", "numpy", "protobuf")

CASES: dict[str, str] = {
    "a": "raw Kafka echo",
    "b": "direct Triton, no Kafka",
    "c": "naive worker",
    "d": "our stateless stage",
    "p": "(d) with per-record sends",
    "u": "(d) on asyncio's event loop",
    "h": "(d) holding partial batches",
    "g": "(d) with Python's default GC",
    "x": "(d) with delivery: exactly_once",
    "e": "faust echo agent",
    "r": "librdkafka echo",
}
VARIANTS_OF_D: dict[str, tuple[dict[str, str], dict[str, Any], dict[str, Any], str]] = {
    "p": ({"PIPELINE_KAFKA_BATCH_SENDS": "false"}, {}, {}, "the outbox's record batches against per-record sends"),
    "u": ({"PIPELINE_EVENT_LOOP": "asyncio"}, {}, {}, "uvloop against asyncio's event loop"),
    "h": (
        {}, {"hold_partial_batches": True}, {},
        "work-conserving batching against a partial batch always waiting max_queue_delay_ms (the rule before)",
    ),
    "g": ({"PIPELINE_GC": "default"}, {}, {}, "the stage's garbage-collector settings against Python's defaults"),
    "x": (
        {}, {}, {"delivery": "exactly_once"},
        "at-least-once against exactly-once transactions (needs a broker with transactions: PIPELINE_EMBEDDED_BROKER=kafka)",
    ),
}
"""(d) again with one setting changed (environment, batching, the topology's top level), in the
same run: what that setting gains (d / key in throughput; key / d in latency and CPU)."""
STAGE_CASES = "d" + "".join(VARIANTS_OF_D)
KAFKA_CASES = "ac" + STAGE_CASES + "er"
TARGET_VS_BOUND = 0.8  # d >= 0.8 * min(a, b)
TARGET_VS_NAIVE = 10.0  # d >= 10 * c
TARGET_CPU_US = 40.0  # issue 22: the stage's worker CPU per request
TARGET_VS_ECHO_CPU = 0.6  # issue 22: min(a, r) CPU per request / d's
TARGET_P50_VS_ECHO, TARGET_P99_VS_ECHO = 2.0, 3.0  # issue 22: d's latency / a's at one rate
SWEPT = "ad"  # the latency sweep's cases: the echo and the stage


def _sweeps(cfg: Config) -> bool:
    return bool(cfg.latency_sweep) and all(key in cfg.cases for key in SWEPT)

console = report.wide_console(132)

Verify = Callable[[dict[str, Any], dict[str, bytes]], None]


@dataclass(frozen=True)
class Config(phases.PhaseConfig):
    cases: str
    naive_requests: int
    faust_requests: int
    batch: int
    concurrency: int
    max_queue_delay_ms: float
    fetch_max_wait_ms: int | None
    latency_sweep: tuple[float, ...] = ()


@dataclass(eq=False)
class KafkaWorker(phases.Target):
    """One Kafka case's worker process and topics, measured by :mod:`benchmarks.phases`."""

    bench: Benchmark
    key: str
    requests: int
    source: str
    sink: str
    process: WorkerProcess
    verify: Verify
    notes: tuple[str, ...] = ()
    ready_s: float | None = None
    sent: int = 0
    counter: TopicCounter | None = None  # the sink's, while the case is measured
    result: CaseResult = field(init=False)

    def __post_init__(self) -> None:
        self.kafka: KafkaSettings = self.bench.kafka
        self.result = CaseResult(self.key, CASES[self.key], notes=list(self.notes))

    def new_requests(self, n: int, prefix: str, seed: int) -> phases.Requests:
        return phases.Requests(make_requests(n, prefix, seed=seed))

    async def wait(self, what: str) -> None:
        assert self.counter is not None
        await self.counter.wait_for(
            self.sent,
            stall_s=self.bench.config.stall_seconds,
            check_alive=self.process.check_alive,
            what=what,
        )

    async def collect(
        self, prefix: str, requests: phases.Requests, what: str, idle_s: float
    ) -> phases.Found:
        found, dups = index_by_id(
            await read_topic(self.kafka, self.sink, self.sent, idle_s=idle_s), f"{prefix}-"
        )
        check_complete(found, requests.records, f"({self.key}) {what}")
        self.verify(found, {r.key.decode(): r.value for r in requests.records if r.key})
        self.result.duplicates += dups
        return found

    def idle_workers(self) -> list[int]:
        return [p.pid for p in self.bench.processes if p is not self.process and p.running()]

    def probe(self, phase: str) -> Callable[[], dict[str, Any]]:
        """(d)'s own metrics around each latency attempt."""
        if self.key != "d" or phase != "latency":
            return dict
        before = _scrape_stage(self.process)
        return lambda: {"stage_metrics": _stage_breakdown(before, _scrape_stage(self.process))}


# =========================================================================== runner
class Benchmark(StackBenchmark[Config]):
    variant = ""
    """Suffix of a case's topics, topology (so its group) and log: ``benchmarks.processes``
    runs case (d) several times side by side."""

    def __init__(self, config: Config, up: StackUp) -> None:
        super().__init__(config, up)
        self.processes: list[WorkerProcess] = []  # every worker started (CPU accounting)
        self.worker_env: dict[str, str] = {}  # extra environment of (d), e.g. OTEL_* (benchmarks.tracing)

    def topic(self, key: str, what: str) -> str:
        return f"bench.{self.run_id}.{key}{self.variant}.{what}"

    def run_args(self) -> list[str]:
        """More options of (d)'s `pipeline run` (``benchmarks.processes`` adds ``--processes``)."""
        return []

    # ------------------------------------------------------------------ (b)
    async def direct_triton(self) -> CaseResult:
        from tritonclient.grpc import InferInput, InferRequestedOutput

        from pipeline.triton.client import aio_client

        cfg = self.config
        result = CaseResult("b", CASES["b"], unit="rows/s")
        assert self.endpoints.triton.grpc_url
        client = aio_client(self.endpoints.triton)
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
        elif key == "r":
            argv = [py, "-m", "benchmarks.workers", "rdecho", *common, *fetch]
            marker, n, verify = "READY", cfg.requests, _same_value
            notes = ("confluent-kafka (librdkafka), acks=all, linger 2 ms, commit every 0.5 s past acked offsets",)
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
        elif key in STAGE_CASES:
            dead = self.topic(key, "dead-letters")
            topics.append(dead)
            variant = self.variant
            self.variant += f"-{key}" if key != "d" else ""  # its own topology name: its own group
            try:
                _env, batching, top_level, _gain = VARIANTS_OF_D.get(key, ({}, {}, {}, ""))
                topology = self._write_topology(source, sink, dead, batching, top_level)
            finally:
                self.variant = variant
            runner = ["pipeline"]  # the stock CLI, unless a what-if asks for the patching runner
            if cfg.fetch_max_wait_ms is not None or os.environ.get("BENCH_STAGE_PATCH"):
                runner = ["benchmarks.stage_runner", *fetch]
            argv = [py, "-m", *runner, "run", str(topology), "--log-level", "warning", *self.run_args()]
            marker, n, verify = "running stages", cfg.requests, _valid_responses
            env = dict(self.worker_env)
            if key in VARIANTS_OF_D:  # (d) with one setting changed, in the same run
                env.update(VARIANTS_OF_D[key][0])
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
        process = WorkerProcess(f"{key}{self.variant}-{self.run_id}", argv, self.log_dir, marker, env=env)
        self.processes.append(process)
        return KafkaWorker(self, key, n, source, sink, process, verify, notes)

    def _write_topology(
        self, source: str, sink: str, dead: str, batching_changes: dict[str, Any], top_level: dict[str, Any]
    ) -> Path:
        """dense.yaml with this run's topics, endpoints, batch size and concurrency (and a
        variant's changes to its batching and its top-level settings)."""
        cfg = self.config
        data = yaml.safe_load(BASE_TOPOLOGY.read_text())
        data["name"] = f"bench-{self.run_id}{self.variant}"
        data["kafka"]["bootstrap_servers"] = self.kafka.bootstrap_servers
        data["triton"]["grpc_url"] = self.endpoints.triton.grpc_url
        data["input_topic"], data["result_topic"], data["dead_letter_topic"] = source, sink, dead
        data["metrics_topic"] = self.topic("d", "metrics")
        data["http_port"] = 0  # any free port: several runs share the machine
        batching = data["stages"][0]["batching"]
        batching["max_batch_size"] = cfg.batch
        batching["max_inflight_batches"] = cfg.concurrency
        batching["max_queue_delay_ms"] = cfg.max_queue_delay_ms
        batching.update(batching_changes)
        data.update(top_level)
        path = self.log_dir / f"topology-{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        load_topology(path)  # fail here, not in the child, if the file is wrong
        return path

    # ------------------------------------------------------------------ latency sweep
    async def latency_sweep(self, echo: KafkaWorker, stage: KafkaWorker, loads: tuple[float, ...]) -> list[dict[str, Any]]:
        """Issue 22 item 4: (a) and (d) at each fraction of (d)'s measured throughput, the same
        rate for both, the load produced by librdkafka in a process of its own
        (:mod:`benchmarks.paced_producer`) so the generator does not take the stage's CPU."""
        assert stage.result.throughput is not None
        rows = []
        for load in loads:
            rate = load * stage.result.throughput
            row: dict[str, Any] = {"load": load, "rate": rate}
            for worker in (echo, stage):
                async with TopicCounter(self.kafka, worker.sink) as worker.counter:
                    row[worker.key] = await phases.latency_at(
                        worker, rate, self.config.latency_seconds, f"s{round(load * 100)}", produce_paced
                    )
            console.print(
                f"    {load:.0%} ({rate:,.0f}/s): (a) p50 {row['a']['p50_ms']:.0f} / p99 {row['a']['p99_ms']:.0f} ms, "
                f"(d) p50 {row['d']['p50_ms']:.0f} / p99 {row['d']['p99_ms']:.0f} ms"
            )
            rows.append(row)
        return rows

    # ------------------------------------------------------------------ one Kafka case
    async def measure(self, worker: KafkaWorker) -> CaseResult:
        """Warm-up, throughput on frozen-then-thawed backlogs, then latency at a fixed rate."""
        cfg = self.config
        result, process = worker.result, worker.process
        result.extra["worker_ready_s"] = worker.ready_s
        result.extra["worker_log"] = str(process.log_path)
        async with TopicCounter(self.kafka, worker.sink) as worker.counter:
            # 1. Warm-up: group joined, partitions assigned, connections (and Triton) warm.
            warm = make_requests(cfg.warmup_requests, f"{worker.key}-w", seed=1)
            await produce_all(self.kafka, worker.source, warm)
            worker.sent += len(warm)
            result.extra["warmup_s"] = await worker.counter.wait_for(
                worker.sent,
                stall_s=max(cfg.stall_seconds, 60),
                check_alive=process.check_alive,
                what="warm-up results",
            )
            # 2. Throughput: freeze, pre-produce the backlog, thaw; window = thaw -> last result.
            size, profile = worker.requests, worker.key == "d"
            await phases.throughput(worker, cfg, self.services, size=size, profile=profile)
            # 3. Latency at a fixed offered rate; if the queue grew (saturated), halve it and retry.
            assert result.throughput is not None
            rate = min(result.throughput * cfg.latency_load, cfg.latency_max_rate)
            await phases.latency(worker, cfg, rate)
            if result.duplicates:
                result.notes.append(
                    f"{result.duplicates} duplicate results (at-least-once redelivery)"
                )
        if worker.key in STAGE_CASES:
            dead = await read_topic(self.kafka, self.topic(worker.key, "dead-letters"), 0, idle_s=0.3)
            if dead:
                raise BenchmarkFailure(
                    f"({worker.key}) {len(dead)} requests were dead-lettered (see {process.log_path})"
                )
        return result


# =========================================================================== verification
def _scrape_stage(process: WorkerProcess) -> Values:
    """The stage's own Prometheus histograms (sums and counts), from its /metrics endpoint."""
    return scrape_worker(process, lambda name: name.endswith(("_sum", "_count")))


def _stage_breakdown(before: Values, after: Values) -> dict[str, float]:
    """Means over one phase, from the difference of two scrapes."""
    out = {
        "end_to_end_mean_ms": delta_mean(
            before, after, "pipeline_end_to_end_latency_seconds", scale=1000.0
        ),
        "queue_delay_mean_ms": delta_mean(
            before, after, "pipeline_queue_delay_seconds", scale=1000.0
        ),
        "triton_call_mean_ms": delta_mean(
            before, after, "pipeline_triton_request_duration_seconds", scale=1000.0
        ),
        "batch_rows_mean": delta_mean(before, after, "pipeline_batch_size"),
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
    out: dict[str, Any] = {}
    a, b, c, d = (report.throughput_of(results, key) for key in "abcd")
    if d is not None and a is not None and b is not None:
        bound = min(a, b)
        out["d_over_min_a_b"] = d / bound
        out["d_over_min_a_b_target"] = TARGET_VS_BOUND
        out["d_over_min_a_b_met"] = d / bound >= TARGET_VS_BOUND
        out["min_a_b_is"] = "a" if a <= b else "b"
    # Issue 22's targets, on worker CPU per request (what the stage itself spends): the stage
    # against the aiokafka echo (a) and the librdkafka echo (r), and its absolute bound.
    cpu = {key: _cpu_us_per_request(results.get(key)) for key in "adrx"}
    if cpu["d"] is not None and cpu["x"] is not None:
        out["x_cpu_over_d_cpu"] = cpu["x"] / cpu["d"]  # what exactly-once costs per request
    if (stage_cpu := cpu["d"]) is not None:
        out["d_cpu_us_per_request"] = stage_cpu
        out["d_cpu_target_us"] = TARGET_CPU_US
        out["d_cpu_met"] = stage_cpu <= TARGET_CPU_US
        for key in "ar":
            if (echo_cpu := cpu[key]) is not None:
                out[f"{key}_cpu_over_d_cpu"] = echo_cpu / stage_cpu  # 1.0: the stage costs no more than the echo
        floors = [cost for key in "ar" if (cost := cpu[key]) is not None]
        if floors:
            ratio = min(floors) / stage_cpu
            out["echo_cpu_over_d_cpu"] = ratio
            out["echo_cpu_over_d_cpu_target"] = TARGET_VS_ECHO_CPU
            out["echo_cpu_over_d_cpu_met"] = ratio >= TARGET_VS_ECHO_CPU
    sweep = results["d"].extra.get("latency_sweep") if "d" in results else None
    if sweep:
        out["latency_sweep"] = [
            {
                "load": row["load"],
                "rate": row["rate"],
                "p50_d_over_a": row["d"]["p50_ms"] / max(row["a"]["p50_ms"], 1.0),
                "p99_d_over_a": row["d"]["p99_ms"] / max(row["a"]["p99_ms"], 1.0),
                "met": row["d"]["p50_ms"] <= TARGET_P50_VS_ECHO * max(row["a"]["p50_ms"], 1.0)
                and row["d"]["p99_ms"] <= TARGET_P99_VS_ECHO * max(row["a"]["p99_ms"], 1.0),
            }
            for row in sweep
        ]
    for key in VARIANTS_OF_D:
        if d is not None and (variant := report.throughput_of(results, key)) is not None:
            out[f"d_over_{key}"] = d / variant  # what the setting gains, same run
        ours, theirs = results.get("d"), results.get(key)
        for q in ("p50_ms", "p99_ms"):
            if ours is not None and theirs is not None and getattr(ours, q) and getattr(theirs, q):
                out[f"{key}_over_d_{q}"] = getattr(theirs, q) / getattr(ours, q)  # latency the setting saves
    if d is not None and c is not None:
        out["d_over_c"] = d / c
        out["d_over_c_target"] = TARGET_VS_NAIVE
        out["d_over_c_met"] = d / c >= TARGET_VS_NAIVE
    return out


def _cpu_us_per_request(result: CaseResult | None) -> float | None:
    """A Kafka case's worker CPU per request in its last throughput round (None: not measured)."""
    rounds = result.extra.get("throughput_rounds") if result is not None and result.error is None else None
    value = rounds[-1].get("worker_cpu_us_per_request") if rounds else None
    return float(value) if value is not None else None


def print_report(
    meta: dict[str, Any], config: Config, results: dict[str, CaseResult], rat: dict[str, Any]
) -> None:
    m = meta["machine"]
    v = meta["versions"]
    console.print(
        f"\n[bold]Stateless stage benchmark[/]  {m['date']}\n"
        f"{report.machine_line(m)}; broker, Triton, workers and the measuring process share them\n"
        f"{report.versions_line(v, 'aiokafka', 'tritonclient', 'faust-streaming')}\n"
        f"model {MODEL} (16 FP32 -> 4 logits, 1 row/request, {meta['request_bytes']} B request values); "
        f"batch {config.batch}, concurrency {config.concurrency}; consumer fetch_max_wait_ms "
        + (
            f"{config.fetch_max_wait_ms} (what-if override)"
            if config.fetch_max_wait_ms is not None
            else f"{meta['project_consumer']['fetch_max_wait_ms']} (the project's default)"
        )
    )
    table = report.case_table(
        ("case", "what", "N", "window s", "throughput", "worker CPU µs/req", "latency at")
        + ("p50 ms", "p99 ms")
    )
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
        rounds = r.extra.get("throughput_rounds")
        table.add_row(
            key,
            r.name,
            f"{r.requests:,}",
            fmt(r.window_s, 2),
            f"{fmt(r.throughput)} {r.unit}",
            fmt(rounds[-1].get("worker_cpu_us_per_request")) if rounds else "-",
            f"{fmt(r.latency_achieved_rate)}/s",
            fmt(r.p50_ms, digits),
            fmt(r.p99_ms, digits),
        )
        if r.notes:
            notes.append(f"({key}) " + "; ".join(r.notes))
    console.print(table)
    for note in notes:
        console.print(note)
    if "d_over_min_a_b" in rat:
        console.print(
            f"d / min(a, b) = {rat['d_over_min_a_b']:.2f}  (min is {rat['min_a_b_is']}; "
            f"target >= {TARGET_VS_BOUND}): {verdict(rat['d_over_min_a_b_met'])}"
        )
    for key, (_env, _batching, _top_level, gain) in VARIANTS_OF_D.items():
        if f"d_over_{key}" in rat:
            console.print(f"d / {key} = {rat[f'd_over_{key}']:.2f}  ({gain})")
        if f"{key}_cpu_over_d_cpu" in rat and key not in "ar":
            console.print(f"worker CPU per request {key} / d = {rat[f'{key}_cpu_over_d_cpu']:.2f}  ({gain})")
        if f"{key}_over_d_p50_ms" in rat:
            console.print(
                f"latency {key} / d: p50 {rat[f'{key}_over_d_p50_ms']:.2f}, "
                f"p99 {rat.get(f'{key}_over_d_p99_ms', float('nan')):.2f}  ({gain})"
            )
    if "d_cpu_us_per_request" in rat:
        console.print(
            f"worker CPU per request: d {rat['d_cpu_us_per_request']:.1f} µs (target <= {TARGET_CPU_US:g}): "
            f"{verdict(rat['d_cpu_met'])}"
            + "".join(
                f"; {key} / d = {rat[f'{key}_cpu_over_d_cpu']:.2f}" for key in "ar" if f"{key}_cpu_over_d_cpu" in rat
            )
            + (
                f"; min(a, r) / d = {rat['echo_cpu_over_d_cpu']:.2f} (target >= {TARGET_VS_ECHO_CPU:g}): "
                f"{verdict(rat['echo_cpu_over_d_cpu_met'])}"
                if "echo_cpu_over_d_cpu" in rat
                else ""
            )
        )
    for row, ratio in zip(results["d"].extra.get("latency_sweep") or [], rat.get("latency_sweep") or [], strict=True):
        console.print(
            f"latency at {row['load']:.0%} of d's throughput ({row['rate']:,.0f}/s, librdkafka load): "
            f"p50 a {row['a']['p50_ms']:.0f} / d {row['d']['p50_ms']:.0f} ms = {ratio['p50_d_over_a']:.1f}x "
            f"(target <= {TARGET_P50_VS_ECHO:g}x), p99 a {row['a']['p99_ms']:.0f} / d {row['d']['p99_ms']:.0f} ms = "
            f"{ratio['p99_d_over_a']:.1f}x (target <= {TARGET_P99_VS_ECHO:g}x): {verdict(ratio['met'])}"
            + ("" if row["d"]["verdict"] == "ok" else f"; (d) {row['d']['verdict']}")
        )
    if "d_over_c" in rat:
        console.print(
            f"d / c = {rat['d_over_c']:.1f}  (target >= {TARGET_VS_NAIVE:g}): "
            f"{verdict(rat['d_over_c_met'])}"
        )
    report.print_profile(
        console,
        "(d) py-spy, last throughput round",
        results["d"].extra.get("profile") if "d" in results else None,
        {"top self": "self_pct", "top inclusive": "inclusive_pct"},
        top=15,
    )
    console.print(
        "throughput: Kafka cases = N pre-produced requests / (worker thawed -> last result's timestamp); "
        "b = rows/s at saturation.\n"
        "latency: fixed-rate phase below saturation; Kafka cases = result ts - request ts (1 ms timestamps); "
        "b = per row, scheduled arrival -> result in hand."
    )


# =========================================================================== main
def parse_args(argv: list[str] | None) -> tuple[Config, Path | None]:
    p = cli.parser("stateless", __doc__)
    requests_help = (
        "backlog for a and d, rows for b (default 20000; grown while the window < --min-window)"
    )
    cli.add_shared(p, "--requests", requests={"default": 20_000, "help": requests_help})
    p.add_argument(
        "--naive-requests", type=int, help="backlog for c (default requests/10, min 300)"
    )
    p.add_argument("--faust-requests", type=int, help="backlog for e (default requests/2)")
    p.add_argument(
        "--concurrency",
        type=int,
        help="batches in flight for b and d (default: dense.yaml's max_inflight_batches)",
    )
    p.add_argument(
        "--batch", type=int, default=64, help="rows per Triton call for b and d (model max 64)"
    )
    p.add_argument(
        "--latency-sweep",
        default="0.5,0.7,0.9",
        help="after the cases: (a) and (d) at these fractions of (d)'s throughput, the load "
        "from a librdkafka producer in its own process (benchmarks/paced_producer.py); '' skips it",
    )
    p.add_argument(
        "--max-queue-delay-ms",
        type=float,
        help="batching delay for b and d (default: dense.yaml's)",
    )
    cli.add_shared(
        p,
        *("--latency-seconds", "--latency-load", "--latency-max-rate", "--latency-attempts"),
        *("--warmup-requests", "--min-window", "--max-requests", "--fetch-max-wait-ms"),
        *("--profile", "--cases", "--stall-seconds", "--json"),
        latency_attempts={"default": 3},
        max_requests={"default": 300_000},
        fetch_max_wait_ms={
            "help": "what-if: override the consumers' fetch_max_wait_ms in a, c and d "
            "(default: the project's, see pipeline/kafka/clients.py)"
        },
        profile={
            "help": "record case d's throughput rounds with py-spy (collapsed stacks) into DIR"
        },
        cases={"default": "abcde", "help": "which cases to run, e.g. 'abd' (default abcde)"},
    )
    a = p.parse_args(argv)
    base = yaml.safe_load(BASE_TOPOLOGY.read_text())["stages"][0]["batching"]
    config = cli.config_from(
        Config,
        a,
        cases="".join(cli.select_cases(p, a.cases, CASES)),
        naive_requests=a.naive_requests or max(300, a.requests // 10),
        faust_requests=a.faust_requests or max(300, a.requests // 2),
        concurrency=a.concurrency or int(base.get("max_inflight_batches") or 4),
        latency_sweep=tuple(float(x) for x in a.latency_sweep.split(",") if x.strip()),
        max_queue_delay_ms=(
            a.max_queue_delay_ms
            if a.max_queue_delay_ms is not None
            else float(base["max_queue_delay_ms"])
        ),
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
                if key in workers and not (key in SWEPT and _sweeps(cfg)):  # kept for the sweep
                    code = workers.pop(key).process.stop()
                    results[key].extra["worker_exit_code"] = code
            console.print(report.done_line(key, results[key], started, digits=2))
        if _sweeps(cfg) and all(key in workers and results[key].error is None for key in SWEPT):
            console.print(f"[bold]latency sweep[/] (a) and (d) at {', '.join(f'{x:.0%}' for x in cfg.latency_sweep)} of (d)'s throughput ...")
            results["d"].extra["latency_sweep"] = await bench.latency_sweep(workers["a"], workers["d"], cfg.latency_sweep)
    finally:
        for worker in workers.values():
            worker.process.stop(5)
    return results


def main(argv: list[str] | None = None) -> int:
    config, json_path = parse_args(argv)
    with embedded_stack(console, "stateless", PACKAGES) as up:
        up.meta["request_bytes"] = len(make_requests(1, "x-t")[0].value)
        up.meta["project_consumer"] = asyncio.run(_project_consumer_defaults(up.endpoints))
        results = asyncio.run(run_cases(Benchmark(config, up)))
    rat = ratios(results)
    print_report(up.meta, config, results, rat)
    failed = [k for k, r in results.items() if r.error is not None and not r.skipped]
    return finish(console, json_path, up, config, results, rat, failed)


if __name__ == "__main__":
    sys.exit(main())
