"""Shared benchmark plumbing: request records, Kafka helpers, worker processes, CPU, environment.

Used by every benchmark (see ``benchmarks/README.md`` for the method):
records are protobuf OIP requests built with the project's own encoder; topics
have 4 partitions; results are counted cheaply while a worker runs
(:class:`TopicCounter`) and read back in full afterwards for the checks
(:func:`read_topic`, :func:`check_complete`); anything missing raises
:class:`BenchmarkFailure`, which fails the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.metadata
import os
import platform
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Self

import numpy as np
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from pipeline.contract import headers as h
from pipeline.contract.records import Record
from pipeline.contract.request import encode_request
from pipeline.kafka.clients import ensure_topics, make_producer
from pipeline.settings import KafkaSettings

PARTITIONS = 4
FEATURES = 16


class BenchmarkFailure(RuntimeError):
    """A case lost requests, produced wrong results or its worker died: the run must fail."""


class WorkerStartError(RuntimeError):
    """A worker under test never became ready (reported in the table, e.g. Faust on this broker)."""


# --------------------------------------------------------------------------- results
@dataclass
class CaseResult:
    key: str
    name: str
    unit: str = "req/s"
    requests: int = 0  # records (rows for case b) in the throughput phase
    window_s: float | None = None
    throughput: float | None = None
    latency_requests: int = 0
    latency_offered_rate: float | None = None
    latency_achieved_rate: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    max_ms: float | None = None
    duplicates: int = 0
    error: str | None = None
    skipped: bool = False
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def latency_summary(result: CaseResult, latencies_ms: Sequence[float]) -> None:
    values = np.asarray(latencies_ms, dtype=np.float64)
    result.latency_requests = int(values.size)
    if values.size:
        result.p50_ms = float(np.percentile(values, 50))
        result.p99_ms = float(np.percentile(values, 99))
        result.mean_ms = float(values.mean())
        result.max_ms = float(values.max())


# --------------------------------------------------------------------------- latency phases
def queue_verdict(
    sent_ms: Sequence[float], latencies_ms: Sequence[float], achieved: float, offered: float
) -> str:
    """Return "ok", or why this latency phase measured a queue rather than the pipeline.

    A heuristic, on the median latency per 500 ms of send time (the timeline in
    --json): a saturated worker's queue grows for the whole phase, so the last
    third ends well above the first third *and* is still rising past the middle
    third. Latency that jumps around or plateaus (fetch long-polls, periodic
    commits, GC) is not saturation. A load generator that could not keep its
    schedule (CPU starved) did not offer the rate at all.
    """
    if achieved < 0.9 * offered:
        return f"generator reached only {achieved:.0f}/s of {offered:.0f}/s"
    timeline = latency_timeline(sent_ms, latencies_ms)
    if len(timeline) < 6:
        return "ok"
    third = len(timeline) // 3
    first = float(np.median(timeline[:third]))
    middle = float(np.median(timeline[third:-third]))
    last = float(np.median(timeline[-third:]))
    if last > 2 * first + 50 and last > 1.5 * middle:
        return f"queue grew: median {first:.0f} -> {middle:.0f} -> {last:.0f} ms over the phase"
    return "ok"


def latency_timeline(
    sent_at_ms: Sequence[float], latencies_ms: Sequence[float], bucket_ms: int = 500
) -> list[float]:
    """Median latency per ``bucket_ms`` of send time: shows a queue growing, or periodic stalls."""
    if not sent_at_ms:
        return []
    start = sent_at_ms[0]
    buckets: dict[int, list[float]] = {}
    for sent, latency in zip(sent_at_ms, latencies_ms, strict=True):
        buckets.setdefault(int((sent - start) // bucket_ms), []).append(latency)
    return [float(np.median(buckets[b])) for b in sorted(buckets)]


# --------------------------------------------------------------------------- requests
def make_requests(n: int, prefix: str, seed: int = 0) -> list[Record]:
    """``n`` dense_classifier requests (one row of 16 FP32 features each), protobuf form.

    Correlation IDs are ``{prefix}-{i:07d}``; the key is the correlation ID (spreads partitions).
    """
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((n, 1, FEATURES), dtype=np.float32)
    return [
        encode_request({"features": features[i]}, correlation_id=f"{prefix}-{i:07d}")
        for i in range(n)
    ]


def correlation_id(record: ConsumerRecord[bytes, bytes]) -> str | None:
    return h.get_header(list(record.headers or ()), h.CORRELATION_ID)


# --------------------------------------------------------------------------- Kafka helpers
def topic_partitions(topic: str, partitions: int = PARTITIONS) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(partitions)]


async def create_topics(
    kafka: KafkaSettings, topics: Iterable[str], partitions: int = PARTITIONS
) -> None:
    await ensure_topics(kafka, list(topics), partitions=partitions, replication_factor=1)


async def produce_all(kafka: KafkaSettings, topic: str, records: Sequence[Record]) -> float:
    """Produce every record as fast as the client allows; returns the seconds it took (all acked)."""
    producer = make_producer(kafka, linger_ms=5)
    await producer.start()
    try:
        started = time.perf_counter()
        futures = []
        for record in records:
            futures.append(
                await producer.send(topic, record.value, key=record.key, headers=record.headers)
            )
            if len(futures) >= 5000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
        return time.perf_counter() - started
    finally:
        await producer.stop()


async def produce_at_rate(
    kafka: KafkaSettings, topic: str, records: Sequence[Record], rate: float
) -> float:
    """Produce records on a fixed schedule (record ``i`` at ``t0 + i / rate``); returns the achieved rate."""
    producer = make_producer(kafka, linger_ms=0)
    await producer.start()
    try:
        futures = []
        started = time.perf_counter()
        sent = 0
        while sent < len(records):
            due = min(len(records), int((time.perf_counter() - started) * rate) + 1)
            while sent < due:
                record = records[sent]
                futures.append(
                    await producer.send(topic, record.value, key=record.key, headers=record.headers)
                )
                sent += 1
            next_at = started + sent / rate
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        elapsed = time.perf_counter() - started
        await asyncio.gather(*futures)
        return len(records) / elapsed if elapsed > 0 else float("inf")
    finally:
        await producer.stop()


async def _wait_until(
    count: Callable[[], Awaitable[int]],
    expected: int,
    *,
    topic: str,
    stall_s: float,
    check_alive: Callable[[], None] | None,
    what: str,
) -> float:
    """Call ``count`` until it reaches ``expected``; fail loudly when it stops moving for ``stall_s``."""
    started = last_change = time.monotonic()
    last = -1
    while True:
        current = await count()
        now = time.monotonic()
        if current >= expected:
            return now - started
        if current != last:
            last, last_change = current, now
        elif now - last_change > stall_s:
            raise BenchmarkFailure(
                f"{topic}: only {current} of {expected} {what} after {now - started:.1f}s "
                f"(no progress for {stall_s:.0f}s): requests were lost or the worker is stuck"
            )
        if check_alive is not None:
            check_alive()


class TopicCounter:
    """Counts the records of a topic while a worker fills it, reading almost nothing.

    ``end_offsets`` alone would do on Apache Kafka, but Tansu 0.6.0 answers
    ListOffsets(latest) with the *base offset of the last batch + 1*, not the
    high watermark. So each poll seeks every partition to that offset - 1 and
    fetches (at most ~64 KiB: the last batch or two); the last offset seen + 1
    is the partition's count. Correct on both brokers, and cheap enough not to
    disturb the worker being measured: partitions stay paused between polls
    (no background prefetch), no decoding, a few records per poll, ~5 polls/s.
    """

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        self.topic = topic
        self.tps = topic_partitions(topic)
        self.known = {tp: 0 for tp in self.tps}
        self._consumer = AIOKafkaConsumer(
            **kafka.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=50,
            max_partition_fetch_bytes=64 << 10,
        )

    async def __aenter__(self) -> Self:
        await self._consumer.start()
        self._consumer.assign(self.tps)
        self._consumer.pause(*self.tps)  # no background prefetch between polls
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def count(self) -> int:
        ends = await self._consumer.end_offsets(self.tps)
        for tp, end in ends.items():
            self.known[tp] = max(self.known[tp], end)
            self._consumer.seek(tp, max(0, end - 1))
        self._consumer.resume(*self.tps)
        try:
            batch = await self._consumer.getmany(timeout_ms=100)
        finally:
            # Paused, aiokafka's fetcher would otherwise keep reading (and parsing) the
            # whole output stream in the background: CPU taken from the worker measured.
            self._consumer.pause(*self.tps)
        for tp, records in batch.items():
            if records:
                self.known[tp] = max(self.known[tp], records[-1].offset + 1)
        await asyncio.sleep(0.15)
        return sum(self.known.values())

    async def wait_for(
        self,
        expected: int,
        *,
        stall_s: float = 30.0,
        check_alive: Callable[[], None] | None = None,
        what: str = "results",
    ) -> float:
        """Poll until the topic holds ``expected`` records; returns seconds waited."""
        return await _wait_until(
            self.count,
            expected,
            topic=self.topic,
            stall_s=stall_s,
            check_alive=check_alive,
            what=what,
        )


class TopicReader:
    """Reads a whole topic (every partition, from the beginning), for checks after a phase."""

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        self.topic = topic
        self.records: list[ConsumerRecord[bytes, bytes]] = []
        self._consumer = AIOKafkaConsumer(
            **kafka.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=50,
            max_partition_fetch_bytes=8 << 20,
            fetch_max_bytes=64 << 20,
        )

    async def __aenter__(self) -> Self:
        await self._consumer.start()
        tps = topic_partitions(self.topic)
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def poll(self) -> int:
        batch = await self._consumer.getmany(timeout_ms=100, max_records=100_000)
        for records in batch.values():
            self.records.extend(records)
        return len(self.records)

    async def settle(self, idle_s: float) -> int:
        """Read until nothing new arrives for ``idle_s``."""
        last_change = time.monotonic()
        last = len(self.records)
        while time.monotonic() - last_change < idle_s:
            count = await self.poll()
            if count != last:
                last, last_change = count, time.monotonic()
        return len(self.records)


async def read_topic(
    kafka: KafkaSettings, topic: str, expected: int = 0, idle_s: float = 1.0
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record in ``topic``: at least ``expected``, then whatever arrives within ``idle_s``."""
    async with TopicReader(kafka, topic) as reader:
        await _wait_until(
            reader.poll, expected, topic=topic, stall_s=30.0, check_alive=None, what="records"
        )
        await reader.settle(idle_s)
        return reader.records


def index_by_id(
    records: Iterable[ConsumerRecord[bytes, bytes]], prefix: str
) -> tuple[dict[str, ConsumerRecord[bytes, bytes]], int]:
    """Records whose correlation ID starts with ``prefix``, by ID (first wins); and the duplicate count."""
    found: dict[str, ConsumerRecord[bytes, bytes]] = {}
    duplicates = 0
    for record in records:
        cid = correlation_id(record)
        if cid is None or not cid.startswith(prefix):
            continue
        if cid in found:
            duplicates += 1
        else:
            found[cid] = record
    return found, duplicates


def check_complete(found: dict[str, Any], expected: Sequence[Record], what: str) -> None:
    """Every expected correlation ID is in ``found``; else fail loudly with counts and examples."""
    wanted = {bytes(r.key).decode() for r in expected if r.key is not None}
    missing = sorted(wanted - found.keys())
    if missing:
        raise BenchmarkFailure(
            f"{what}: {len(missing)} of {len(wanted)} correlation IDs never came back "
            f"(e.g. {', '.join(missing[:5])})"
        )


# --------------------------------------------------------------------------- worker processes
def _die_with_parent() -> None:  # in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class WorkerProcess:
    """A worker under test: a child process in its own process group that dies with us.

    Unlike :class:`pipeline.embedded.process.SupervisedProcess` it does not block
    while starting, so every worker can join its consumer group at the same time
    (a new group's first join takes ``session_timeout / 2`` on Tansu).
    Output goes to ``log_dir/<name>.log``; readiness is a marker line in it.
    Create it from the main thread (``PR_SET_PDEATHSIG`` is per thread).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        ready_marker: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        self.ready_marker = ready_marker
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "250", **(env or {})},
                cwd=Path(__file__).resolve().parents[1],
                start_new_session=True,
                preexec_fn=_die_with_parent,  # prctl only: safe between fork and exec
            )
        self.pid = self._proc.pid
        self.started = time.monotonic()

    def running(self) -> bool:
        return self._proc.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def wait_ready(self, timeout_s: float = 90.0) -> float:
        """Wait for the marker line; returns seconds since start. Raises :class:`WorkerStartError`."""
        deadline = self.started + timeout_s
        while time.monotonic() < deadline:
            if self.ready_marker in self.log_path.read_text(errors="replace"):
                return time.monotonic() - self.started
            if not self.running():
                raise WorkerStartError(
                    f"{self.name} exited with code {self._proc.returncode}:\n{self.tail()}"
                )
            await asyncio.sleep(0.2)
        raise WorkerStartError(f"{self.name} not ready after {timeout_s:.0f}s:\n{self.tail()}")

    def check_alive(self) -> None:
        if not self.running():
            raise BenchmarkFailure(
                f"worker {self.name} exited; last lines of its log:\n{self.tail()}"
            )

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def freeze(self) -> None:
        """SIGSTOP the whole group: it keeps its partitions but runs nothing."""
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (graceful drain), then SIGKILL whatever is left of the group."""
        self.thaw()
        self.signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=timeout_s)
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        return self._proc.returncode


# --------------------------------------------------------------------------- CPU accounting
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _process_stats() -> Iterator[list[str]]:
    """The fields of ``/proc/PID/stat`` after the command name, for every live process.

    ``fields[0]`` is field 3 (state): pgrp is ``fields[2]``, utime ``[11]``, stime ``[12]``.
    """
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process exited meanwhile
            continue
        yield text.rsplit(")", 1)[1].split()


def group_cpu_seconds(pgids: int | Iterable[int]) -> float:
    """User + system CPU seconds of every live process in the process group(s) (Linux /proc)."""
    wanted = {pgids} if isinstance(pgids, int) else set(pgids)
    ticks = sum(int(f[11]) + int(f[12]) for f in _process_stats() if int(f[2]) in wanted)
    return ticks / _CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent busy since boot (/proc/stat: everything but idle and iowait)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _CLK_TCK


class CpuMeter:
    """CPU seconds used by named process groups between :meth:`start` and :meth:`stop`.

    Also reports this (measuring) process and ``other_cpu_s``: what the rest of
    the machine used meanwhile (other users' jobs on a shared box). A large
    value means the numbers of that window are disturbed.
    """

    def __init__(self, groups: dict[str, int | list[int]]) -> None:
        self.groups = groups
        self._start: dict[str, float] = {}
        self._wall = self._self = self._machine = 0.0

    def start(self) -> None:
        self._wall = time.monotonic()
        self._self = time.process_time()
        self._machine = machine_busy_seconds()
        self._start = {name: group_cpu_seconds(pgid) for name, pgid in self.groups.items()}

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self._wall
        used = {
            name: group_cpu_seconds(pgid) - self._start[name] for name, pgid in self.groups.items()
        }
        used["measurer"] = time.process_time() - self._self
        machine = machine_busy_seconds() - self._machine
        used["other"] = max(0.0, machine - sum(used.values()))
        return {
            **{f"{name}_cpu_s": round(v, 2) for name, v in used.items()},
            "wall_s": round(wall, 2),
        }


# --------------------------------------------------------------------------- environment
def triton_version(url: str) -> str:
    from pipeline.settings import TritonSettings
    from pipeline.triton.client import sync_client

    with sync_client(TritonSettings(grpc_url=url)) as client:
        return str(client.get_server_metadata().version)


def machine_info() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        "cpus": usable,
        "cpu_model": model,
        "memory_gib": mem_gib,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def package_versions(names: Iterable[str]) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def tansu_version() -> str:
    try:
        from pipeline.embedded.services import tansu_binary

        out = subprocess.run(
            [str(tansu_binary()), "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return out.stdout.strip() or out.stderr.strip() or "unknown"
    except Exception as exc:  # informational only
        return f"unknown ({exc})"
