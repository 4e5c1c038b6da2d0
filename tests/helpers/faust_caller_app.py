"""A Faust worker calling a topology through pipeline.client.faust, run by the tests as a child::

    FAUST_BOOTSTRAP=H:P FAUST_APP_ID=A FAUST_TOPOLOGY=T.yaml FAUST_ONE_BY_ONE=T FAUST_PIPELINED=T \
        FAUST_SINK=T FAUST_DATADIR=D python -m tests.helpers.faust_caller_app worker -l warn --without-web

Events are 16 float32 features (raw bytes, key = event id). Two agents call the same
:class:`TopologyCaller`: ``one_by_one`` awaits ``caller.infer`` per event, ``pipelined``
iterates ``caller.results(stream, ...)``. Both write ``{"path", "logits" | "error"}`` as
JSON to the sink under the event's key (an event of the wrong length is dead-lettered by
the topology: ``results`` yields it as an error outcome). Configured for Tansu as benchmarks/faust_echo.py is.
"""

from __future__ import annotations

import os

import faust
import numpy as np

from pipeline.client import RequestDeadLettered
from pipeline.client.faust import TopologyCaller

app = faust.App(
    os.environ["FAUST_APP_ID"],
    broker=f"kafka://{os.environ['FAUST_BOOTSTRAP']}",
    store="memory://",
    datadir=os.environ["FAUST_DATADIR"],
    web_enabled=False,
    producer_acks=-1,
    broker_session_timeout=10.0,
    broker_heartbeat_interval=1.0,
    consumer_auto_offset_reset="earliest",
    topic_replication_factor=1,
    topic_partitions=2,
)
caller = TopologyCaller(app, os.environ["FAUST_TOPOLOGY"], timeout=60)

one_by_one_events = app.topic(os.environ["FAUST_ONE_BY_ONE"], key_serializer="raw", value_serializer="raw")
pipelined_events = app.topic(os.environ["FAUST_PIPELINED"], key_serializer="raw", value_serializer="raw")
sink = app.topic(os.environ["FAUST_SINK"], key_serializer="raw", value_serializer="json")


def features(event: faust.EventT) -> dict[str, np.ndarray]:
    return {"features": np.frombuffer(event.value, np.float32).reshape(1, -1)}


@app.agent(one_by_one_events)
async def one_by_one(stream: faust.StreamT) -> None:
    async for event in stream.events():
        result = await caller.infer(features(event))
        await sink.send(key=event.key, value={"path": "infer", "logits": result.outputs["logits"].tolist()})


@app.agent(pipelined_events)
async def pipelined(stream: faust.StreamT) -> None:
    async for outcome in caller.results(stream, features, max_in_flight=32):
        if isinstance(outcome.error, RequestDeadLettered):
            body = {"path": "results", "error": type(outcome.error).__name__, "class": outcome.error.error_class}
        elif outcome.error is not None:
            body = {"path": "results", "error": type(outcome.error).__name__}
        else:
            body = {"path": "results", "logits": outcome.unwrap().outputs["logits"].tolist()}
        await sink.send(key=outcome.event.key, value=body)


@app.task
async def announce() -> None:
    print(f"READY {caller.client.reply_topic}", flush=True)  # faust logs stdout, one write per line


if __name__ == "__main__":
    app.main()
