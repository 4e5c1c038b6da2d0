"""(e) A faust-streaming echo agent: forward every event unchanged to the output topic.

Run by the stateless benchmark as a child process::

    BENCH_BOOTSTRAP=H:P BENCH_INPUT=T BENCH_OUTPUT=T BENCH_APP_ID=G BENCH_DATADIR=D \
        python -m benchmarks.faust_echo worker -l warn --without-web

Raw (bytes) key and value serializers, so Faust does no codec work either;
headers are passed through. Faust's own defaults otherwise, except ``producer_acks=-1`` (acks=all, like every
producer in this project) and a 10 s session timeout (as the project's consumers). Faust
acknowledges an event when the agent moves to the next one and, before each
periodic commit, flushes its producer, so it too commits only past sent outputs.
"""

from __future__ import annotations

import os

import faust

app = faust.App(
    os.environ.get("BENCH_APP_ID", "bench-faust-echo"),
    broker=f"kafka://{os.environ.get('BENCH_BOOTSTRAP', '127.0.0.1:9092')}",
    store="memory://",
    datadir=os.environ.get("BENCH_DATADIR", "/tmp/bench-faust"),
    web_enabled=False,
    producer_acks=-1,
    # As the project's consumers (pipeline/kafka/clients.py: 10 s; Faust's default is 60 s).
    # Tansu completes a new group's first join after session_timeout / 2: 5 s, not 30 s.
    broker_session_timeout=10.0,
    broker_heartbeat_interval=1.0,
    consumer_auto_offset_reset="earliest",
    topic_replication_factor=1,
    topic_partitions=4,
    key_serializer="raw",
    value_serializer="raw",
)

source = app.topic(
    os.environ.get("BENCH_INPUT", "bench.in"), key_serializer="raw", value_serializer="raw"
)
sink = app.topic(
    os.environ.get("BENCH_OUTPUT", "bench.out"), key_serializer="raw", value_serializer="raw"
)


@app.agent(source)
async def echo(stream: faust.StreamT) -> None:
    async for event in stream.events():
        await sink.send(key=event.key, value=event.value, headers=event.headers)


@app.task
async def announce() -> None:
    print("READY", flush=True)


if __name__ == "__main__":
    app.main()
