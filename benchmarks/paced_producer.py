"""A load generator that does not take the measured stage's CPU: librdkafka, in its own
process, producing each record at its scheduled time.

    python -m benchmarks.paced_producer --bootstrap H:P --topic T --rate R --records FILE

Why: the latency phase's default producer is aiokafka in the measuring process, which
shares the two cores (and, per record, several microseconds of Python) with the stage it
measures; near the stage's saturation it falls behind its schedule and the queue it builds
is its own. Issue 22 asks for latency at 50, 70 and 90 % of saturation with a generator that
does not starve the stage: librdkafka moves a record for about 8 µs of CPU (case (r)).

Record ``i`` of FILE (a pickled list of ``(key, value, headers)``) is produced at
``t0 + i / rate`` (``linger.ms`` 1: records due within a millisecond share a request; the
record's timestamp, the latency's start, is taken at the produce call). Prints one JSON line: the achieved rate and how
late the latest send was against its schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pipeline.contract.records import Record
from pipeline.settings import KafkaSettings


def paced(
    bootstrap: str, topic: str, rate: float, records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]
) -> dict[str, float]:
    from confluent_kafka import Producer

    producer = Producer(
        # linger 1 ms: at 0 librdkafka sends a produce request per record, and the broker's
        # per-request cost, not the worker, set the latency (the echo's p50 1.8 s at 6,800/s).
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1, "partitioner": "murmur2_random"}
    )
    producer.list_topics(topic, timeout=10)  # connected, the topic's metadata known: none of it on the clock
    started = time.perf_counter()
    worst_late = 0.0
    for i, (key, value, headers) in enumerate(records):
        due = started + i / rate
        wait = due - time.perf_counter()
        if wait > 0.0005:
            time.sleep(wait)
        worst_late = max(worst_late, time.perf_counter() - due)
        while True:
            try:
                producer.produce(topic, value, key, headers=headers)
                break
            except BufferError:
                producer.poll(0.001)
        producer.poll(0)
    elapsed = time.perf_counter() - started
    left = producer.flush(30)
    if left:
        raise SystemExit(f"{left} records not delivered")
    return {"achieved": len(records) / elapsed if elapsed > 0 else float("inf"), "worst_late_ms": worst_late * 1000}


async def produce_paced(kafka: KafkaSettings, topic: str, records: Sequence[Record], rate: float) -> float:
    """:func:`benchmarks.common.produce_at_rate`'s contract, from a librdkafka child process:
    the achieved rate."""
    with tempfile.NamedTemporaryFile(suffix=".pickle", delete=False) as f:
        pickle.dump([(r.key, r.value, list(r.headers)) for r in records], f)
        path = Path(f.name)
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.paced_producer", "--bootstrap", str(kafka.bootstrap_servers),
            "--topic", topic, "--rate", str(rate), "--records", str(path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"paced producer exited {child.returncode}: {err.decode()[-500:]}")
        return float(json.loads(out.decode().strip().splitlines()[-1])["achieved"])
    finally:
        os.remove(path)  # a small temporary file: blocking for microseconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.paced_producer")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--records", type=Path, required=True)
    args = parser.parse_args(argv)
    records = pickle.loads(args.records.read_bytes())
    print(json.dumps(paced(args.bootstrap, args.topic, args.rate, records)), flush=True)


if __name__ == "__main__":
    main()
