"""Tracing benchmark: what OpenTelemetry tracing costs the stateless stage, off and on.

    .venv/bin/python -m benchmarks.tracing [--requests N] [--latency-seconds S] [--json out.json]

The workload and method are ``benchmarks.stateless``'s case (d) (``python -m
pipeline run`` on dense.yaml, ``dense_classifier``, frozen-backlog throughput
rounds, then a fixed-rate latency phase), run four times in one stack, each a
fresh worker with its own topics and group, measured one after the other:

off    tracing off (no ``OTEL_TRACES_EXPORTER``); with off2, the baseline
on     ``OTEL_TRACES_EXPORTER=otlp`` over gRPC to an OTLP endpoint in this process
       (``tests/helpers/otlp_receiver.py``), ``OTEL_TRACES_SAMPLER=always_on``,
       every other ``OTEL_*`` at the SDK's default (batch processor: 5 s delay,
       2,048-span queue, 512 per export)
on10   the same exporter, ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` with
       ``OTEL_TRACES_SAMPLER_ARG=0.1`` (the requests carry no ``traceparent``: each
       is a new trace, one in ten sampled)
off2   tracing off again: how far two identical runs differ (the noise), and drift
       over the run, since it is measured last

"Off" has nothing to compare with inside one run but the code without tracing,
so its cost is also measured directly: the calls the stage makes per record and
per batch with tracing off, timed here in a loop, as a share of the worker CPU
per request of the two off cases (their mean is also the throughput baseline).
"""

from __future__ import annotations

import asyncio
import sys
import time
import timeit
from pathlib import Path
from typing import Any

import yaml
from aiokafka.structs import TopicPartition

from benchmarks import cli, report, stateless
from benchmarks.common import BenchmarkFailure, CaseResult
from benchmarks.harness import StackUp, embedded_stack, finish
from benchmarks.report import fmt
from pipeline.kafka.ordering import Slot
from pipeline.kafka.outbox import Outputs
from pipeline.observability.record_trace import record_trace
from pipeline.observability.tracing import CallSpan, call_span, grpc_metadata
from tests.helpers.otlp_receiver import OtlpReceiver, otlp_receiver

CASES = {
    "off": "tracing off (baseline)",
    "on": "tracing on, 100 % sampled, OTLP/gRPC",
    "on10": "tracing on, 10 % of traces sampled",
    "off2": "tracing off again (noise, drift)",
}
PACKAGES = ("aiokafka", "tritonclient", "grpcio", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc")
console = report.wide_console(132)


def worker_env(case: str, receiver: OtlpReceiver) -> dict[str, str]:
    if case == "on":
        return receiver.environment(schedule_delay_ms=None)
    if case == "on10":  # what production would run: a ratio of new traces, parents' decisions kept
        return {
            **receiver.environment(schedule_delay_ms=None),
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.1",
        }
    return {"OTEL_TRACES_EXPORTER": "none"}


async def run_cases(config: stateless.Config, up: StackUp, receiver: OtlpReceiver) -> dict[str, CaseResult]:
    """Start every case's worker at once (their group joins overlap), then measure each in turn."""
    workers: dict[str, stateless.KafkaWorker] = {}
    results: dict[str, CaseResult] = {}
    try:
        for case in CASES:
            bench = stateless.Benchmark(config, up)  # its own run id: topics, group, topology
            bench.worker_env = worker_env(case, receiver)
            worker = await bench.launch("d")
            worker.result = CaseResult(case, CASES[case], notes=list(worker.notes))
            workers[case] = worker
            await asyncio.sleep(0.01)  # distinct run ids
        console.print(f"started {len(workers)} workers; waiting for their consumer groups ...")
        for case, ready in zip(
            workers, await asyncio.gather(*(w.process.wait_ready() for w in workers.values())), strict=True
        ):
            workers[case].ready_s = float(ready)
        for case, worker in list(workers.items()):
            console.print(f"[bold]({case})[/] {CASES[case]} ...")
            started, spans_before = time.perf_counter(), receiver.count()
            try:
                results[case] = await worker.bench.measure(worker)
            except BenchmarkFailure as exc:
                results[case] = CaseResult(case, CASES[case], error=f"FAILED: {exc}")
            finally:
                results.setdefault(case, worker.result).extra["worker_exit_code"] = workers.pop(case).process.stop()
            # The worker's graceful stop flushed its last spans to the receiver.
            results[case].extra["spans_received"] = receiver.count() - spans_before
            results[case].extra["requests_sent"] = worker.sent
            console.print(report.done_line(case, results[case], started, digits=1))
    finally:
        for worker in workers.values():
            worker.process.stop(5)
    return results


def off_path_ns(batch_rows: float) -> dict[str, float]:
    """What tracing-off code costs per request: the stage's per-record and per-batch calls
    with no tracer (``record_trace`` twice per record; per batch the call span and the
    gRPC metadata), timed in a loop in this process."""
    slot: Slot[Outputs] = Slot(TopicPartition("t", 0), 0)
    call = CallSpan("x", remote=True, attributes={"rpc.system": "grpc"})
    n = 200_000

    traces = None

    def per_record() -> None:  # base._consume; BatchingStage.handle and _call; Outbox.complete, _acknowledge
        if traces is not None:
            pass
        if record_trace(slot) is not None:
            pass
        if record_trace(slot) is not None:
            pass
        if slot.trace is not None:
            pass
        if slot.trace is not None:
            pass

    def per_batch() -> None:  # the rest of BatchingStage._call, and the backend's call
        spans: list[Any] = []
        batch = {"rows": 1} if spans else None
        with call_span(call, spans[0] if spans else None, spans, batch):
            grpc_metadata()

    record_ns = min(timeit.repeat(per_record, number=n, repeat=5)) / n * 1e9
    batch_ns = min(timeit.repeat(per_batch, number=n // 4, repeat=5)) / (n // 4) * 1e9
    return {"per_record_ns": record_ns, "per_batch_ns": batch_ns, "per_request_ns": record_ns + batch_ns / batch_rows}


def ratios(results: dict[str, CaseResult]) -> dict[str, Any]:
    """Each case against the baseline: the mean of ``off`` (first) and ``off2`` (last), which
    brackets the others, so a load that drifts steadily over the run cancels out."""
    out: dict[str, Any] = {}
    offs = [t for t in (report.throughput_of(results, "off"), report.throughput_of(results, "off2")) if t]
    if offs:
        out["baseline"] = sum(offs) / len(offs)
        for case in CASES:
            value = report.throughput_of(results, case)
            if value:
                out[f"{case}_over_baseline"] = value / out["baseline"]
    if len(offs) == 2:
        out["off2_over_off"] = offs[1] / offs[0]
    cpu = [_cpu_us(results.get(case)) for case in ("off", "off2")]
    known = [c for c in cpu if c is not None]
    if known:
        cpu_us = sum(known) / len(known)
        cost = off_path_ns(batch_rows=1.0)  # as if every batch held one row: the worst case
        out["off_path"] = {**cost, "worker_cpu_us_per_request": cpu_us, "share": cost["per_request_ns"] / 1000 / cpu_us}
    return out


def _cpu_us(result: CaseResult | None) -> float | None:
    rounds = result.extra.get("throughput_rounds") if result is not None and result.error is None else None
    return float(rounds[-1]["worker_cpu_us_per_request"]) if rounds else None


def print_report(meta: dict[str, Any], config: stateless.Config, results: dict[str, CaseResult], rat: dict[str, Any]) -> None:
    console.print(
        f"\n[bold]Tracing benchmark[/]  {meta['machine']['date']}\n{report.machine_line(meta['machine'])}\n"
        f"{report.versions_line(meta['versions'], 'opentelemetry-sdk', ('otlp exporter', 'opentelemetry-exporter-otlp-proto-grpc'))}\n"
        f"stateless stage on dense.yaml (dense_classifier); batch {config.batch}, {config.concurrency} in flight"
    )
    table = report.case_table(
        ("case", "what", "N", "window s", "throughput", "vs baseline", "worker CPU µs/req", "latency at", "p50 ms", "p99 ms", "spans/req")
    )
    for case in CASES:
        r = results.get(case)
        if r is None:
            continue
        if r.error is not None:
            table.add_row(case, r.name, "-", "-", f"[bold red]{r.error}[/]", "-", "-", "-", "-", "-", "-")
            continue
        rounds = r.extra.get("throughput_rounds") or [{}]
        ratio = rat.get(f"{case}_over_baseline")
        sent = r.extra.get("requests_sent") or 0
        spans = r.extra.get("spans_received", 0) / sent if sent else None
        table.add_row(
            case, r.name, f"{r.requests:,}", fmt(r.window_s, 2), f"{fmt(r.throughput)} {r.unit}",
            fmt(ratio, 3), fmt(rounds[-1].get("worker_cpu_us_per_request"), 1),
            f"{fmt(r.latency_achieved_rate)}/s", fmt(r.p50_ms, 1), fmt(r.p99_ms, 1), fmt(spans, 2),
        )
    console.print(table)
    path = rat.get("off_path")
    if path:
        console.print(
            f"tracing-off code path: {path['per_record_ns']:.0f} ns per record + {path['per_batch_ns']:.0f} ns per batch "
            f"(batches of one, the worst case) = {path['per_request_ns']:.0f} ns per request = {path['share'] * 100:.2f} % of the "
            f"{path['worker_cpu_us_per_request']:.1f} µs worker CPU per request of the off cases (target < 2 %)"
        )
    if "off2_over_off" in rat:
        console.print(f"noise: off2 / off = {rat['off2_over_off']:.3f} (two identical runs, first and last)")
    console.print(
        "vs baseline: throughput / the mean of off and off2 (measured first and last in this run, so steady drift cancels).\n"
        "spans/req: spans the OTLP endpoint received / requests sent (process and send per record, "
        "plus one Triton call span per batch; fewer when the SDK's 2,048-span queue overflowed)."
    )


def parse_args(argv: list[str] | None) -> tuple[stateless.Config, Path | None]:
    p = cli.parser("tracing", __doc__)
    cli.add_shared(p, "--requests", requests={"default": 20_000})
    cli.add_shared(
        p,
        *("--latency-seconds", "--latency-load", "--latency-max-rate", "--latency-attempts"),
        *("--warmup-requests", "--min-window", "--max-requests", "--stall-seconds", "--json"),
        latency_attempts={"default": 3},
        max_requests={"default": 300_000},
    )
    p.add_argument("--batch", type=int, default=64, help="rows per Triton call (model max 64)")
    a = p.parse_args(argv)
    base = yaml.safe_load(stateless.BASE_TOPOLOGY.read_text())["stages"][0]["batching"]
    config = cli.config_from(
        stateless.Config,
        a,
        cases="d",
        naive_requests=0,
        faust_requests=0,
        concurrency=int(base.get("max_inflight_batches") or 4),
        max_queue_delay_ms=float(base["max_queue_delay_ms"]),
        fetch_max_wait_ms=None,
        profile_dir=None,
    )
    return config, a.json


def main(argv: list[str] | None = None) -> int:
    config, json_path = parse_args(argv)
    with embedded_stack(console, "tracing", PACKAGES) as up, otlp_receiver() as receiver:
        results = asyncio.run(run_cases(config, up, receiver))
    rat = ratios(results)
    print_report(up.meta, config, results, rat)
    failed = [k for k, r in results.items() if r.error is not None]
    return finish(console, json_path, up, config, results, rat, failed)


if __name__ == "__main__":
    sys.exit(main())
