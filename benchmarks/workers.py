"""Baseline workers the stateless benchmark runs as child processes.

``python -m benchmarks.workers echo  --bootstrap H:P --input T --output T --group G``
    (a) raw Kafka echo: forward every record unchanged (key, value, headers), no
    decoding, no work. Sends are pipelined; offsets are committed every 0.5 s up
    to what the broker has acknowledged (the same commit discipline as a real
    worker, without the per-record bookkeeping).

``python -m benchmarks.workers naive --bootstrap H:P --triton H:P --input T --output T --group G``
    (c) the naive worker: one record at a time, consume -> decode -> infer (batch
    of 1, awaited) -> encode -> produce -> await the ack -> commit that offset.
    It uses the project's own contract code (decode_request, encode_response,
    result_headers) so its per-record work equals the stage's, minus batching
    and pipelining.

``python -m benchmarks.workers rdecho --bootstrap H:P --input T --output T --group G``
    (r) the librdkafka echo: (a) with confluent-kafka's clients (librdkafka's C
    consumer and producer: acks=all, linger 2 ms, Java's murmur2 partitioner, the
    same commit discipline). The transport's floor: what moving a record costs
    when neither the client nor the worker is Python per record, save the loop
    body itself.

All print ``READY`` once their clients are connected, run until SIGTERM/SIGINT,
then commit what is acknowledged and print one ``STATS {...}`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import signal
import time
from typing import Any

from aiokafka.structs import OffsetAndMetadata, TopicPartition

from benchmarks import cli
from pipeline.kafka.clients import make_consumer, make_producer
from pipeline.settings import KafkaSettings

COMMIT_INTERVAL_S = 0.5


async def echo(args: argparse.Namespace, stop: asyncio.Event) -> dict[str, int]:
    kafka = KafkaSettings(bootstrap_servers=args.bootstrap)
    producer = make_producer(kafka)  # acks=all, linger 2 ms: the project's delivery defaults
    consumer = make_consumer(kafka, args.input, group_id=args.group, **_consumer_overrides(args))
    await producer.start()
    await consumer.start()
    print("READY", flush=True)
    acked: dict[TopicPartition, int] = {}
    committed: dict[TopicPartition, int] = {}
    inflight: set[asyncio.Future[object]] = set()
    forwarded = 0

    def on_ack(fut: asyncio.Future[object], tp: TopicPartition, offset: int) -> None:
        inflight.discard(fut)
        if fut.cancelled() or fut.exception() is not None:
            return  # never committed past: the record is replayed
        if offset + 1 > acked.get(tp, 0):
            acked[tp] = offset + 1

    async def commit() -> None:
        todo = {tp: o for tp, o in acked.items() if committed.get(tp) != o}
        if todo:
            await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in todo.items()})
            committed.update(todo)

    last_commit = time.monotonic()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100, max_records=2000)
            for tp, records in batch.items():
                for r in records:
                    if args.drop_every and (forwarded + 1) % args.drop_every == 0:
                        forwarded += 1
                        continue  # self-test only: a lossy worker the benchmark must catch
                    fut = await producer.send(
                        args.output, r.value, key=r.key, headers=list(r.headers or ())
                    )
                    inflight.add(fut)
                    fut.add_done_callback(lambda f, tp=tp, o=r.offset: on_ack(f, tp, o))
                    forwarded += 1
            if len(inflight) > 20_000:  # bounded memory: wait for the broker to catch up
                await asyncio.wait(set(inflight), return_when=asyncio.FIRST_COMPLETED)
            if time.monotonic() - last_commit >= COMMIT_INTERVAL_S:
                await commit()
                last_commit = time.monotonic()
    finally:
        if inflight:
            await asyncio.wait(set(inflight), timeout=20)
        await commit()
        await consumer.stop()
        await producer.stop()
    return {"forwarded": forwarded}


async def naive(args: argparse.Namespace, stop: asyncio.Event) -> dict[str, int]:
    from tritonclient.grpc import InferInput, InferRequestedOutput

    from pipeline.contract.records import result_headers
    from pipeline.contract.request import decode_request
    from pipeline.contract.response import encode_response
    from pipeline.settings import TritonSettings
    from pipeline.triton.client import aio_client

    kafka = KafkaSettings(bootstrap_servers=args.bootstrap)
    producer = make_producer(kafka, linger_ms=0)
    consumer = make_consumer(kafka, args.input, group_id=args.group, **_consumer_overrides(args))
    client = aio_client(TritonSettings(grpc_url=args.triton))
    await producer.start()
    await consumer.start()
    print("READY", flush=True)
    done = 0
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100, max_records=1)
            for tp, records in batch.items():
                for r in records:
                    headers = list(r.headers or ())
                    request = decode_request(r.value, headers)
                    data = request.inputs["features"]
                    tensor = InferInput("features", list(data.shape), request.datatypes["features"])
                    tensor.set_data_from_numpy(data)
                    response = await client.infer(
                        args.model, [tensor], outputs=[InferRequestedOutput("logits")]
                    )
                    meta = response.get_response()
                    value, content_type = encode_response(
                        request,
                        {"logits": response.as_numpy("logits")},
                        model_name=meta.model_name,
                        model_version=meta.model_version,
                    )
                    out_headers = result_headers(
                        headers,
                        correlation_id=request.correlation_id,
                        stage="naive",
                        model_name=meta.model_name,
                        model_version=meta.model_version,
                        content_type=content_type,
                    )
                    await producer.send_and_wait(args.output, value, key=r.key, headers=out_headers)
                    await consumer.commit({tp: OffsetAndMetadata(r.offset + 1, "")})
                    done += 1
    finally:
        await consumer.stop()
        await producer.stop()
        await client.close()
    return {"processed": done}


def rdecho(args: argparse.Namespace) -> dict[str, int]:
    """(r): librdkafka's consumer and producer forwarding each record; commits as (a)."""
    from confluent_kafka import Consumer, KafkaError, Producer
    from confluent_kafka import TopicPartition as RdPartition

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            # The project's consumer default (librdkafka's own is 500 ms), unless overridden.
            "fetch.wait.max.ms": args.fetch_max_wait_ms if args.fetch_max_wait_ms is not None else 25,
        }
    )
    producer = Producer(
        {"bootstrap.servers": args.bootstrap, "acks": "all", "linger.ms": 2, "partitioner": "murmur2_random"}
    )
    consumer.subscribe([args.input])
    print("READY", flush=True)
    acked: dict[tuple[str, int], int] = {}
    committed: dict[tuple[str, int], int] = {}
    forwarded = 0

    def on_ack(err: Any, _msg: Any, source: tuple[str, int], offset: int) -> None:
        if err is None and offset + 1 > acked.get(source, 0):
            acked[source] = offset + 1

    def commit() -> None:
        todo = {tp: o for tp, o in acked.items() if committed.get(tp) != o}
        if todo:
            consumer.commit(offsets=[RdPartition(t, p, o) for (t, p), o in todo.items()], asynchronous=True)
            committed.update(todo)

    last_commit = time.monotonic()
    try:
        while not stopping:
            # consume() waits for all num_messages until the timeout: a short one bounds the latency.
            for m in consumer.consume(num_messages=2000, timeout=0.005):
                if (error := m.error()) is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(str(error))
                    continue
                done = functools.partial(on_ack, source=(m.topic() or "", m.partition() or 0), offset=m.offset() or 0)
                while True:
                    try:
                        producer.produce(args.output, m.value(), m.key(), headers=m.headers(), on_delivery=done)
                        break
                    except BufferError:  # the producer's queue is full: let the broker catch up
                        producer.poll(0.05)
                forwarded += 1
            producer.poll(0)
            if time.monotonic() - last_commit >= COMMIT_INTERVAL_S:
                commit()
                last_commit = time.monotonic()
    finally:
        producer.flush(20)
        commit()
        consumer.close()
    return {"forwarded": forwarded}


def _consumer_overrides(args: argparse.Namespace) -> dict[str, int]:
    return {} if args.fetch_max_wait_ms is None else {"fetch_max_wait_ms": args.fetch_max_wait_ms}


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stats = await (echo if args.kind == "echo" else naive)(args, stop)
    print("STATS " + json.dumps(stats), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser("workers", None)
    parser.add_argument("kind", choices=["echo", "naive", "rdecho"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--triton", help="Triton gRPC host:port (naive)")
    parser.add_argument("--model", default="dense_classifier")
    parser.add_argument(
        "--drop-every", type=int, default=0, help="self-test: drop every Nth record (echo)"
    )
    cli.add_shared(parser, "--fetch-max-wait-ms")
    args = parser.parse_args(argv)
    if args.kind == "rdecho":  # synchronous: librdkafka's clients are not asyncio's
        print("STATS " + json.dumps(rdecho(args)), flush=True)
        return
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
