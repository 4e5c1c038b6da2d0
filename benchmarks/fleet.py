"""Triton fleet benchmark (issue 27): the stateless stage against one Triton replica, then two.

    .venv/bin/python -m benchmarks.fleet [--repeat R] [--host-cores C] [--workers W] [--json out.json]

One embedded stack (broker, moto S3, Triton 2.51 CPU) plus a second ``tritonserver`` on the same
model store: the two replicas ``EmbeddedStack(tritons=2)`` starts, on this machine. Case (d) of
``benchmarks.stateless`` (dense.yaml's stage, one worker, the same load) runs twice, each on its
own topics and consumer group: (r1) its ``triton.grpc_url`` names the first replica; (r2) both
(``a:port,b:port``), so each batch goes to the least busy replica
(``workers/stateless/fleet_backend.py``). Both workers start at once (their group joins
overlap), are warmed, then measured in alternation, r1 r2 r1 r2 ... (``--repeat``), each time
by ``benchmarks.phases.throughput`` (freeze, pre-produce a backlog, thaw; every result
checked), so drift on a shared machine hits both cases alike; the figures are the medians.
No latency phase: the question is throughput and CPU.

Measured per repetition: requests/s; the worker's CPU per request; each replica's CPU per
request (its process group: ``tritonserver`` and the Python-backend stub that runs the model);
the calls each replica served (Triton's own ``nv_inference_request_success`` from its metrics
port, before and after), and so the rows per call.

Why two replicas cannot be faster here: the replicas, the worker, the broker and the measurer
share this machine's two cores, and what saturates is the worker (one Python process, tens of
µs of CPU per request against Triton's ~10); a second replica adds no core, only a second
queue on the same ones. What the run shows instead: the split is even (each replica ~50 % of
the calls), and spreading costs little (CPU per request of the worker and of all replicas
with two against one; two / one throughput near 1). What N replicas on N hosts give is then
arithmetic on the measured CPU per request (:func:`cost_model`): W workers send
``W × 1e6 / stage_us`` requests/s (a worker is one event loop: one core at most), N replicas
of C cores serve ``N × C × 1e6 / triton_us``; throughput is the smaller, and the stage binds
from the N where the second reaches the first. Not modelled: the broker (on hosts of its
own), the network, and an ``instance_group`` too small to use C cores (dense_classifier has
``count: 1``; a deployment sizes it to the host).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import cli, phases, report, stateless
from benchmarks.common import BenchmarkFailure, CaseResult, TopicCounter, make_requests, produce_all, read_topic
from benchmarks.harness import StackUp, embedded_stack, finish
from benchmarks.metrics import scrape
from benchmarks.report import fmt
from pipeline.embedded.stack import EmbeddedStack
from pipeline.settings import TritonSettings

console = report.wide_console(132)
SERVED = "nv_inference_request_success"
CASES = {"r1": 1, "r2": 2}  # case key -> replicas named in its grpc_url
REPLICAS_FOR_MODEL = (1, 2, 4, 8)


# =========================================================================== the cost model
@dataclass(frozen=True)
class Capacity:
    """What N replicas on N hosts give, from the measured CPU per request (requests/s)."""

    replicas: int
    stage_rps: float  # W workers, a core each at most
    triton_rps: float  # N replicas of C cores each
    throughput: float  # the smaller of the two
    binds: str  # "stage" or "Triton": which side is the smaller
    workers_to_fill: int  # workers it takes to keep the N replicas busy


def cost_model(
    stage_us: float, triton_us: float, host_cores: int, workers: int, replicas: Sequence[int] = REPLICAS_FOR_MODEL
) -> list[Capacity]:
    """Throughput ≈ min(workers' capacity, N × one replica's capacity), for each N in ``replicas``.

    A worker is one Python event loop, so at most one core: ``1e6 / stage_us`` requests/s each.
    One replica on a host of ``host_cores`` cores: ``host_cores × 1e6 / triton_us``.
    """
    if min(stage_us, triton_us) <= 0 or host_cores < 1 or workers < 1:
        raise ValueError("CPU per request must be positive, cores and workers at least 1")
    per_worker, per_replica = 1e6 / stage_us, host_cores * 1e6 / triton_us
    stage, rows = workers * per_worker, []
    for n in replicas:
        fleet = n * per_replica
        binds = "stage" if stage <= fleet else "Triton"
        rows.append(Capacity(n, stage, fleet, min(stage, fleet), binds, math.ceil(fleet / per_worker - 1e-9)))
    return rows


def stage_binds_from(stage_us: float, triton_us: float, host_cores: int, workers: int) -> int:
    """The smallest N at which N replicas serve at least what the workers send: from there on
    the stage is the bottleneck (1: it already is with one replica)."""
    stage_rps, replica_rps = workers * 1e6 / stage_us, host_cores * 1e6 / triton_us
    return max(1, math.ceil(stage_rps / replica_rps - 1e-9))


# =========================================================================== the runs
@dataclass(frozen=True)
class Replica:
    name: str  # its CPU group's name in a round's ``cpu`` record
    settings: TritonSettings
    pgid: int


class Benchmark(stateless.Benchmark):
    """Case (d) of the stateless benchmark once per replica count, each on its own topics and group."""

    def __init__(self, config: stateless.Config, up: StackUp, replicas: list[Replica]) -> None:
        super().__init__(config, up)
        self.base, self.replicas = up.endpoints, replicas
        self.services.update({r.name: r.pgid for r in replicas})
        self.use("r1")

    def use(self, key: str) -> None:
        """Launch or check case ``key`` from now on: its topics, and the replicas its topology
        names (``_write_topology`` writes ``self.endpoints.triton.grpc_url``)."""
        self.variant = f"-{key}"
        urls = ",".join(str(r.settings.grpc_url) for r in self.replicas[: CASES[key]])
        triton = self.base.triton.model_copy(update={"grpc_url": urls})
        self.endpoints = self.base.model_copy(update={"triton": triton})

    def served(self) -> list[float]:
        """Each replica's successful requests (calls) of the model so far, by its own metrics."""
        counts = []
        for r in self.replicas:
            assert r.settings.metrics_url
            values = scrape(r.settings.metrics_url, lambda name: name.removesuffix("_total") == SERVED, label="model")
            counts.append(sum(v for (_, model), v in values.items() if model == stateless.MODEL))
        return counts

    async def warm_up(self, worker: stateless.KafkaWorker) -> None:
        """Group joined, connections to every replica and Triton itself warm (as ``measure``)."""
        warm = make_requests(self.config.warmup_requests, f"{worker.key}-w", seed=1)
        async with TopicCounter(self.kafka, worker.sink) as counter:
            await produce_all(self.kafka, worker.source, warm)
            worker.sent += len(warm)
            await counter.wait_for(worker.sent, stall_s=60, check_alive=worker.process.check_alive, what="warm-up")

    async def repetition(self, worker: stateless.KafkaWorker, rep: int, size: int) -> dict[str, Any]:
        """One frozen-backlog throughput measurement (``phases.throughput``) with the calls each
        replica served during it and each replica's CPU per request."""
        worker.key = f"d{rep}"  # phases name a round's requests after the key: unique per repetition
        before = self.served()
        async with TopicCounter(self.kafka, worker.sink) as worker.counter:
            last = (await phases.throughput(worker, self.config, self.services, size=size, profile=False))[-1]
        calls = [b - a for a, b in zip(before, self.served(), strict=True)]
        cpu = [last["cpu"].get(f"{r.name}_cpu_s", 0.0) / last["requests"] * 1e6 for r in self.replicas]
        return {**last, "calls": calls, "replica_cpu_us_per_request": cpu}

    async def dead_letters(self, key: str) -> int:
        self.use(key)
        return len(await read_topic(self.kafka, self.topic("d", "dead-letters"), 0, idle_s=0.3))


def summarise(key: str, reps: list[dict[str, Any]]) -> CaseResult:
    """A case's figures: the median repetition's throughput and CPU, the calls of all of them."""
    result = CaseResult(key, f"{CASES[key]} Triton replica" + "s" * (CASES[key] > 1))
    result.requests = reps[-1]["requests"]
    result.throughput = statistics.median(r["throughput"] for r in reps)
    calls = [sum(c) for c in zip(*(r["calls"] for r in reps), strict=True)]
    result.extra = {
        "repetitions": reps,
        "throughputs": [r["throughput"] for r in reps],
        "worker_cpu_us_per_request": statistics.median(r["worker_cpu_us_per_request"] for r in reps),
        "replica_cpu_us_per_request": [
            statistics.median(c) for c in zip(*(r["replica_cpu_us_per_request"] for r in reps), strict=True)
        ],
        "calls": calls,
        "shares": [c / (sum(calls) or 1.0) for c in calls],
        "rows_per_call": sum(r["requests"] for r in reps) / (sum(calls) or 1.0),
        "other_cpu_share": statistics.median(r["other_cpu_share"] for r in reps),
    }
    return result


async def run_cases(bench: Benchmark, repeat: int) -> dict[str, CaseResult]:
    """Both workers started at once (their group joins overlap), warmed, then measured in
    alternation, r1 r2 r1 r2 ..., so drift on a shared machine hits both alike."""
    workers: dict[str, stateless.KafkaWorker] = {}
    reps: dict[str, list[dict[str, Any]]] = {key: [] for key in CASES}
    try:
        for key in CASES:
            bench.use(key)
            workers[key] = await bench.launch("d")
        console.print(f"started {', '.join(CASES)}; waiting for their consumer groups ...")
        for worker in workers.values():
            await worker.process.wait_ready()
            await bench.warm_up(worker)
        for rep in range(repeat):
            for key, worker in workers.items():
                size = reps[key][-1]["requests"] if reps[key] else bench.config.requests
                reps[key].append(await bench.repetition(worker, rep, size))
                console.print(f"    ({key}) repetition {rep + 1}: {reps[key][-1]['throughput']:,.0f} req/s")
        dead = {key: await bench.dead_letters(key) for key in CASES}
    except BenchmarkFailure as exc:  # a request lost, a result wrong, a worker dead: the run fails
        console.print(f"[bold red]FAILED:[/] {exc}")
        return {key: CaseResult(key, f"{CASES[key]} replica(s)", error=f"FAILED: {exc}") for key in CASES}
    finally:
        for worker in workers.values():
            worker.process.stop(5)
    results = {key: summarise(key, reps[key]) for key in CASES}
    for key, worker in workers.items():
        disturbed = sum("other jobs used" in note for note in worker.result.notes)
        results[key].notes = [n for n in dict.fromkeys(worker.result.notes) if "other jobs used" not in n]
        if disturbed:
            results[key].notes.append(f"[yellow]other jobs used > 25 % of a CPU in {disturbed} of {repeat} windows[/]")
        if dead[key]:
            results[key].error = f"FAILED: {dead[key]} requests dead-lettered (see {worker.process.log_path})"
    return results


# =========================================================================== report
def summary(results: dict[str, CaseResult], host_cores: int, workers: int) -> dict[str, Any]:
    """two / one (throughput, CPU per request) and the cost model from (r1)'s CPU per request."""
    if any(r.error or not r.throughput for r in results.values()):
        return {}
    cpu = {
        k: {"worker": r.extra["worker_cpu_us_per_request"], "triton": sum(r.extra["replica_cpu_us_per_request"])}
        for k, r in results.items()
    }
    stage_us, triton_us = cpu["r1"]["worker"], cpu["r1"]["triton"]
    return {
        "two_over_one_throughput": (results["r2"].throughput or 0) / (results["r1"].throughput or 1),
        "cpu_us_per_request": cpu,
        "host_cores": host_cores,
        "workers": workers,
        "stage_binds_from_replicas": stage_binds_from(stage_us, triton_us, host_cores, workers),
        "cost_model": [vars(c) for c in cost_model(stage_us, triton_us, host_cores, workers)],
    }


def print_report(meta: dict[str, Any], results: dict[str, CaseResult], s: dict[str, Any]) -> None:
    console.print(
        f"\n[bold]Triton fleet benchmark[/]  {meta['machine']['date']}\n"
        f"{report.machine_line(meta['machine'])}; broker, both Tritons, the worker and the measurer share them\n"
        f"model {stateless.MODEL}; the same worker and load in both cases, measured in alternation; "
        "figures: the median repetition"
    )
    table = report.case_table(
        (
            "case",
            "what",
            "requests",
            "req/s (each run)",
            "worker CPU µs/req",
            "Triton CPU µs/req",
            "calls per replica",
            "rows/call",
            "other CPU",
        )
    )
    for key, r in results.items():
        x = r.extra
        if r.error is not None or not x:
            table.add_row(key, r.name, "-", "[bold red]not measured[/]", *["-"] * 5)
            continue
        table.add_row(
            key,
            r.name,
            f"{r.requests:,}",
            f"{fmt(r.throughput)} ({', '.join(fmt(t) for t in x['throughputs'])})",
            fmt(x["worker_cpu_us_per_request"], 1),
            " / ".join(fmt(c, 1) for c in x["replica_cpu_us_per_request"]),
            " / ".join(f"{c:,.0f} ({sh:.0%})" for c, sh in zip(x["calls"], x["shares"], strict=True)),
            fmt(x["rows_per_call"], 1),
            f"{x['other_cpu_share']:.2f}",
        )
    console.print(table)
    for key, r in results.items():
        if r.notes or r.error:
            console.print(f"({key}) " + "; ".join(r.notes + ([r.error] if r.error else [])))
    console.print(
        "Triton CPU: each replica's process group (tritonserver and its Python-backend stub) per request; "
        "other CPU: what the rest of the machine used, in cores"
    )
    if s:
        print_model(s)


def print_model(s: dict[str, Any]) -> None:
    one, two = s["cpu_us_per_request"]["r1"], s["cpu_us_per_request"]["r2"]
    console.print(
        f"two / one throughput = [bold]{s['two_over_one_throughput']:.2f}[/]; CPU per request two vs one: "
        f"worker {two['worker']:.1f} vs {one['worker']:.1f} µs ({two['worker'] / one['worker']:.2f}x), "
        f"Triton, all replicas {two['triton']:.1f} vs {one['triton']:.1f} µs ({two['triton'] / one['triton']:.2f}x)"
    )
    console.print(
        f"\n[bold]cost model[/]: N replicas on N hosts of {s['host_cores']} cores, {s['workers']} worker(s) on "
        f"hosts of their own, a core each at most; from (r1): stage {one['worker']:.1f} µs/req, "
        f"one replica {one['triton']:.1f} µs/req"
    )
    table = report.case_table(
        ("N", "workers' req/s", "replicas' req/s", "throughput", "binds", "workers to fill N"), left=("binds",)
    )
    for c in s["cost_model"]:
        table.add_row(*(fmt(v) if isinstance(v, float) else str(v) for v in c.values()))
    console.print(table)
    n = s["stage_binds_from_replicas"]
    console.print(
        f"the stage is the bottleneck from N = {n}"
        + (" (already with one replica)" if n == 1 else "")
        + "; more replicas then need more workers (last column). Broker and network not modelled."
    )


# =========================================================================== main
def start_second_replica(up: StackUp, stack: EmbeddedStack) -> list[Replica]:
    """A second Triton on the first one's model store, as ``EmbeddedStack(tritons=2)`` starts its
    second. (The harness starts a stack of one; its CPU accounting keys processes by name.)"""
    with console.status("starting a second Triton replica on the same model store"):
        stack.start()
    second = stack.process("triton").pid
    assert second is not None
    return [
        Replica("triton", up.endpoints.triton, up.services["triton"]),
        Replica("triton2", stack.triton_replicas[0], second),
    ]


def parse_args(argv: list[str] | None) -> tuple[stateless.Config, argparse.Namespace]:
    p = cli.parser("fleet", __doc__)
    cli.add_shared(
        p,
        "--requests",
        "--warmup-requests",
        "--min-window",
        "--max-requests",
        "--stall-seconds",
        "--json",
        requests={"default": 20_000},
        max_requests={"default": 200_000},
    )
    p.add_argument("--repeat", type=int, default=3, help="measurements of each case, alternating (default 3)")
    p.add_argument(
        "--host-cores",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="cores of each replica's host in the cost model (default: this machine's)",
    )
    p.add_argument("--workers", type=int, default=1, help="worker processes in the cost model (default 1, as measured)")
    a = p.parse_args(argv)
    # case (d)'s settings as benchmarks.stateless makes them (dense.yaml's batching); no latency phase here
    shared = {
        k: getattr(a, k) for k in ("requests", "warmup_requests", "min_window_s", "max_requests", "stall_seconds")
    }
    config = dataclasses.replace(stateless.parse_args(["--cases", "d"])[0], latency_seconds=0.0, **shared)
    return config, a


def main(argv: list[str] | None = None) -> int:
    config, a = parse_args(argv)
    with embedded_stack(console, "fleet", stateless.PACKAGES) as up:
        second = EmbeddedStack(services=("triton",), s3=up.endpoints.s3, log_dir=up.log_dir / "triton-2")
        try:
            replicas = start_second_replica(up, second)
            console.print(f"second Triton replica up: {replicas[1].settings.grpc_url}, same model store")
            results = asyncio.run(run_cases(Benchmark(config, up, replicas), a.repeat))
        finally:
            second.stop()
    s = summary(results, a.host_cores, a.workers)
    print_report(up.meta, results, s)
    failed = [k for k, r in results.items() if r.error is not None]
    return finish(console, a.json, up, config, results, s, failed, repeat=a.repeat)


if __name__ == "__main__":
    sys.exit(main())
