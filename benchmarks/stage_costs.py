"""Where a stateless stage's CPU goes, per record: each step of its hot path timed alone.

    .venv/bin/python -m benchmarks.stage_costs [--requests N]

Starts the embedded stack (Kafka for the client steps, Triton for the model's
metadata and the batched calls) and times, with ``time.process_time`` (CPU of
this process only, so Triton's and the broker's own work is excluded), the
functions the stage really calls for one ``dense_classifier`` request, in the
order it calls them. The sum is compared with the stage's measured CPU per
request in ``benchmarks.stateless`` (``worker_cpu_us_per_request`` in --json).

Not a substitute for profiling the running stage (``benchmarks.stateless
--profile DIR``): it isolates each step, so interactions (cache, event-loop
scheduling) are not included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from aiokafka.structs import ConsumerRecord, TopicPartition

from benchmarks import cli
from benchmarks.common import create_topics, make_requests, produce_all
from benchmarks.report import case_table, wide_console
from pipeline.contract.records import ResultHeaders, result_headers
from pipeline.contract.request import decode_request
from pipeline.contract.response import encode_response
from pipeline.contract.response_batch import encode_batched_responses, encode_responses
from pipeline.embedded.stack import EmbeddedStack
from pipeline.kafka.clients import make_consumer, make_producer
from pipeline.kafka.ordering import OrderedOffsets
from pipeline.kafka.outbox import Outbox, OutRecord
from pipeline.observability.metrics import PipelineMetrics
from workers.runtime.outcomes import StageOutcomes
from workers.stateless.batching import DynamicBatcher
from workers.stateless.triton_backend import TritonModelBackend

MODEL = "dense_classifier"
console = wide_console(110)


def per_call_us(fn: Callable[[int], Any], n: int) -> float:
    started = time.process_time()
    for i in range(n):
        fn(i)
    return (time.process_time() - started) / n * 1e6


def per_batch_us(fn: Callable[[slice], Any], n: int, size: int) -> float:
    """CPU per item of ``fn`` called once per ``size`` items."""
    started = time.process_time()
    for first in range(0, n, size):
        fn(slice(first, first + size))
    return (time.process_time() - started) / n * 1e6


async def outbox_us(
    producer: Any, consumer: Any, topic: str, records: list[Any], *, batch_sends: bool, per_pass: int
) -> float:
    """CPU per record of the outbox's emission: slots completed ``per_pass`` at a time (one
    Triton batch's results), each pass emitted, then every delivery acknowledged."""
    outbox = Outbox(producer, consumer, batch_sends=batch_sends)
    slots = [
        outbox.track(ConsumerRecord("in", i % 4, i // 4, 0, 0, r.key, r.value, None, 0, 0, []))
        for i, r in enumerate(records)
    ]  # fmt: skip
    outputs = [OutRecord(topic, r.key, r.value, list(r.headers)) for r in records]
    started = time.process_time()
    for first in range(0, len(slots), per_pass):
        outbox.complete_all(slots[first : first + per_pass], outputs[first : first + per_pass])
        await outbox.emit_ready()
    assert await outbox.flush(60.0) and outbox.pending() == 0
    return (time.process_time() - started) / len(records) * 1e6


Rows = list[tuple[str, str, float]]


async def measure(n: int, batch: int) -> tuple[Rows, Rows]:
    stack = EmbeddedStack()
    rows: list[tuple[str, str, float]] = []
    alternatives: list[tuple[str, str, float]] = []
    try:
        endpoints = stack.start()
        kafka = endpoints.kafka
        records = make_requests(n, "cost-t")
        consumed = [
            ConsumerRecord("in", 0, i, int(time.time() * 1000), 0, r.key, r.value, None, len(r.key or b""),
                           len(r.value), r.headers)
            for i, r in enumerate(records)
        ]  # fmt: skip
        backend = TritonModelBackend(endpoints.triton, MODEL)
        await backend.setup()
        requests = [decode_request(r.value, list(r.headers)) for r in consumed]

        def add(what: str, where: str, us: float) -> None:
            rows.append((what, where, us))

        # --- consume side -------------------------------------------------------------
        await create_topics(kafka, ["cost.in", "cost.out"])
        await produce_all(kafka, "cost.in", records)
        consumer = make_consumer(kafka, group_id=None)
        await consumer.start()
        consumer.assign([TopicPartition("cost.in", p) for p in range(4)])
        await consumer.seek_to_beginning()
        got, started = 0, time.process_time()
        while got < n:
            batch_records = await consumer.getmany(timeout_ms=500, max_records=1000)
            got += sum(len(v) for v in batch_records.values())
        add(
            "aiokafka getmany (fetch + unpack)",
            "workers/runtime/stream_stage.py _consume",
            (time.process_time() - started) / n * 1e6,
        )
        await consumer.stop()

        offsets: OrderedOffsets[Any] = OrderedOffsets()
        tp = TopicPartition("in", 0)
        add(
            "outbox.track (slot)",
            "pipeline/kafka/ordering.py add",
            per_call_us(lambda i: offsets.add(tp, i), n),
        )
        metrics = PipelineMetrics()
        outcomes = StageOutcomes("s", metrics)
        add(
            "metrics: requests consumed, one increment per fetched partition batch",
            "workers/runtime/outcomes.py consumed",
            per_batch_us(lambda part: outcomes.consumed(part.stop - part.start), n, batch),
        )

        # --- handle -------------------------------------------------------------------
        add(
            "decode_request (protobuf parse + checks)",
            "workers/stateless/stage.py handle",
            per_call_us(lambda i: decode_request(consumed[i].value, list(consumed[i].headers)), n),
        )
        add("backend.check (validate inputs/outputs)", "workers/stateless/triton_backend.py check",
            per_call_us(lambda i: backend.check(requests[i]), n))  # fmt: skip
        batcher: DynamicBatcher[Any] = DynamicBatcher(batch, 0.005)

        def batching(i: int) -> None:
            request = requests[i]
            rows_ = backend.rows(request)
            batcher.add(backend.batch_key(request), (request, time.monotonic()), rows_)

        add(
            "rows + batch_key + batcher.add",
            "workers/stateless/stage.py handle",
            per_call_us(batching, n),
        )

        # --- the batched Triton call, per row ---------------------------------------------
        calls = max(1, n // batch)
        started = time.process_time()
        answers: list[Any] = []
        for c in range(calls):
            answers.append(await backend.run(requests[c * batch : (c + 1) * batch]))
        add(f"backend.run ({batch} rows/call: concat, gRPC), per row", "workers/stateless/triton_backend.py run",
            (time.process_time() - started) / (calls * batch) * 1e6)  # fmt: skip
        model_version = answers[-1].model_version
        outputs: list[Any] = [each for answer in answers for each in answer.outputs]  # split: for the rows below

        # --- _succeed -----------------------------------------------------------------
        m = len(outputs)
        response_type = "application/vnd.oip.v2.infer-response+protobuf"

        def batch_values(part: slice) -> None:
            answer = answers[part.start // batch]
            encode_batched_responses(
                requests[part], answer.arrays, answer.rows, model_name=MODEL, model_version=model_version
            )

        def batch_headers(part: slice) -> None:
            shared = ResultHeaders(stage="s", model_name=MODEL, model_version=model_version, content_type=response_type)
            for i in range(part.start, min(part.stop, m)):
                shared.of(consumed[i].headers, requests[i].correlation_id)

        add(
            f"encode_batched_responses ({batch} results from the batch's arrays), per result",
            "workers/stateless/batch_runner.py _succeed",
            per_batch_us(batch_values, m, batch),
        )
        add(
            "ResultHeaders.of (the shared headers once per batch), per result",
            "workers/stateless/batch_runner.py _succeed",
            per_batch_us(batch_headers, m, batch),
        )
        alternatives.append(
            (
                "instead of encode_batched_responses: split per request, encode_responses",
                "the batch's arrays split into per-request dicts (before this change)",
                per_batch_us(
                    lambda part: encode_responses(
                        requests[part],
                        dataclasses.replace(answers[part.start // batch]).outputs,  # a fresh split
                        model_name=MODEL,
                        model_version=model_version,
                    ),
                    m,
                    batch,
                ),
            )
        )
        alternatives.append(
            (
                "instead of the two rows above: encode_response per record",
                "a batch whose results differ in layout, JSON requests",
                per_call_us(
                    lambda i: encode_response(requests[i], outputs[i], model_name=MODEL, model_version=model_version), m
                ),
            )
        )
        alternatives.append(
            (
                "and result_headers per record",
                "(before issue 22's per-batch encoding)",
                per_call_us(
                    lambda i: result_headers(
                        list(consumed[i].headers),
                        correlation_id=requests[i].correlation_id,
                        stage="s",
                        model_name=MODEL,
                        model_version=model_version,
                        content_type=response_type,
                    ),
                    m,
                ),
            )
        )
        add(
            "OutRecord.plain, per result",
            "workers/stateless/batch_runner.py _succeed",
            per_call_us(lambda i: OutRecord.plain("out", consumed[i].key, consumed[i].value, [], 0, None), m),
        )

        def per_call_metrics(part: slice) -> None:
            metrics.queue_delay.labels("s").observe(0.001)
            metrics.batch_size.labels("s").observe(part.stop - part.start)
            metrics.triton_latency.labels("s", "triton").observe(0.004)

        add(
            "metrics per Triton call (queue delay, batch size, latency)",
            "workers/stateless/batch_runner.py _call",
            per_batch_us(per_call_metrics, m, batch),
        )

        # --- emission -----------------------------------------------------------------
        producer = make_producer(kafka)
        await producer.start()
        await producer.partitions_for("cost.out")
        consumer = make_consumer(kafka, group_id=None)  # never started: nothing is committed here
        try:
            for batch_sends in (False, True):
                await outbox_us(producer, consumer, "cost.out", records[:2000], batch_sends=batch_sends, per_pass=batch)
            add(
                "outbox: complete_all per batch, record batch per partition, one future per batch, ack",
                "pipeline/kafka/outbox.py emit_ready",
                await outbox_us(producer, consumer, "cost.out", records, batch_sends=True, per_pass=batch),
            )
            alternatives.append(
                (
                    "instead of the row above: one send() + future per record",
                    "PIPELINE_KAFKA_BATCH_SENDS=false",
                    await outbox_us(producer, consumer, "cost.out", records, batch_sends=False, per_pass=batch),
                )
            )
        finally:
            await producer.stop()
            await consumer.stop()

        outs = [
            OutRecord("out", r.key, r.value, [], request_timestamp_ms=int(time.time() * 1000)) for r in consumed[:n]
        ]
        add(
            "metrics on a record batch's ack (results once, end-to-end latency per result)",
            "workers/runtime/outcomes.py acknowledged",
            per_batch_us(lambda part: outcomes.acknowledged(outs[part]), n, batch),
        )
        await backend.close()
    finally:
        stack.stop()
    return rows, alternatives


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser("stage_costs", __doc__)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    rows, alternatives = asyncio.run(measure(args.requests, args.batch))
    title = f"CPU per record in this process ({args.requests:,} records, {MODEL})"
    table = case_table(("step", "where", "µs"), left=("step", "where"), title=title)
    for what, where, us in rows:
        table.add_row(what, where, f"{us:.1f}")
    table.add_row("[bold]sum[/]", "", f"[bold]{sum(us for _, _, us in rows):.1f}[/]")
    for what, where, us in alternatives:
        table.add_row(f"[dim]{what}[/]", f"[dim]{where}[/]", f"[dim]{us:.1f}[/]")
    console.print(table)


if __name__ == "__main__":
    main()
