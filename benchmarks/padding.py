"""Length-aware batching benchmark: padded buckets against exact-shape groups, same mixed-length load.

    .venv/bin/python -m benchmarks.padding [--requests N] [--max-length L] [--json out.json]

One embedded stack (Tansu, moto S3, Triton 2.51 CPU); two cases of the stateless stage
(`python -m pipeline run`, ``topologies/padded.yaml``'s stage on its own 4-partition topics and
consumer group), both on ``sample_models/token_pool``, both fed the same requests: one row of
``tokens`` each, lengths uniform in 1..L (default 128), the ``lengths`` input filled per request:

- (x) exact: no ``padding:``; the request carries ``lengths`` itself, so a batch holds only
  requests of one exact length (today's grouping);
- (p) padded: ``padding:`` as in padded.yaml (buckets 16/32/64/128, lengths filled by the stage,
  ``per_token`` trimmed): the request carries ``tokens`` only.

Both are started at once (their group joins overlap) and measured one after the other with
``benchmarks.stateless``'s method (``benchmarks.phases``): warm-up, then frozen-backlog
throughput rounds. The stage's own /metrics gives the Triton calls of the last round
(``pipeline_batch_size`` count), hence calls per request and rows per call. The table has
each case's results/s and calls/request and the ratios p/x taken in this run. Every result
is checked (its ``per_token`` as long as its request, finite ``pooled``); a missing or
dead-lettered request fails the run (exit 1).
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks import cli, phases, report, stateless
from benchmarks.common import BenchmarkFailure, CaseResult, TopicCounter, produce_all, read_topic
from benchmarks.harness import StackUp, embedded_stack, finish
from benchmarks.metrics import Values, scrape_worker
from benchmarks.report import fmt
from pipeline.contract.records import Record
from pipeline.contract.request import encode_request
from pipeline.contract.response import decode_response
from pipeline.topology.loader import load_topology

REPO = Path(__file__).resolve().parents[1]
PADDED_TOPOLOGY = REPO / "topologies" / "padded.yaml"
CASES = {"x": "exact-shape groups", "p": "padded buckets"}
console = report.wide_console(132)


@dataclass(frozen=True)
class Config(stateless.Config):
    max_length: int


def token_requests(n: int, prefix: str, seed: int, max_length: int, with_lengths: bool) -> list[Record]:
    """``n`` one-row requests, lengths uniform in 1..max_length (the same for both cases)."""
    rng = np.random.default_rng(seed)
    records = []
    for i, length in enumerate(rng.integers(1, max_length + 1, size=n)):
        inputs: dict[str, np.ndarray] = {"tokens": rng.standard_normal((1, int(length))).astype(np.float32)}
        if with_lengths:
            inputs["lengths"] = np.array([[length]], np.int32)
        records.append(encode_request(inputs, correlation_id=f"{prefix}-{i:07d}"))
    return records


def _valid_pools(found: dict[str, Any], sent: dict[str, bytes]) -> None:
    """Each result: ``per_token`` exactly as long as its request's tokens, finite ``pooled`` [1, 4]."""
    for cid, record in found.items():
        if cid not in sent:
            continue
        response = decode_response(record.value, list(record.headers or ()))
        pooled, per_token = response.outputs.get("pooled"), response.outputs.get("per_token")
        if pooled is None or per_token is None or pooled.shape != (1, 4) or not np.isfinite(pooled).all():
            raise BenchmarkFailure(f"result for {cid} is wrong: pooled {pooled!r}")
        if response.correlation_id != cid or per_token.ndim != 2 or per_token.shape[0] != 1:
            raise BenchmarkFailure(f"result for {cid} is wrong: per_token shape {per_token.shape}")


def _calls(values: Values) -> float:
    return sum(v for (name, _), v in values.items() if name == "pipeline_batch_size_count")


@dataclass(eq=False)
class TokenWorker(stateless.KafkaWorker):
    """A stage case fed token requests; counts its Triton calls per throughput round."""

    padded: bool = False
    max_length: int = 128

    def __post_init__(self) -> None:
        self.kafka = self.bench.kafka
        self.result = CaseResult(self.key, CASES[self.key])

    def new_requests(self, n: int, prefix: str, seed: int) -> phases.Requests:
        return phases.Requests(token_requests(n, prefix, seed, self.max_length, with_lengths=not self.padded))

    def probe(self, phase: str) -> Any:
        before = scrape_worker(self.process, lambda name: name == "pipeline_batch_size_count")

        def done() -> dict[str, Any]:
            after = scrape_worker(self.process, lambda name: name == "pipeline_batch_size_count")
            return {"triton_calls": _calls(after) - _calls(before)}

        return done


class Benchmark(stateless.Benchmark):
    """Case (d) of the stateless benchmark on token_pool, with and without ``padding:``."""

    def __init__(self, config: Config, up: StackUp) -> None:
        super().__init__(config, up)
        self.max_length = config.max_length
        self.padded = False

    def use(self, key: str) -> None:
        self.padded, self.variant = key == "p", f"-{key}"

    def _write_topology(self, source: str, sink: str, dead: str) -> Path:
        """padded.yaml with this run's topics and endpoints; without ``padding:`` for case (x)."""
        data = yaml.safe_load(PADDED_TOPOLOGY.read_text())
        data["name"] = f"bench-{self.run_id}{self.variant}"
        data["kafka"]["bootstrap_servers"] = self.kafka.bootstrap_servers
        data["triton"]["grpc_url"] = self.endpoints.triton.grpc_url
        data["input_topic"], data["result_topic"], data["dead_letter_topic"] = source, sink, dead
        data["metrics_topic"] = self.topic("d", "metrics")
        data["http_port"] = 0
        stage = data["stages"][0]
        stage["batching"].update(max_batch_size=self.config.batch, max_inflight_batches=self.config.concurrency,
                                 max_queue_delay_ms=self.config.max_queue_delay_ms)
        if not self.padded:
            del stage["padding"]
        path = self.log_dir / f"topology-{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        load_topology(path)
        return path

    async def launch_case(self, key: str) -> TokenWorker:
        self.use(key)
        base = await self.launch("d")
        given = {f.name: getattr(base, f.name) for f in fields(base) if f.init}
        given.update(key=key, verify=_valid_pools, notes=())
        return TokenWorker(**given, padded=self.padded, max_length=self.max_length)

    async def measure_case(self, worker: TokenWorker) -> CaseResult:
        """Warm-up, then throughput rounds; calls per request from the last round's /metrics."""
        cfg, result = self.config, worker.result
        self.use(worker.key)
        async with TopicCounter(self.kafka, worker.sink) as worker.counter:
            warm = worker.new_requests(cfg.warmup_requests, f"{worker.key}-w", 1).records
            await produce_all(self.kafka, worker.source, warm)
            worker.sent += len(warm)
            await worker.counter.wait_for(worker.sent, stall_s=max(cfg.stall_seconds, 60),
                                          check_alive=worker.process.check_alive, what="warm-up results")
            rounds = await phases.throughput(worker, cfg, self.services, profile=False)
        last = rounds[-1]
        result.extra["calls_per_request"] = last["triton_calls"] / last["requests"]
        dead = await read_topic(self.kafka, self.topic("d", "dead-letters"), 0, idle_s=0.3)
        if dead:
            raise BenchmarkFailure(f"({worker.key}) {len(dead)} requests were dead-lettered")
        return result


async def run_cases(bench: Benchmark) -> dict[str, CaseResult]:
    results: dict[str, CaseResult] = {}
    workers = {key: await bench.launch_case(key) for key in CASES}  # group joins overlap
    try:
        for worker in workers.values():
            worker.ready_s = await worker.process.wait_ready()
        for key, worker in workers.items():
            console.print(f"[bold]({key})[/] {CASES[key]} ...")
            started = time.perf_counter()
            try:
                results[key] = await bench.measure_case(worker)
            except BenchmarkFailure as exc:
                results[key] = CaseResult(key, CASES[key], error=f"FAILED: {exc}")
            console.print(report.done_line(key, results[key], started, digits=2))
    finally:
        for worker in workers.values():
            worker.process.stop(5)
    return results


def ratios(results: dict[str, CaseResult]) -> dict[str, Any]:
    x, p = results.get("x"), results.get("p")
    if x is None or p is None or x.error or p.error or not x.throughput or not p.throughput:
        return {}
    return {
        "results_per_s_p_over_x": p.throughput / x.throughput,
        "calls_per_request_p_over_x": p.extra["calls_per_request"] / x.extra["calls_per_request"],
    }


def print_report(meta: dict[str, Any], config: Config, results: dict[str, CaseResult], rat: dict[str, Any]) -> None:
    console.print(
        f"\n[bold]Length-aware batching benchmark[/]  {meta['machine']['date']}\n"
        f"{report.machine_line(meta['machine'])}; broker, Triton, workers and the measuring process share them\n"
        f"model token_pool; one row per request, lengths uniform in 1..{config.max_length}; "
        f"max_batch_size {config.batch}, {config.concurrency} in flight, {config.max_queue_delay_ms:g} ms delay"
    )
    table = report.case_table(("case", "what", "N", "window s", "results/s", "Triton calls/request",
                               "rows/call", "worker CPU µs/req"))
    for key, r in results.items():
        if r.error is not None:
            table.add_row(key, r.name, "-", "-", "[bold red]not measured[/]", "-", "-", "-")
            continue
        per = r.extra["calls_per_request"]
        cpu = (r.extra.get("throughput_rounds") or [{}])[-1].get("worker_cpu_us_per_request")
        table.add_row(key, r.name, f"{r.requests:,}", fmt(r.window_s, 2), fmt(r.throughput),
                      fmt(per, 3), fmt(1 / per if per else None, 1), fmt(cpu))
    console.print(table)
    for key, r in results.items():
        if r.notes or r.error:
            console.print(f"({key}) " + "; ".join(r.notes + ([r.error] if r.error else [])))
    for name, value in rat.items():
        console.print(f"{name.replace('_p_over_x', ' p / x')} = [bold]{value:.2f}[/]")


def parse_args(argv: list[str] | None) -> tuple[Config, Any]:
    p = cli.parser("padding", __doc__)
    cli.add_shared(p, "--requests", "--warmup-requests", "--min-window", "--max-requests", "--stall-seconds", "--json",
                   requests={"default": 3000}, max_requests={"default": 60_000})
    p.add_argument("--max-length", type=int, default=128, help="longest request (default 128, the last bucket)")
    a = p.parse_args(argv)
    batching = yaml.safe_load(PADDED_TOPOLOGY.read_text())["stages"][0]["batching"]
    config = cli.config_from(
        Config, a, cases="d", naive_requests=0, faust_requests=0, batch=int(batching["max_batch_size"]),
        concurrency=4, max_queue_delay_ms=float(batching["max_queue_delay_ms"]), fetch_max_wait_ms=None,
        profile_dir=None, latency_seconds=0.0, latency_load=0.0, latency_max_rate=0.0, latency_attempts=0,
    )
    return config, a.json


def main(argv: list[str] | None = None) -> int:
    config, json_path = parse_args(argv)
    with embedded_stack(console, "padding", stateless.PACKAGES) as up:
        results = asyncio.run(run_cases(Benchmark(config, up)))
    rat = ratios(results)
    print_report(up.meta, config, results, rat)
    failed = [k for k, r in results.items() if r.error is not None]
    return finish(console, json_path, up, config, results, rat, failed)


if __name__ == "__main__":
    sys.exit(main())
