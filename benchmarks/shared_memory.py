"""Shared-memory benchmark: 1 MiB tensors to Triton inside the gRPC message vs through
Triton system shared memory, the stateless stage's own backend, one stack, one run.

    .venv/bin/python -m benchmarks.shared_memory [--batches N] [--rows B] [--inflight C] [--rounds R] [--outputs all|stats] [--json out.json]

The workload is what ``workers/stateless/triton_backend.py`` does for one batch, with the
stage's own ``TritonModelBackend`` (shared memory ``off`` vs ``on``) against
``sample_models/big_sum`` on the embedded (local) Triton: batches of B rows of
262,144 FP32 samples (1 MiB per row in; out: 4 stats and the 1 MiB row doubled, or
with ``--outputs stats`` only the stats),
C batches in flight, as the stage's ``max_inflight_batches`` allows. Kafka is left
out on purpose: it moves the same bytes in both cases and would only add noise.

Method: both backends are set up and warmed, then measured in R alternating
rounds (msg, shm, msg, shm, ...) of N batches each, so drift on the shared machine
hits both alike. Per case: rows/s (median round), p50/p99 of one batch call (all
rounds), CPU ms per row of this process (the client) and of Triton's process
group, and the spread of its rounds (the noise). The first batch's outputs of both
cases are compared bit for bit; any difference fails the run (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import report
from benchmarks.common import CaseResult, group_cpu_seconds
from benchmarks.harness import StackUp, embedded_stack, finish
from benchmarks.report import fmt
from pipeline.contract.request import InferenceRequest
from pipeline.triton.shared_memory import SharedMemoryOptions
from workers.stateless.triton_backend import TritonModelBackend

MODEL, ROW = "big_sum", 262_144
CASES = {"msg": "tensors inside the gRPC message (shared_memory off)", "shm": "Triton system shared memory (on)"}
PACKAGES = ("tritonclient", "grpcio", "numpy")
console = report.wide_console(120)


@dataclass
class Config:
    batches: int = 40
    rows: int = 4
    inflight: int = 2
    rounds: int = 4
    outputs: str = "all"
    json_path: Path | None = None


def make_requests(rows: int, seed: int, outputs: str) -> list[InferenceRequest]:
    rng = np.random.default_rng(seed)
    return [
        InferenceRequest(
            model_name=MODEL,
            model_version="",
            datatypes={"samples": "FP32"},
            correlation_id=f"{seed}-{i}",
            inputs={"samples": rng.standard_normal((1, ROW), np.float32)},
            requested_outputs=("stats",) if outputs == "stats" else (),
        )
        for i in range(rows)
    ]


async def round_of(backend: TritonModelBackend, batches: list[list[InferenceRequest]], inflight: int,
                   calls_ms: list[float]) -> float:
    """Run ``batches`` with ``inflight`` calls at once; the round's wall time (s)."""
    queue = list(batches)

    async def lane() -> None:
        while queue:
            batch = queue.pop()
            start = time.perf_counter()
            await backend.run(batch)
            calls_ms.append((time.perf_counter() - start) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(inflight)))
    return time.perf_counter() - started


async def measure(config: Config, up: StackUp) -> tuple[dict[str, CaseResult], list[str]]:
    triton = up.endpoints.triton
    backends = {
        case: TritonModelBackend(triton, MODEL, shared_memory=SharedMemoryOptions(mode), stage=f"bench-{case}")
        for case, mode in (("msg", "off"), ("shm", "on"))
    }
    failed: list[str] = []
    pool = [make_requests(config.rows, seed, config.outputs) for seed in range(8)]
    batches = [pool[i % len(pool)] for i in range(config.batches)]
    rates: dict[str, list[float]] = {c: [] for c in CASES}
    calls: dict[str, list[float]] = {c: [] for c in CASES}
    cpu = {c: [0.0, 0.0] for c in CASES}  # client, Triton seconds
    try:
        first = {}
        for case, backend in backends.items():
            await backend.setup()
            first[case] = await backend.run(pool[0])
            for _ in range(5):  # warm: connections, regions grown to the batch size
                await backend.run(pool[1])
        for a, b in zip(first["msg"].outputs, first["shm"].outputs, strict=True):
            for name in a:
                if not np.array_equal(a[name], b[name]):
                    failed.append(f"shm output {name} differs from msg")
        for _ in range(config.rounds):
            for case, backend in backends.items():
                client, server = time.process_time(), group_cpu_seconds(up.services["triton"])
                wall = await round_of(backend, batches, config.inflight, calls[case])
                cpu[case][0] += time.process_time() - client
                cpu[case][1] += group_cpu_seconds(up.services["triton"]) - server
                rates[case].append(config.batches * config.rows / wall)
    finally:
        for backend in backends.values():
            await backend.close()
    results = {}
    rows_total = config.batches * config.rows * config.rounds
    for case, name in CASES.items():
        r = CaseResult(case, name, unit="rows/s", requests=rows_total)
        r.throughput = statistics.median(rates[case])
        quantiles = statistics.quantiles(calls[case], n=100)
        r.p50_ms, r.p99_ms = quantiles[49], quantiles[98]
        r.extra = {
            "rounds_rows_per_s": rates[case],
            "client_cpu_ms_per_row": cpu[case][0] * 1000 / rows_total,
            "triton_cpu_ms_per_row": cpu[case][1] * 1000 / rows_total,
            "spread": (max(rates[case]) - min(rates[case])) / r.throughput,
        }
        results[case] = r
    return results, failed


def print_table(config: Config, results: dict[str, CaseResult]) -> dict[str, float]:
    table = report.case_table(
        ["case", "what", "rows/s", "p50 ms", "p99 ms", "client CPU ms/row", "Triton CPU ms/row", "round spread"],
        title=f"{config.rows} rows of 1 MiB per batch, outputs {config.outputs}, {config.inflight} in flight, "
        f"{config.rounds} rounds x {config.batches} batches",
    )
    for case, r in results.items():
        table.add_row(case, r.name, fmt(r.throughput), fmt(r.p50_ms, 1), fmt(r.p99_ms, 1),
                      fmt(r.extra["client_cpu_ms_per_row"], 2), fmt(r.extra["triton_cpu_ms_per_row"], 2),
                      f"{r.extra['spread']:.0%}")
    console.print(table)
    msg, shm = results["msg"], results["shm"]
    assert msg.throughput and shm.throughput and msg.p50_ms and shm.p50_ms
    ratios = {"rows_per_s_shm_over_msg": shm.throughput / msg.throughput, "p50_shm_over_msg": shm.p50_ms / msg.p50_ms}
    console.print(f"shm / msg: rows/s x{ratios['rows_per_s_shm_over_msg']:.2f}, p50 x{ratios['p50_shm_over_msg']:.2f}")
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shared_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=Config.batches, help="batches per round and case")
    parser.add_argument("--rows", type=int, default=Config.rows, help="1 MiB rows per batch (big_sum allows 8)")
    parser.add_argument("--inflight", type=int, default=Config.inflight, help="batches in flight")
    parser.add_argument("--rounds", type=int, default=Config.rounds, help="alternating rounds per case")
    parser.add_argument(
        "--outputs", choices=("all", "stats"), default=Config.outputs,
        help="all: stats and the 1 MiB doubled row come back; stats: only the 4 stats (large input only)",
    )
    parser.add_argument("--json", dest="json_path", type=Path)
    config = Config(**vars(parser.parse_args(argv)))
    with embedded_stack(console, "shared-memory", PACKAGES) as up:
        console.print(report.machine_line(up.meta["machine"]))
        results, failed = asyncio.run(measure(config, up))
        ratios = print_table(config, results)
        return finish(console, config.json_path, up, config, results, ratios, failed)


if __name__ == "__main__":
    sys.exit(main())
