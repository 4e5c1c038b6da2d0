"""Processes benchmark: the stateless stage under `pipeline run --processes 1` and `--processes 2`.

    .venv/bin/python -m benchmarks.processes [--requests N] [--processes 1 2] [--json out.json]

One embedded stack (Tansu, moto S3, Triton 2.51 CPU); each case is case (d) of
``benchmarks.stateless`` (dense.yaml's stage, its own 4-partition topics and
consumer group) started with a different ``--processes``, measured with the same
method (``benchmarks.phases``): warm-up, frozen-backlog throughput rounds (the
whole process group, supervisor and children, is frozen and thawed), then
latency at a fixed rate. Both are started at once, so their group joins overlap,
and measured one after the other. The table gives each case's throughput and
its ratio to ``--processes 1`` measured in the same run, and how the results
were shared between the children (from each child's /metrics).

Every correlation ID must come back with a valid result, else exit 1. On a
2-core machine shared with the broker and Triton the ratio is bounded by what
those two leave free: read ``other`` CPU notes before trusting it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import yaml

from benchmarks import cli, report, stateless
from benchmarks.common import BenchmarkFailure, CaseResult, WorkerProcess
from benchmarks.harness import StackUp, embedded_stack, finish
from benchmarks.metrics import scrape, worker_metrics_urls
from benchmarks.report import fmt

console = report.wide_console(132)
RESULTS = "pipeline_results_total"


class Benchmark(stateless.Benchmark):
    """Case (d) of the stateless benchmark, once per ``--processes`` value, on its own topics."""

    def __init__(self, config: stateless.Config, up: StackUp) -> None:
        super().__init__(config, up)
        self.use(1)

    def use(self, count: int) -> None:
        """Launch or measure the case with ``--processes count`` from now on."""
        self.count, self.variant = count, f"-p{count}"

    def run_args(self) -> list[str]:
        return ["--processes", str(self.count)]


def _results_per_child(process: WorkerProcess) -> list[float]:
    shares = []
    for url in worker_metrics_urls(process):
        try:
            shares.append(sum(scrape(url, lambda name: name == RESULTS).values()))
        except OSError:
            continue  # a child that was replaced: its successor's URL is the one that answers
    return shares


async def _all_children_ready(process: WorkerProcess, count: int, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(worker_metrics_urls(process)) < count:
        process.check_alive()
        if time.monotonic() > deadline:
            raise BenchmarkFailure(f"not all {count} children ready:\n{process.tail()}")
        await asyncio.sleep(0.2)


async def run_cases(bench: Benchmark, counts: list[int]) -> dict[str, CaseResult]:
    results: dict[str, CaseResult] = {}
    workers: dict[int, stateless.KafkaWorker] = {}
    try:
        for count in counts:  # all at once: their consumer-group joins overlap
            bench.use(count)
            workers[count] = await bench.launch("d")
        console.print(f"started --processes {', '.join(map(str, counts))}; waiting for their consumer groups ...")
        for count, worker in workers.items():
            worker.ready_s = await worker.process.wait_ready()
            await _all_children_ready(worker.process, count)
        for count in counts:
            key, worker = f"p{count}", workers[count]
            bench.use(count)
            worker.result = CaseResult(key, f"our stateless stage, --processes {count}")
            console.print(f"[bold]({key})[/] --processes {count} ...")
            started = time.perf_counter()
            try:
                results[key] = await bench.measure(worker)
                results[key].extra["results_per_child"] = _results_per_child(worker.process)
            except BenchmarkFailure as exc:
                results[key] = CaseResult(key, worker.result.name, error=f"FAILED: {exc}")
                console.print(f"[bold red]({key}) FAILED:[/] {exc}")
            finally:
                results[key].extra["worker_exit_code"] = workers.pop(count).process.stop()
            console.print(report.done_line(key, results[key], started, digits=2))
    finally:
        for worker in workers.values():
            worker.process.stop(5)
    return results


def ratios(results: dict[str, CaseResult], counts: list[int]) -> dict[str, Any]:
    base = report.throughput_of(results, f"p{counts[0]}")
    out: dict[str, Any] = {}
    for count in counts[1:]:
        value = report.throughput_of(results, f"p{count}")
        if base and value is not None:
            out[f"p{count}_over_p{counts[0]}"] = value / base
    return out


def print_report(meta: dict[str, Any], config: stateless.Config, results: dict[str, CaseResult],
                 rat: dict[str, Any]) -> None:
    console.print(
        f"\n[bold]Processes benchmark[/]  {meta['machine']['date']}\n"
        f"{report.machine_line(meta['machine'])}; broker, Triton, workers and the measuring process share them\n"
        f"model {stateless.MODEL}; batch {config.batch}, concurrency {config.concurrency} per process; "
        "4-partition topics"
    )
    table = report.case_table(("case", "what", "N", "window s", "throughput", "worker CPU µs/req",
                               "p50 ms", "p99 ms", "results per child"))
    for key, r in results.items():
        if r.error is not None:
            table.add_row(key, r.name, "-", "-", "[bold red]not measured[/]", "-", "-", "-", "-")
            continue
        rounds = r.extra.get("throughput_rounds") or [{}]
        shares = ", ".join(fmt(v) for v in r.extra.get("results_per_child", []))
        table.add_row(key, r.name, f"{r.requests:,}", fmt(r.window_s, 2), f"{fmt(r.throughput)} {r.unit}",
                      fmt(rounds[-1].get("worker_cpu_us_per_request")), fmt(r.p50_ms), fmt(r.p99_ms), shares)
    console.print(table)
    for key, r in results.items():
        if r.notes or r.error:
            console.print(f"({key}) " + "; ".join(r.notes + ([r.error] if r.error else [])))
    for name, value in rat.items():
        console.print(f"{name.replace('_over_', ' / ')} throughput = [bold]{value:.2f}[/]")
    console.print("worker CPU: the whole process group (supervisor and children) per request.")


def parse_args(argv: list[str] | None) -> tuple[stateless.Config, list[int], Any]:
    p = cli.parser("processes", __doc__)
    cli.add_shared(
        p, "--requests", "--warmup-requests", "--min-window", "--max-requests",
        "--latency-seconds", "--latency-load", "--latency-max-rate", "--latency-attempts",
        "--stall-seconds", "--json",
        requests={"default": 20_000}, max_requests={"default": 300_000}, latency_attempts={"default": 2},
    )
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="cases to compare (default 1 2)")
    a = p.parse_args(argv)
    base = yaml.safe_load(stateless.BASE_TOPOLOGY.read_text())["stages"][0]["batching"]
    config = cli.config_from(
        stateless.Config, a, cases="d", naive_requests=0, faust_requests=0, batch=64,
        concurrency=int(base.get("max_inflight_batches") or 4),
        max_queue_delay_ms=float(base["max_queue_delay_ms"]), fetch_max_wait_ms=None, profile_dir=None,
    )
    return config, sorted(set(a.processes)), a.json


def main(argv: list[str] | None = None) -> int:
    config, counts, json_path = parse_args(argv)
    with embedded_stack(console, "processes", stateless.PACKAGES) as up:
        results = asyncio.run(run_cases(Benchmark(config, up), counts))
    rat = ratios(results, counts)
    print_report(up.meta, config, results, rat)
    failed = [k for k, r in results.items() if r.error is not None]
    return finish(console, json_path, up, config, results, rat, failed)


if __name__ == "__main__":
    sys.exit(main())
