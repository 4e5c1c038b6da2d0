"""Audio topology benchmark: VAD streams through Triton directly, and through the pipeline.

    .venv/bin/python -m benchmarks.audio [--streams S] [--seconds T] [--json out.json]
                                         [--cases abc] [--latency-seconds L] [--profile DIR]

One embedded stack (Tansu, moto S3, Triton 2.51 CPU) serves every case. The same
audio is used throughout: S streams of T seconds of 16 kHz speech (espeak-ng
utterances from ``tests/helpers/streams.utterance``, with 1 s of silence around
each, concatenated per stream), cut into 512-sample chunks, so one chunk is one
``silero_vad`` frame (the last one zero-padded, as the sequence stage does).

(a) direct Triton         S asyncio tasks, one stream each, ``tritonclient.grpc.aio``
                          ``infer("silero_vad", sequence_id, sequence_start/end)`` frame after
                          frame (each awaits the previous: a sequence is sequential); all
                          outputs requested, as the stage does. No Kafka. The ceiling. Its
                          window is short, so it runs 3 times and the median counts.
(b) audio topology        ``pipeline run`` (child process) on a copy of topologies/audio.yaml
                          with unique topics: DALI preprocess stage -> sequence (VAD) stage
(c) sequence stage alone  the same without the DALI stage: separates DALI's cost

Kafka cases, as in ``benchmarks.stateless``: the worker starts (the consumer
groups join), a short warm-up (min(S, 4) streams of 1 s) goes through it, then
the worker is frozen (SIGSTOP), all chunks of the S streams are pre-produced,
interleaved round-robin, to its 4-partition input topic, and the worker is
thawed (SIGCONT). Throughput = chunks / (thaw -> timestamp of the last stream
summary on the result topic). Freeze/thaw rather than "start the worker after
producing" keeps the consumer-group join (session_timeout / 2 = 5 s on Tansu for
a new group) out of a window of a few seconds; the window still includes the
consumers' first fetch after the thaw.

Checks (any failure exits 1): every stream's summary arrives, its ``chunks`` count
and its chunk results are exactly the chunks sent, nothing is dead-lettered, and
every per-chunk probability equals the one (a) got from Triton for the same
audio (|diff| <= 1e-5).

Latency (optional cheap phase, ``--latency-seconds``, 0 = off): S fresh streams
sent in real time (each stream one chunk every 32 ms, i.e. S x 31.25 chunks/s);
Kafka cases: result record timestamp - request record timestamp (ms clocks of
the same machine); (a): response received - the frame's scheduled send time.

Also reported per case: CPU seconds of the worker (client for a), Triton, the
broker and the rest of the machine (``other %``: other users' jobs on a shared
box; a large value means a disturbed window) from /proc; Triton's own counters
for ``silero_vad`` (requests per execution = the sequence batcher's mean batch,
queue and compute time per request); for b and c the stage's /metrics sampled
every 0.25 s (outbox backlog, fraction of the window the consumer was paused by
backpressure). ``--profile DIR`` records the worker with py-spy during the
throughput phase (collapsed stacks with line numbers) and prints the top frames.

Finally ``benchmarks.audio_preprocess`` runs (child process, its own table, the
stack stopped) and its DALI-vs-scipy ratios are summarised in this report: the
headline is its streaming-chunk workload (chunks-22k), the others are listed.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import yaml
from rich import box

from benchmarks import cli, report
from benchmarks.common import (
    BenchmarkFailure,
    CaseResult,
    CpuMeter,
    TopicReader,
    WorkerProcess,
    WorkerStartError,
    create_topics,
    latency_summary,
    produce_all,
    produce_at_rate,
    read_topic,
)
from benchmarks.harness import StackBenchmark, StackUp, embedded_stack, finish
from benchmarks.metrics import scrape, worker_metrics_url
from benchmarks.profiling import PySpy, summarize_profile_lines
from benchmarks.report import fmt, verdict
from pipeline.contract.records import Record
from pipeline.topology.loader import load_topology
from tests.helpers.kafka_io import header
from tests.helpers.streams import gather, stream_records, utterance
from tests.helpers.vad_reference import CHUNK, SAMPLE_RATE

MODEL = "silero_vad"
OUTPUTS = ("probability", "state_out", "context_out")
REPO = Path(__file__).resolve().parents[1]
BASE_TOPOLOGY = REPO / "topologies" / "audio.yaml"
PARTITIONS = 4
FRAME_S = CHUNK / SAMPLE_RATE  # 32 ms

CASES: dict[str, str] = {
    "a": "direct Triton sequences, no Kafka",
    "b": "audio topology (DALI + sequence)",
    "c": "sequence stage alone",
}
SHORT = {"a": "direct Triton (no Kafka)", "b": "DALI + sequence stages", "c": "sequence stage only"}
TARGET_B_OVER_A = 0.6  # issue 22 (0.7 before it)
TARGET_C_OVER_A = 0.8  # issue 22
TARGET_DALI_VS_SCIPY = 2.0
HEADLINE_WORKLOAD = "chunks-22k"  # audio_preprocess's streaming-chunk workload
PROBABILITY_ATOL = 1e-5
DIRECT_ROUNDS = 3
PACKAGES = ("nvidia-dali-cuda120", "tritonclient", "grpcio", "aiokafka", "numpy")

console = report.wide_console(150)


@dataclass(frozen=True)
class Config:
    streams: int
    seconds: float
    latency_seconds: float
    warmup_streams: int
    cases: str
    stall_seconds: float
    preprocess_repeats: int
    profile_dir: Path | None


# --------------------------------------------------------------------------- audio
def stream_audio(index: int, seconds: float) -> np.ndarray:
    """``seconds`` of 16 kHz speech for stream ``index``: utterances index, index+1, ... back to back."""
    want = max(1, round(seconds * SAMPLE_RATE))
    parts, have, i = [], 0, index
    while have < want:
        parts.append(utterance(i))
        have += parts[-1].size
        i += 1
    return np.concatenate(parts)[:want]


@dataclass
class StreamSet:
    """S streams: their keys, audio and request records (what every case sends)."""

    keys: list[str]
    audio: list[np.ndarray]
    records: list[list[Record]]

    @classmethod
    def make(cls, prefix: str, count: int, seconds: float) -> StreamSet:
        keys = [f"{prefix}-{i:03d}" for i in range(count)]
        audio = [stream_audio(i, seconds) for i in range(count)]
        return cls(
            keys, audio, [stream_records(k, a, CHUNK) for k, a in zip(keys, audio, strict=True)]
        )

    @property
    def chunks(self) -> int:
        return sum(len(r) for r in self.records)

    def interleaved(self) -> list[Record]:
        """Round-robin over the streams, as S concurrent clients produce."""
        out: list[Record] = []
        for i in range(max(len(r) for r in self.records)):
            out.extend(r[i] for r in self.records if i < len(r))
        return out


def frames_of(audio: np.ndarray) -> np.ndarray:
    """[n, 512]: the chunks as the sequence stage frames them (last one zero-padded)."""
    n = -(-audio.size // CHUNK)
    return np.pad(audio, (0, n * CHUNK - audio.size)).reshape(n, CHUNK)


class TritonStats:
    """``silero_vad``'s counters from Triton's /metrics, as deltas over a phase.

    Requests per execution is the sequence batcher's mean batch size; queue and
    compute are Triton's own per-request times (the rest of a call's round trip
    is the client, gRPC and, for b and c, the stage).
    """

    NAMES: ClassVar[dict[str, str]] = {
        "nv_inference_request_success": "requests",
        "nv_inference_exec_count": "executions",
        "nv_inference_request_duration_us": "request_us",
        "nv_inference_queue_duration_us": "queue_us",
        "nv_inference_compute_infer_duration_us": "infer_us",
    }

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._start: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        if not self.url:
            return {}
        values: dict[str, float] = {}
        # The parser adds _total to the counters' names.
        scraped = scrape(self.url, lambda n: n.removesuffix("_total") in self.NAMES, label="model")
        for (name, model), value in scraped.items():
            if model == MODEL:
                key = self.NAMES[name.removesuffix("_total")]
                values[key] = values.get(key, 0.0) + value
        return values

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> dict[str, float | None]:
        end = self._read()
        d = {k: end[k] - self._start.get(k, 0.0) for k in end}
        requests, executions = d.get("requests", 0.0), d.get("executions", 0.0)
        if not requests:
            return {}
        return {
            "requests": requests,
            "requests_per_execution": round(requests / executions, 2) if executions else None,
            "request_ms": round(d.get("request_us", 0.0) / requests / 1000, 3),
            "queue_ms": round(d.get("queue_us", 0.0) / requests / 1000, 3),
            "infer_ms_per_request": round(d.get("infer_us", 0.0) / requests / 1000, 3),
        }


def timeline(
    sent_s: Sequence[float], latencies: Sequence[float], step_s: float = 0.5
) -> list[float]:
    """Median latency per ``step_s`` of send time: flat = steady state, rising = a growing queue."""
    if not sent_s:
        return []
    t0 = min(sent_s)
    buckets: dict[int, list[float]] = defaultdict(list)
    for t, lat in zip(sent_s, latencies, strict=True):
        buckets[int((t - t0) / step_s)].append(lat)
    return [round(float(np.median(buckets[i])), 1) for i in sorted(buckets)]


class StageSampler:
    """Samples the worker's /metrics during a phase: outbox backlog and backpressure per stage.

    Tells a throughput limited by the stage's own bounds (``max_pending_requests``:
    the consumer paused) from one limited by per-stream round trips.
    """

    # Every second: each scrape renders the worker's whole /metrics, and at 0.25 s that was
    # 1.3 % of the sequence stage's CPU in (c)'s window (py-spy, 2026-11-28: the samples under
    # aiohttp and prometheus_client), counted against the stage's CPU per chunk.
    def __init__(self, process: WorkerProcess, interval_s: float = 1.0) -> None:
        self.url = worker_metrics_url(process)
        self.interval_s = interval_s
        self.samples: list[dict[str, float]] = []
        self._task: asyncio.Task[None] | None = None

    def _scrape(self) -> dict[str, float]:
        assert self.url is not None
        wanted = ("pipeline_pending_requests", "pipeline_consumer_paused")
        scraped = scrape(self.url, lambda name: name in wanted, timeout=2)
        return {
            f"{name.removeprefix('pipeline_')}:{stage}": v for (name, stage), v in scraped.items()
        }

    async def _run(self) -> None:
        while True:
            try:
                self.samples.append(await asyncio.to_thread(self._scrape))
            except OSError:
                pass
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self.url is not None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> dict[str, Any]:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        out: dict[str, Any] = {"samples": len(self.samples)}
        for name in sorted({k for s in self.samples for k in s}):
            values = [s[name] for s in self.samples if name in s]
            if name.startswith("consumer_paused"):
                out[name.replace("consumer_paused", "paused_fraction")] = round(
                    float(np.mean(values)), 2
                )
            else:
                out[name.replace("pending_requests", "max_pending")] = int(max(values))
        return out


# --------------------------------------------------------------------------- the benchmark
class Benchmark(StackBenchmark[Config]):
    def __init__(self, config: Config, up: StackUp) -> None:
        super().__init__(config, up)
        self.triton_stats = TritonStats(up.endpoints.triton.metrics_url)
        # The `pipeline` CLI the Kafka cases run (a what-if runner can stand in for it).
        self.worker_command = [sys.executable, "-m", "pipeline"]
        self.throughput_streams = StreamSet.make(
            f"tp-{self.run_id}", config.streams, config.seconds
        )
        # Probabilities (a) got for the throughput streams, by stream index: the oracle for b and c.
        self.direct_probabilities: list[np.ndarray] | None = None

    # ------------------------------------------------------------------ (a)
    async def direct_triton(self) -> CaseResult:
        from tritonclient.grpc import InferInput, InferRequestedOutput

        from pipeline.triton.client import aio_client

        cfg = self.config
        result = CaseResult("a", CASES["a"], unit="chunks/s")
        assert self.endpoints.triton.grpc_url
        client = aio_client(self.endpoints.triton)
        outputs = [InferRequestedOutput(name) for name in OUTPUTS]
        base_id = secrets.randbits(40) << 16  # unique sequence IDs per run (uint64 CORRID)

        async def infer(sequence: int, window: np.ndarray, start: bool, end: bool) -> float:
            data = np.ascontiguousarray(window, dtype=np.float32)[None, :]
            tensor = InferInput("audio", [1, CHUNK], "FP32")
            tensor.set_data_from_numpy(data)
            response = await client.infer(
                MODEL,
                [tensor],
                outputs=outputs,
                sequence_id=sequence,
                sequence_start=start,
                sequence_end=end,
            )
            probability = response.as_numpy("probability")
            if probability is None or probability.shape != (1, 1):
                raise BenchmarkFailure(
                    f"direct Triton: probability shape {getattr(probability, 'shape', None)}"
                )
            return float(probability[0, 0])

        async def stream(sequence: int, frames: np.ndarray) -> np.ndarray:
            probabilities = np.empty(len(frames), np.float32)
            for i, window in enumerate(frames):
                probabilities[i] = await infer(sequence, window, i == 0, i == len(frames) - 1)
            return probabilities

        try:
            await stream(base_id + 1, frames_of(stream_audio(2, 1.0)))  # warm-up: channel, model
            # Throughput: S sequences at once, each frame after the previous one. The window is
            # short, so it runs DIRECT_ROUNDS times (fresh sequences) and the median round counts.
            frames = [frames_of(a) for a in self.throughput_streams.audio]
            total = sum(len(f) for f in frames)
            rounds: list[dict[str, Any]] = []
            for round_no in range(DIRECT_ROUNDS):
                self.triton_stats.start()
                cpu = CpuMeter(dict(self.services))
                cpu.start()
                started = time.perf_counter()
                probabilities = await asyncio.gather(
                    *(stream(base_id + 1000 * (round_no + 1) + i, f) for i, f in enumerate(frames))
                )
                elapsed = time.perf_counter() - started
                used = cpu.stop()  # measurer_cpu_s: this process, i.e. the client
                rounds.append(
                    {
                        "window_s": elapsed,
                        "throughput": total / elapsed,
                        "cpu": used,
                        "triton": self.triton_stats.stop(),
                        "client_cpu_ms_per_chunk": round(used["measurer_cpu_s"] / total * 1000, 3),
                    }
                )
                if self.direct_probabilities is None:
                    self.direct_probabilities = list(probabilities)
                elif any(
                    float(np.max(np.abs(p - q))) > PROBABILITY_ATOL
                    for p, q in zip(probabilities, self.direct_probabilities, strict=True)
                ):
                    raise BenchmarkFailure("direct Triton: rounds gave different probabilities")
            median = sorted(rounds, key=lambda r: r["throughput"])[len(rounds) // 2]
            result.requests = total
            result.window_s = median["window_s"]
            result.throughput = median["throughput"]
            result.extra.update(
                {k: median[k] for k in ("cpu", "triton", "client_cpu_ms_per_chunk")}
            )
            result.extra["rounds_chunks_per_s"] = [round(r["throughput"]) for r in rounds]

            if cfg.latency_seconds > 0:
                # Real time: stream s sends frame i at t0 + (s / S + i) * 32 ms.
                n = max(2, int(cfg.latency_seconds / FRAME_S))
                lat_frames = [frames_of(a)[:n] for a in self.throughput_streams.audio]
                latencies: list[float] = []
                sent: list[float] = []
                t0 = time.perf_counter() + 0.05

                async def paced(s: int, fr: np.ndarray) -> None:
                    for i, window in enumerate(fr):
                        due = t0 + (s / cfg.streams + i) * FRAME_S
                        await asyncio.sleep(max(0.0, due - time.perf_counter()))
                        await infer(base_id + 10_000 + s, window, i == 0, i == len(fr) - 1)
                        latencies.append((time.perf_counter() - due) * 1000)
                        sent.append(due)

                await asyncio.gather(*(paced(s, f) for s, f in enumerate(lat_frames)))
                result.latency_offered_rate = cfg.streams / FRAME_S
                result.latency_achieved_rate = len(latencies) / (time.perf_counter() - t0)
                latency_summary(result, latencies)
                result.extra["latency_timeline_p50_ms"] = timeline(sent, latencies)
            result.notes.append(
                f"median of {DIRECT_ROUNDS} rounds {result.extra['rounds_chunks_per_s']}; "
                f"{cfg.streams} sequences at once, one frame in flight per sequence; "
                f"outputs {', '.join(OUTPUTS)} requested (as the stage does)"
            )
        finally:
            await client.close()
        return result

    # ------------------------------------------------------------------ (b), (c)
    def topology_file(self, tag: str, with_dali: bool) -> tuple[Path, dict[str, Any]]:
        """topologies/audio.yaml with this run's topics and endpoints (without DALI for c)."""
        data = yaml.safe_load(BASE_TOPOLOGY.read_text())
        name = f"bench-audio-{tag}"
        data["name"] = name
        data["kafka"]["bootstrap_servers"] = self.kafka.bootstrap_servers
        data["kafka"]["partitions"] = PARTITIONS
        data["triton"]["grpc_url"] = self.endpoints.triton.grpc_url
        data["input_topic"] = f"{name}.chunks"
        data["result_topic"] = f"{name}.results"
        data["dead_letter_topic"] = f"{name}.dead-letters"
        data["metrics_topic"] = f"{name}.metrics"
        data["http_port"] = 0
        if not with_dali:
            data["stages"] = [s for s in data["stages"] if s["kind"] != "dali"]
        path = self.log_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        load_topology(path)  # fail here, not in the child, if the file is wrong
        return path, data

    async def topology_case(self, key: str) -> CaseResult:
        cfg = self.config
        result = CaseResult(key, CASES[key], unit="chunks/s")
        tag = f"{self.run_id}-{key}{secrets.token_hex(2)}"  # fresh topics, groups and stream keys
        path, topo = self.topology_file(tag, with_dali=key == "b")
        source, sink, dead = topo["input_topic"], topo["result_topic"], topo["dead_letter_topic"]
        stages = " -> ".join(f"{s['name']} ({s['kind']})" for s in topo["stages"])
        await create_topics(self.kafka, [source, sink, dead], PARTITIONS)
        argv = [*self.worker_command, "run", str(path), "--log-level", "warning"]
        process = WorkerProcess(
            tag,
            argv,
            self.log_dir,
            "running stages",
            env=self.endpoints.environment(),
        )
        result.extra["worker_log"] = str(process.log_path)
        try:
            result.extra["worker_ready_s"] = round(await process.wait_ready(120.0), 2)
        except WorkerStartError as exc:
            process.stop(5)
            raise BenchmarkFailure(f"worker did not start: {exc}") from exc
        try:
            async with TopicReader(self.kafka, sink) as results:
                # 1. Warm-up: groups joined, partitions assigned, DALI and the Triton channel warm.
                warm = StreamSet.make(f"warm-{tag}", cfg.warmup_streams, 1.0)
                await produce_all(self.kafka, source, warm.interleaved())
                t_warm = time.monotonic()
                await self.wait_summaries(
                    results, warm.keys, process, "warm-up", stall_s=max(cfg.stall_seconds, 60)
                )
                result.extra["warmup_s"] = round(time.monotonic() - t_warm, 2)

                # 2. Throughput: freeze, pre-produce every chunk, thaw; window = thaw -> last summary.
                # The throughput audio under this case's own stream keys.
                streams = StreamSet.make(f"tp-{tag}", cfg.streams, cfg.seconds)
                backlog = streams.interleaved()
                spy = PySpy.start(cfg.profile_dir, process.pid, f"{key}-throughput.txt", rate=200)
                process.freeze()
                try:
                    result.extra["produce_s"] = round(
                        await produce_all(self.kafka, source, backlog), 2
                    )
                finally:
                    cpu = CpuMeter({"worker": process.pid, **self.services})
                    self.triton_stats.start()
                    cpu.start()
                    thawed = time.time()
                    process.thaw()
                sampler = StageSampler(process)
                sampler.start()
                summaries = await self.wait_summaries(results, streams.keys, process, "throughput")
                result.extra["cpu"] = cpu.stop()
                result.extra["stage_samples"] = await sampler.stop()
                result.extra["triton"] = self.triton_stats.stop()
                if spy is not None:
                    result.extra["profile"] = spy.stop(summarize_profile_lines)
                mine = [
                    r
                    for r in results.records
                    if r.key is not None and r.key.decode() in set(streams.keys)
                ]
                last = max(s.timestamp for s in summaries) / 1000
                first = min(r.timestamp for r in mine) / 1000
                result.requests = streams.chunks
                result.window_s = last - thawed
                result.throughput = streams.chunks / result.window_s
                result.extra["first_result_after_thaw_s"] = round(first - thawed, 3)
                result.extra["first_to_last_result_chunks_per_s"] = (
                    round(streams.chunks / (last - first), 1) if last > first else None
                )
                cpu_s = result.extra["cpu"]
                result.extra["worker_cpu_ms_per_chunk"] = round(
                    cpu_s["worker_cpu_s"] / streams.chunks * 1000, 3
                )
                self.check_streams(key, mine, streams, check_probabilities=True)

                # 3. Latency: fresh streams in real time.
                if cfg.latency_seconds > 0:
                    await self.latency_phase(key, tag, result, source, results, process)
            dead_letters = await read_topic(self.kafka, dead, 0, idle_s=0.5)
            if dead_letters:
                reasons = {header(r, "error-reason") for r in dead_letters}
                raise BenchmarkFailure(
                    f"{len(dead_letters)} chunks dead-lettered: {sorted(map(str, reasons))[:3]}"
                )
            result.notes.append(
                f"`pipeline run` child process, stages {stages}; {PARTITIONS} partitions; "
                f"throughput = chunks / (thaw -> last summary)"
            )
        finally:
            result.extra["worker_exit_code"] = process.stop()
        return result

    async def wait_summaries(
        self,
        reader: TopicReader,
        keys: Sequence[str],
        process: WorkerProcess,
        what: str,
        stall_s: float | None = None,
    ) -> list[Any]:
        """Read ``reader`` until every stream in ``keys`` has its summary; the summary records."""
        stall_s = stall_s or self.config.stall_seconds
        wanted = {k.encode() for k in keys}
        found: dict[bytes, Any] = {}
        scanned = 0
        last_change = time.monotonic()
        while len(found) < len(wanted):
            count = await reader.poll()
            if count != scanned:
                last_change = time.monotonic()
            for record in reader.records[scanned:count]:
                if (
                    record.key in wanted
                    and record.key not in found
                    and header(record, "result-type") == "summary"
                ):
                    found[record.key] = record
            scanned = count
            if time.monotonic() - last_change > stall_s:
                missing = sorted(k.decode() for k in wanted - found.keys())
                raise BenchmarkFailure(
                    f"{what}: {len(missing)} of {len(wanted)} stream summaries never arrived "
                    f"(no result for {stall_s:.0f}s; e.g. {', '.join(missing[:3])}); log: {process.log_path}\n"
                    f"{process.tail(8)}"
                )
            process.check_alive()
        return list(found.values())

    def check_streams(
        self, key: str, records: list[Any], streams: StreamSet, *, check_probabilities: bool
    ) -> None:
        """Every stream complete and exact: summary, chunk count, chunk results, probabilities."""
        got = gather(records)
        problems = []
        for i, (name, sent) in enumerate(zip(streams.keys, streams.records, strict=True)):
            r = got.get(name)
            if r is None or r.summary is None:
                problems.append(f"{name}: no summary")
                continue
            if int(r.summary["chunks"]) != len(sent):
                problems.append(
                    f"{name}: summary counts {r.summary['chunks']:.0f} chunks, {len(sent)} sent"
                )
            if sorted(r.chunks) != list(range(len(sent))):
                problems.append(f"{name}: {len(r.chunks)} chunk results for {len(sent)} chunks")
                continue
            if r.chunk_order != sorted(r.chunk_order):
                problems.append(f"{name}: chunk results out of order")
            if r.conflicting:
                problems.append(f"{name}: {r.conflicting} conflicting duplicates")
            if check_probabilities and self.direct_probabilities is not None:
                diff = np.abs(r.probabilities() - self.direct_probabilities[i])
                if (
                    diff.size != self.direct_probabilities[i].size
                    or float(diff.max()) > PROBABILITY_ATOL
                ):
                    problems.append(
                        f"{name}: probabilities differ from direct Triton by {float(diff.max()):.2e}"
                    )
        if problems:
            raise BenchmarkFailure(
                f"({key}) {len(problems)} streams wrong: " + "; ".join(problems[:5])
            )

    async def latency_phase(
        self,
        key: str,
        tag: str,
        result: CaseResult,
        source: str,
        results: TopicReader,
        process: WorkerProcess,
    ) -> None:
        cfg = self.config
        streams = StreamSet.make(f"lat-{tag}", cfg.streams, cfg.latency_seconds)
        rate = cfg.streams / FRAME_S
        scanned = len(results.records)
        result.latency_offered_rate = rate
        result.latency_achieved_rate = await produce_at_rate(
            self.kafka, source, streams.interleaved(), rate
        )
        await self.wait_summaries(results, streams.keys, process, "latency phase")
        keys = set(streams.keys)
        sent_at = await self.request_timestamps(source, keys, streams.chunks)
        latencies, sent = [], []
        mine = [
            r for r in results.records[scanned:] if r.key is not None and r.key.decode() in keys
        ]
        for record in mine:
            if header(record, "result-type") == "chunk":
                cid = header(record, "correlation-id")
                if cid in sent_at:
                    latencies.append(float(record.timestamp - sent_at[cid]))
                    sent.append(sent_at[cid] / 1000)
        if len(latencies) != streams.chunks:
            raise BenchmarkFailure(
                f"({key}) latency phase: {len(latencies)} chunk results for {streams.chunks} chunks"
            )
        self.check_streams(key, mine, streams, check_probabilities=False)
        latency_summary(result, latencies)
        order = np.argsort(sent, kind="stable")
        result.extra["latency_timeline_p50_ms"] = timeline(
            [sent[i] for i in order], [latencies[i] for i in order]
        )

    async def request_timestamps(self, topic: str, keys: set[str], expected: int) -> dict[str, int]:
        """Correlation ID -> record timestamp (ms) of the requests of ``keys``: all ``expected`` of them."""
        sent_at: dict[str, int] = {}
        async with TopicReader(self.kafka, topic) as reader:
            scanned, last_change = 0, time.monotonic()
            while len(sent_at) < expected:
                count = await reader.poll()
                if count != scanned:
                    last_change = time.monotonic()
                for record in reader.records[scanned:count]:
                    if record.key is not None and record.key.decode() in keys:
                        cid = header(record, "correlation-id")
                        if cid is not None:
                            sent_at.setdefault(cid, record.timestamp)
                scanned = count
                if time.monotonic() - last_change > self.config.stall_seconds:
                    raise BenchmarkFailure(
                        f"{topic}: read {len(sent_at)} of {expected} requests back"
                    )
        return sent_at


# --------------------------------------------------------------------------- preprocessing
def run_preprocess(repeats: int, log_dir: Path) -> dict[str, Any]:
    """``benchmarks.audio_preprocess`` in a child process (prints its own table); its DALI ratios."""
    out = log_dir / "audio_preprocess.json"
    code = subprocess.call(
        [
            sys.executable,
            "-m",
            "benchmarks.audio_preprocess",
            "--repeats",
            str(repeats),
            "--json",
            str(out),
        ],
        cwd=REPO,
    )
    if not out.exists():
        return {"exit_code": code, "error": "audio_preprocess wrote no results"}
    rows = json.loads(out.read_text())
    dali = [r for r in rows if r["method"].startswith("dali") and r["method"] != "dali 1t"]
    per_workload = {
        r["workload"]: {
            "method": r["method"],
            "vs_scipy": r["ratio"],
            "best_vs_best": r["best_ratio"],
            "max_error": r["max_error"],
        }
        for r in dali
    }
    return {"exit_code": code, "rows": rows, "dali_vs_scipy": per_workload}


# --------------------------------------------------------------------------- report
def ratios(results: dict[str, CaseResult]) -> dict[str, Any]:
    a, b, c = (report.throughput_of(results, key) for key in "abc")
    out: dict[str, Any] = {}
    if a and b:
        out["b_over_a"] = b / a
        out["b_over_a_met"] = b / a >= TARGET_B_OVER_A
    if a and c:
        out["c_over_a"] = c / a
        out["c_over_a_met"] = c / a >= TARGET_C_OVER_A
    if b and c:
        out["b_over_c"] = b / c
    return out


def print_report(
    meta: dict[str, Any],
    cfg: Config,
    results: dict[str, CaseResult],
    rat: dict[str, Any],
    pre: dict[str, Any] | None,
) -> None:
    m, v = meta["machine"], meta["versions"]
    console.print(
        f"\n[bold]Audio topology benchmark[/]  {m['date']}\n"
        f"{report.machine_line(m)}, no GPU used (DALI on CPU); broker, Triton, worker and the measuring "
        f"process share the CPUs (load avg at start {m['loadavg_1m_at_start']})\n"
        f"{report.versions_line(v, ('DALI', 'nvidia-dali-cuda120'), 'tritonclient', 'aiokafka')}\n"
        f"workload: {cfg.streams} streams x {cfg.seconds:g} s of 16 kHz speech = {meta['chunks']} chunks of "
        f"{CHUNK} samples (1 chunk = 1 silero_vad frame); {meta['request_bytes']} B per request record",
        soft_wrap=True,
    )
    columns: tuple[str, ...] = ("case", "what", "chunks", "window s", "chunks/s", "vs a")
    columns += ("CPU ms/chunk", "Triton CPU %", "Triton batch", "other %", "p50 ms", "p99 ms")
    table = report.case_table(columns, no_wrap=("what",), box=box.MARKDOWN)
    a = results.get("a")
    for key in CASES:
        r = results.get(key)
        if r is None:
            continue
        if r.error is not None:
            table.add_row(key, SHORT[key], fmt(r.requests or None), "-", "FAILED", *["-"] * 7)
            continue
        cpu = r.extra.get("cpu") or {}
        triton = cpu.get("triton_cpu_s")
        batch = (r.extra.get("triton") or {}).get("requests_per_execution")
        vs = r.throughput / a.throughput if a and a.throughput and r.throughput else None
        table.add_row(
            key,
            SHORT[key],
            fmt(r.requests),
            fmt(r.window_s, 2),
            fmt(r.throughput),
            f"{vs:.2f}" if vs is not None else "-",
            fmt(r.extra.get("client_cpu_ms_per_chunk", r.extra.get("worker_cpu_ms_per_chunk")), 2),
            fmt(100 * triton / cpu["wall_s"], 0)
            if triton is not None and cpu.get("wall_s")
            else "-",
            fmt(batch, 1),
            fmt(100 * cpu["other_cpu_s"] / cpu["wall_s"], 0)
            if "other_cpu_s" in cpu and cpu.get("wall_s")
            else "-",
            fmt(r.p50_ms, 1),
            fmt(r.p99_ms, 1),
        )
    console.print(table)
    lat = next((r for r in results.values() if r.latency_offered_rate), None)
    if lat is not None:
        console.print(
            f"p50/p99: per-chunk latency with {cfg.streams} streams sent in real time "
            f"({fmt(lat.latency_offered_rate)} chunks/s, {cfg.latency_seconds:g} s per stream); "
            "CPU ms/chunk: a = the client (this process), b and c = the `pipeline run` worker.",
            soft_wrap=True,
        )
    for key in CASES:
        r = results.get(key)
        if r is None:
            continue
        if r.error is not None:
            console.print(f"({key}) [bold red]{r.error}[/]", soft_wrap=True)
            continue
        t = r.extra.get("triton") or {}
        cpu = r.extra.get("cpu") or {}
        line = (
            f"({key}) {r.name}: Triton {fmt(t.get('request_ms'), 2)} ms per request "
            f"(queue {fmt(t.get('queue_ms'), 2)}, infer {fmt(t.get('infer_ms_per_request'), 2)}); "
            "CPU s in the window: "
            + ", ".join(f"{k.removesuffix('_cpu_s')} {v}" for k, v in cpu.items() if k != "wall_s")
            + f" of {cpu.get('wall_s')} s"
        )
        if key in "bc":
            samples = r.extra.get("stage_samples") or {}
            line += (
                "; stage /metrics: "
                + ", ".join(f"{k} {v}" for k, v in samples.items() if k != "samples")
                + f"; first result {r.extra['first_result_after_thaw_s']:.2f} s after the thaw, "
                f"first->last result {fmt(r.extra['first_to_last_result_chunks_per_s'])} chunks/s"
            )
        if r.extra.get("latency_timeline_p50_ms"):
            line += f"; latency p50 per 0.5 s: {r.extra['latency_timeline_p50_ms']}"
        if r.notes:
            line += "; " + "; ".join(r.notes)
        console.print(line, soft_wrap=True)

    if "b_over_a" in rat:
        console.print(
            f"b / a = {rat['b_over_a']:.2f}  (target >= {TARGET_B_OVER_A}): {verdict(rat['b_over_a_met'])}"
        )
    if "c_over_a" in rat:
        console.print(
            f"c / a = {rat['c_over_a']:.2f}  (target >= {TARGET_C_OVER_A}): {verdict(rat['c_over_a_met'])} "
            f"(sequence stage alone; b / c = {rat.get('b_over_c', 0):.2f}: the DALI stage's cost in the chain)"
        )
    if pre and pre.get("dali_vs_scipy"):
        ratios_by_workload = pre["dali_vs_scipy"]
        head = ratios_by_workload.get(HEADLINE_WORKLOAD)
        if head is not None:
            console.print(
                f"DALI stage vs scipy, headline ({HEADLINE_WORKLOAD}: streaming 32 ms chunks, "
                f"{pre['dali_method']}, median) = {head['vs_scipy']:.2f}x  "
                f"(target >= {TARGET_DALI_VS_SCIPY:g}x on CPU): "
                f"{verdict(head['vs_scipy'] >= TARGET_DALI_VS_SCIPY)}",
                soft_wrap=True,
            )
        others = [
            f"{w} {row['vs_scipy']:.2f}x ({verdict(row['vs_scipy'] >= TARGET_DALI_VS_SCIPY)})"
            for w, row in ratios_by_workload.items()
            if w != HEADLINE_WORKLOAD
        ]
        console.print("  other workloads: " + "; ".join(others), soft_wrap=True)
        if pre.get("exit_code"):
            console.print("[bold red]audio_preprocess failed its accuracy check (see above)[/]")
    elif pre:
        console.print(f"[bold red]audio_preprocess: {pre.get('error')}[/]")
    for key in "bc":
        report.print_profile(
            console,
            f"({key}) py-spy, throughput phase",
            results[key].extra.get("profile") if key in results else None,
            {
                title: title
                for title in ("self_pct", "project_lines_inclusive_pct", "inclusive_pct")
            },
            top=14,
            soft_wrap=True,
        )
    console.print(
        "throughput: (a) frames / wall time of S concurrent sequences; (b), (c) chunks pre-produced while the "
        "worker is frozen / (thaw -> last summary record's timestamp).\n"
        "latency: S streams in real time (one chunk per stream every 32 ms); (b), (c) result ts - request ts "
        "(1 ms Kafka timestamps); (a) response - scheduled send.\n"
        "Triton batch: requests per model execution (sequence batcher, oldest, max 64). "
        "other %: CPU the rest of the machine used in the window (other users' jobs), "
        "in % of one CPU; a large value means that window was disturbed.\n"
        "(b) sends 16 kHz FP32 PCM: its DALI stage runs the whole graph at 16 -> 16 kHz (decode, "
        "clamp, identity filter, 1:1 resample; exact), so b / c is mostly the cost of one more "
        "stage and Kafka hop; resampling other rates is what benchmarks.audio_preprocess measures.",
        soft_wrap=True,
    )


# =========================================================================== main
def parse_args(argv: list[str] | None) -> tuple[Config, Path | None]:
    p = cli.parser("audio", __doc__)
    p.add_argument(
        "--streams", type=int, default=16, help="concurrent streams in every case (default 16)"
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        help="seconds of audio per stream in the throughput phase (default 10: 313 chunks)",
    )
    latency_help = "seconds of real-time audio per stream in the latency phase (0 = skip it)"
    cli.add_shared(p, "--latency-seconds", latency_seconds={"help": latency_help})
    p.add_argument("--warmup-streams", type=int, default=4)
    cli.add_shared(
        p,
        "--cases",
        "--stall-seconds",
        cases={"default": "abc", "help": "which cases to run (default abc)"},
    )
    p.add_argument(
        "--preprocess-repeats",
        type=int,
        default=5,
        help="timed runs per method for benchmarks.audio_preprocess (0 = skip it)",
    )
    cli.add_shared(
        p,
        "--profile",
        "--json",
        profile={"help": "record the throughput phase of b and c with py-spy into DIR"},
    )
    a = p.parse_args(argv)
    cases = "".join(cli.select_cases(p, a.cases, CASES))
    if a.streams < 1 or a.seconds <= 0:
        p.error("--streams and --seconds must be positive")
    warmup_streams = max(1, min(a.streams, a.warmup_streams))
    return cli.config_from(Config, a, cases=cases, warmup_streams=warmup_streams), a.json


async def run_cases(bench: Benchmark) -> dict[str, CaseResult]:
    results: dict[str, CaseResult] = {}
    for key in bench.config.cases:
        console.print(f"[bold]({key})[/] {CASES[key]} ...")
        started = time.perf_counter()
        try:
            results[key] = await (bench.direct_triton() if key == "a" else bench.topology_case(key))
        except BenchmarkFailure as exc:
            results[key] = CaseResult(key, CASES[key], unit="chunks/s", error=f"FAILED: {exc}")
        console.print(report.done_line(key, results[key], started, digits=1))
    return results


def main(argv: list[str] | None = None) -> int:
    cfg, json_path = parse_args(argv)
    with embedded_stack(console, "audio", PACKAGES) as up:
        bench = Benchmark(cfg, up)
        streams = bench.throughput_streams
        up.meta.update(chunks=streams.chunks, request_bytes=len(streams.records[0][1].value or b""))
        if "a" not in cfg.cases:
            console.print(
                "[yellow]case a not run: b and c are not checked against direct Triton probabilities[/]"
            )
        results = asyncio.run(run_cases(bench))
    pre = None
    if cfg.preprocess_repeats > 0:
        console.print(
            f"[bold]benchmarks.audio_preprocess[/] --repeats {cfg.preprocess_repeats} (stack stopped) ..."
        )
        pre = run_preprocess(cfg.preprocess_repeats, up.log_dir)
        pre["dali_method"] = next(
            (r["method"] for r in pre.get("rows", []) if r["method"].startswith("dali")), "dali"
        )
    rat = ratios(results)
    print_report(up.meta, cfg, results, rat, pre)
    failed = [k for k, r in results.items() if r.error is not None]
    if pre is not None and pre.get("exit_code"):
        failed.append("audio_preprocess")
    targets = {"b_over_a": TARGET_B_OVER_A, "c_over_a": TARGET_C_OVER_A, "dali_vs_scipy": TARGET_DALI_VS_SCIPY}
    return finish(
        console, json_path, up, cfg, results, rat, failed, targets=targets, audio_preprocess=pre
    )


if __name__ == "__main__":
    sys.exit(main())
