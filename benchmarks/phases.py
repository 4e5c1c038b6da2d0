"""The Kafka benchmarks' method: frozen-backlog throughput rounds, fixed-rate latency attempts.

Why: benchmarks/README.md promises that ``benchmarks.ensemble`` measures with
``benchmarks.stateless``'s method; with one implementation of it the two cannot
drift apart. A benchmark describes each worker under test as a :class:`Target`
(how its requests are made, how its results are awaited and checked, what else
to record per phase); this module runs the phases on it:

- :func:`throughput`: the worker is frozen (SIGSTOP), a backlog is pre-produced
  to its input topic, the worker is thawed (SIGCONT); throughput = backlog /
  (thaw -> timestamp of the last result). Repeated with a bigger backlog while
  that window is shorter than ``min_window_s`` (4 rounds at most). The CPU of
  the worker, the stack and the rest of the machine is metered from the thaw
  until the results are counted complete;
- :func:`latency`: requests at a fixed rate; p50/p99 of result timestamp -
  request timestamp. While the queue grows (saturation:
  :func:`~benchmarks.common.queue_verdict`) the rate is halved and the phase
  repeated.

Every correlation ID of every phase must come back (``Target.collect`` checks
them), else :class:`~benchmarks.common.BenchmarkFailure` fails the case.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka.structs import ConsumerRecord

from benchmarks.common import (
    CaseResult,
    CpuMeter,
    WorkerProcess,
    index_by_id,
    latency_summary,
    latency_timeline,
    produce_all,
    produce_at_rate,
    queue_verdict,
    read_topic,
)
from benchmarks.profiling import PySpy
from pipeline.contract.records import Record
from pipeline.settings import KafkaSettings

MAX_ROUNDS = 4
THROUGHPUT_SEED, LATENCY_SEED = 2, 10  # + the round's / attempt's number

Found = dict[str, ConsumerRecord[bytes, bytes]]


@dataclass(frozen=True)
class PhaseConfig:
    """The options of the method (``benchmarks.cli``'s shared ones): a benchmark's ``Config``
    extends it with its own."""

    requests: int  # the first throughput backlog
    warmup_requests: int
    min_window_s: float
    max_requests: int
    latency_seconds: float
    latency_load: float
    latency_max_rate: float
    latency_attempts: int
    stall_seconds: float
    profile_dir: Path | None


@dataclass
class Requests:
    """One phase's requests, and what their results are checked against (e.g. the raw inputs)."""

    records: list[Record]
    reference: Any = None


class Target(ABC):
    """One worker under test, as the phases see it."""

    key: str
    kafka: KafkaSettings
    source: str  # the worker's input topic
    process: WorkerProcess
    result: CaseResult
    sent: int  # records produced to its input topic so far

    @abstractmethod
    def new_requests(self, n: int, prefix: str, seed: int) -> Requests:
        """``n`` requests with correlation IDs ``{prefix}-{i:07d}`` (``seed``: a suggestion)."""

    @abstractmethod
    async def wait(self, what: str) -> None:
        """Until the result topic holds ``sent`` results; fail when they stop coming."""

    @abstractmethod
    async def collect(self, prefix: str, requests: Requests, what: str, idle_s: float) -> Found:
        """The results of ``requests``, by correlation ID, all there and checked."""

    def idle_workers(self) -> list[int]:
        """Process groups of the other workers (idle while this one is measured)."""
        return []

    def probe(self, phase: str) -> Callable[[], dict[str, Any]]:
        """Start observing a ``"throughput"`` round or ``"latency"`` attempt; calling the
        result ends it and returns fields for that round's or attempt's record."""
        return dict


async def throughput(
    target: Target,
    config: PhaseConfig,
    services: Mapping[str, int | list[int]],
    *,
    size: int | None = None,
    profile: bool = True,
) -> list[dict[str, Any]]:
    """Throughput rounds from a backlog of ``size`` (default ``config.requests``) until one lasts
    ``min_window_s`` (or the backlog reaches ``max_requests``).

    Sets the result's requests, window and throughput from the last round,
    ``extra["throughput_rounds"]`` and notes on a disturbed or short window.
    With ``--profile`` (and ``profile``), py-spy records the worker during each round.
    """
    result, process = target.result, target.process
    size = config.requests if size is None else size
    min_window_s, max_requests = config.min_window_s, config.max_requests
    profile_dir = config.profile_dir if profile else None
    rounds: list[dict[str, Any]] = []
    for round_no in range(MAX_ROUNDS):
        prefix = f"{target.key}-t{round_no}"
        backlog = target.new_requests(size, prefix, THROUGHPUT_SEED + round_no)
        probe = target.probe("throughput")
        spy = PySpy.start(profile_dir, process.pid, f"{target.key}-throughput-round{round_no}.txt")
        groups = {"worker": process.pid, **services, "idle_workers": target.idle_workers()}
        cpu = CpuMeter(groups)
        process.freeze()
        try:
            produce_s = await produce_all(target.kafka, target.source, backlog.records)
            target.sent += size
        finally:
            cpu.start()
            thawed_at = time.time()
            process.thaw()
        try:
            await target.wait("results")
        finally:
            usage = cpu.stop()
            if spy is not None:
                result.extra["profile"] = spy.stop()
        observed = probe()
        found = await target.collect(prefix, backlog, "throughput phase", 0.2)
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
                "thawed_at": thawed_at,
                # CPU used from thaw until the count was seen complete (polls every ~0.1 s).
                "cpu": usage,
                "worker_cpu_us_per_request": round(usage["worker_cpu_s"] / size * 1e6, 1),
                "other_cpu_share": round(usage["other_cpu_s"] / max(usage["wall_s"], 1e-9), 2),
                **observed,
            }
        )
        result.requests, result.window_s, result.throughput = size, window, size / window
        if window >= min_window_s or size >= max_requests:
            break
        size = min(max_requests, math.ceil(size * 1.3 * min_window_s / max(window, 0.05)))
    result.extra["throughput_rounds"] = rounds
    _throughput_notes(result, rounds, min_window_s)
    return rounds


def _throughput_notes(
    result: CaseResult, rounds: list[dict[str, Any]], min_window_s: float
) -> None:
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
    if result.window_s is not None and result.window_s < min_window_s:
        result.notes.append(f"window only {result.window_s:.2f}s (raise --max-requests)")


def request_latencies(found: Found, inputs: Found) -> tuple[list[float], list[float]]:
    """Request timestamps and result - request latencies (ms), in request order."""
    ordered = sorted(found, key=lambda cid: inputs[cid].timestamp)
    sent_at = [inputs[cid].timestamp for cid in ordered]
    latencies = [found[cid].timestamp - inputs[cid].timestamp for cid in ordered]
    return sent_at, latencies


async def latency(target: Target, config: PhaseConfig, rate: float) -> list[dict[str, Any]]:
    """Latency at ``rate`` for ``latency_seconds``; halved and repeated (up to
    ``latency_attempts`` in all) while the queue grows. Sets the result's latency figures from
    the last attempt, ``extra["latency_attempts"]`` and a note when a rate saturated."""
    result = target.result
    rows: list[dict[str, Any]] = []
    for attempt in range(config.latency_attempts):
        m = max(50, int(rate * config.latency_seconds))
        prefix = f"{target.key}-l{attempt}"
        timed = target.new_requests(m, prefix, LATENCY_SEED + attempt)
        probe = target.probe("latency")
        achieved = await produce_at_rate(target.kafka, target.source, timed.records, rate)
        target.sent += m
        await target.wait("latency-phase results")
        observed = probe()
        found = await target.collect(prefix, timed, f"latency phase at {rate:.0f}/s", 0.3)
        inputs, _ = index_by_id(
            await read_topic(target.kafka, target.source, target.sent, idle_s=0.1), f"{prefix}-"
        )
        sent_at, latencies = request_latencies(found, inputs)
        verdict = queue_verdict(sent_at, latencies, achieved, rate)
        rows.append(
            {
                "timeline_p50_ms": latency_timeline(sent_at, latencies),
                "offered": rate,
                "achieved": achieved,
                "requests": m,
                "p50_ms": float(np.percentile(latencies, 50)),
                "p99_ms": float(np.percentile(latencies, 99)),
                "verdict": verdict,
                **observed,
            }
        )
        result.latency_offered_rate, result.latency_achieved_rate = rate, achieved
        latency_summary(result, latencies)
        if verdict == "ok":
            break
        rate /= 2
    result.extra["latency_attempts"] = rows
    _latency_notes(result, rows)
    return rows


Producer = Callable[[KafkaSettings, str, Sequence[Record], float], Awaitable[float]]
"""Produces records on a schedule at a rate; returns the achieved rate (``produce_at_rate``)."""


async def latency_at(target: Target, rate: float, seconds: float, tag: str, produce: Producer) -> dict[str, Any]:
    """One fixed-rate attempt on ``target`` by ``produce`` (no halving, the case's own latency
    figures untouched): its p50/p99 and whether the queue grew. Issue 22's sweep at fractions
    of the stage's saturation (``benchmarks.stateless --latency-sweep``)."""
    m = max(50, int(rate * seconds))
    prefix = f"{target.key}-{tag}"
    timed = target.new_requests(m, prefix, LATENCY_SEED)
    achieved = await produce(target.kafka, target.source, timed.records, rate)
    target.sent += m
    await target.wait(f"{tag} results")
    found = await target.collect(prefix, timed, f"{tag} at {rate:.0f}/s", 0.3)
    inputs, _ = index_by_id(await read_topic(target.kafka, target.source, target.sent, idle_s=0.1), f"{prefix}-")
    sent_at, latencies = request_latencies(found, inputs)
    return {
        "offered": rate,
        "achieved": achieved,
        "requests": m,
        "p50_ms": float(np.percentile(latencies, 50)),
        "p99_ms": float(np.percentile(latencies, 99)),
        "verdict": queue_verdict(sent_at, latencies, achieved, rate),
    }


def _latency_notes(result: CaseResult, attempts: Sequence[dict[str, Any]]) -> None:
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
